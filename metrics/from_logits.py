"""Per-example KL and NLL of an evaluation: exact from logits where the saved probabilities are
``softmax(logits / T)``, from the probabilities elsewhere.

Float32 probabilities cap what can be measured: an option below ~1e-45 is 0, so its NLL was
capped (at -log 1e-15 = 34.5 before) and a KL needed a floor. From ``log_softmax(logits / T)`` in
float64 (:mod:`metrics.logprobs`) both are exact: identical rows give KL exactly 0, an NLL of 50
stays 50. A row uses its logits when its saved probabilities of both models agree with them to
``metrics.logprobs.PROBS_ATOL`` (outputs written by ``runs.outputs.finish_outputs`` always
do); otherwise, e.g. a variant whose option mask differs or outputs without a temperature, the
probabilities are used: KL by :func:`metrics.divergence.kl_divergence` with ``floor=PROB_FLOOR``
and ``normalize=True`` (the floor keeps a dropped option finite; the ``mask_mismatch`` column is
what flags it) and NLL as ``-log p`` without a floor (inf for p = 0).
"""

import numpy as np

from metrics.divergence import PROB_FLOOR, kl_divergence, kl_from_log_probs
from metrics.logprobs import log_probs, matches_probs


def _usable_log_probs(logits, probs, mask, temperature):
    """(logp, rows) where ``rows`` (N,) marks rows whose probs are softmax(logits / T); logp is
    None (no row usable) without a valid temperature."""
    n = logits.shape[0]
    if temperature is None:
        return None, np.zeros(n, dtype=bool)
    t = np.asarray(temperature, dtype=np.float64)
    if t.shape != (n,) or not np.all(np.isfinite(t) & (t > 0)):
        return None, np.zeros(n, dtype=bool)
    finite = np.isfinite(np.where(mask, logits, 0.0)).all(axis=1)
    logp = log_probs(np.where(finite[:, None] & mask, logits, 0.0), mask, t)
    return logp, finite & matches_probs(logp, probs, mask)


def kl_columns(ref_logits, var_logits, ref_probs, var_probs, mask, ref_temperature,
               var_temperature):
    """KL(ref ‖ var), KL(var ‖ ref) and which rows came from logits.

    Parameters
    ----------
    ref_logits, var_logits, ref_probs, var_probs : ndarray of shape (N, K), float
    mask : ndarray of shape (N, K), bool
        The reference's valid options (``var_probs`` already 0 outside it).
    ref_temperature, var_temperature : ndarray of shape (N,) or None
        Each model's own temperature; None = no temperature (probabilities only).

    Returns
    -------
    kl, kl_reverse : ndarray of shape (N,), float64
        >= 0, nats.
    exact : ndarray of shape (N,), bool
        Rows computed from logits.
    """
    logp, ok_ref = _usable_log_probs(ref_logits, ref_probs, mask, ref_temperature)
    logq, ok_var = _usable_log_probs(var_logits, var_probs, mask, var_temperature)
    # floored and normalised: a variant whose mask differs has mass zeroed outside the
    # reference's (its rows then sum to less than 1); mask_mismatch flags those rows
    kl = kl_divergence(ref_probs, var_probs, mask, floor=PROB_FLOOR, normalize=True)
    kl_rev = kl_divergence(var_probs, ref_probs, mask, floor=PROB_FLOOR, normalize=True)
    exact = ok_ref & ok_var
    if exact.any():
        kl = np.where(exact, kl_from_log_probs(logp, logq, mask), kl)
        kl_rev = np.where(exact, kl_from_log_probs(logq, logp, mask), kl_rev)
    return kl, kl_rev, exact


def nll_column(logits, probs, targets, mask, temperature):
    """Per-example NLL (nats) of ``targets`` (N,) int >= 0: ``-log_softmax(logits / T)`` where
    ``probs`` agree with the logits, ``-log p`` (uncapped, inf for 0) elsewhere; shape (N,)."""
    rows = np.arange(len(targets))
    with np.errstate(divide="ignore"):
        nll = -np.log(np.asarray(probs, dtype=np.float64)[rows, targets])
    logp, ok = _usable_log_probs(logits, probs, mask, temperature)
    if ok.any():
        nll = np.where(ok, 0.0 - logp[rows, targets], nll)  # 0.0 - 0.0 is +0.0, not -0.0
    return nll

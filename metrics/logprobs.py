"""Option log-probabilities from logits in float64, and where saved probabilities agree with them.

Saved probabilities are float32: an option below ~1e-45 is exactly 0 there and its log is -inf,
while ``log_softmax(logits / T)`` in float64 keeps it finite (e.g. -100 nats). KL and NLL are
therefore computed from the logits wherever the saved probabilities are the softmax of the saved
logits at the saved temperature (``runs.outputs.finish_outputs`` writes them so), and from
the probabilities only where they are not (hand-made outputs, a mask that differs).
"""

import numpy as np
from scipy.special import log_softmax

from metrics._checks import check_mask

#: Largest |softmax(logits / T) - probs| on valid options at which saved probabilities count as
#: derived from the saved logits (float32 rounding of a probability is below 6e-8).
PROBS_ATOL = 1e-6


def log_probs(logits, option_mask, temperature=1.0):
    """``log_softmax(logits / T)`` over each row's valid options, float64.

    Parameters
    ----------
    logits : array-like of shape (N, K), float
        Raw logits; entries outside ``option_mask`` are ignored.
    option_mask : array-like of shape (N, K), bool
        True for valid options; every row needs at least one.
    temperature : float or array-like of shape (N,), default=1.0
        Temperature per example (> 0).

    Returns
    -------
    logp : ndarray of shape (N, K), float64
        Natural-log probabilities; ``-inf`` outside the mask. Finite on valid options whenever
        the logits are finite (no underflow to log 0).

    Raises
    ------
    ValueError
        If shapes disagree, a row has no valid option, a temperature is not > 0, or a valid
        logit is not finite.

    References
    ----------
    ``scipy.special.log_softmax`` (the log-sum-exp is taken after subtracting the row maximum).
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2:
        raise ValueError(f"logits must be 2-D of shape (N, K), got shape {logits.shape}.")
    mask = check_mask(option_mask, logits.shape)
    t = np.broadcast_to(np.asarray(temperature, dtype=np.float64), (logits.shape[0],))
    if not np.all(t > 0):
        raise ValueError("temperature must be > 0 for every example.")
    if not np.isfinite(logits[mask]).all():
        raise ValueError("logits have NaN or inf on valid options.")
    z = np.where(mask, logits / t[:, None], -np.inf)
    return log_softmax(z, axis=1)


def matches_probs(logp, probs, option_mask, *, atol=PROBS_ATOL):
    """(N,) bool: rows whose ``probs`` equal ``exp(logp)`` on valid options within ``atol``."""
    probs = np.asarray(probs, dtype=np.float64)
    diff = np.where(option_mask, np.abs(np.exp(logp) - probs), 0.0)
    return ~(diff > atol).any(axis=1)

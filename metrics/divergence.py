"""KL divergence between the reference's and a variant's option probabilities.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``kl_divergence`` is lower-is-better (0 = identical distributions).
"""

import numpy as np
from scipy.special import rel_entr

from metrics._checks import check_2d_pair, check_mask

#: Floor a caller may name (``floor=PROB_FLOOR``) for the variant's probabilities: a variant
#: that rounds a reference-probable option to exactly 0 then gives a large finite KL, not inf.
PROB_FLOOR = 1e-12
#: How far a row's sum over its valid options may be from 1 and still be a distribution:
#: float32 softmax outputs sum to 1 only to ~1e-7 (K times the float32 spacing).
SUM_ATOL = 1e-5


def _check_distributions(name, a, mask, atol, normalize):
    """Refuse NaN, negative entries and (unless ``normalize``) rows whose valid entries do not
    sum to 1 within ``atol``; one line naming ``name``, the row and the fix (ValueError)."""
    fix = ("pass probabilities (e.g. softmax outputs), or normalize=True to divide each row by "
           "its sum")
    for what, bad in (("NaN", np.isnan(a) & mask), ("a negative value", (a < 0) & mask)):
        if bad.any():
            row = int(bad.any(axis=1).nonzero()[0][0])
            raise ValueError(f"{name} row {row} has {what} on its valid options; pass "
                             "probabilities (e.g. softmax outputs)")
    sums = np.where(mask, a, 0.0).sum(axis=1)
    if normalize:
        bad = ~(np.isfinite(sums) & (sums > 0))
        if bad.any():
            row = int(bad.nonzero()[0][0])
            raise ValueError(f"{name} row {row} has no mass on its valid options (sum "
                             f"{sums[row]:.6g}); it cannot be normalised to a distribution")
        return sums
    bad = ~(np.abs(sums - 1.0) <= atol)
    if bad.any():
        row = int(bad.nonzero()[0][0])
        raise ValueError(f"{name} row {row} sums to {sums[row]:.6g} over its valid options, not "
                         f"1 (within {atol:g}): it is not a distribution; {fix}")
    return sums


def kl_divergence(p_ref, p_var, option_mask, *, floor=None, normalize=False, atol=SUM_ATOL):
    """KL(reference ‖ variant) over each example's valid options, natural log (nats).

    Both rows must be distributions over the valid options: entries >= 0, summing to 1 within
    ``atol``; such a row is divided by its sum (this removes float32 round-off only, never more
    than ``atol``). Anything else is refused, unless ``normalize`` is named.

    Parameters
    ----------
    p_ref, p_var : array-like of shape (N, K), float
        Probabilities (``DecisionOutputs.probs``); entries outside ``option_mask`` are ignored.
    option_mask : array-like of shape (N, K), bool
        True for valid options; every row needs at least one.
    floor : float in (0, 1), optional
        None (default): as the definition says, a variant zero where the reference has mass
        gives ``inf``. A number (e.g. :data:`PROB_FLOOR`): on valid options ``p_var`` is raised
        to at least ``min(p_ref, floor)`` before normalising, so that option gives a large
        finite KL, while equal rows stay equal (KL exactly 0).
    normalize : bool, default=False
        True: any row with positive mass is divided by its sum (e.g. a variant's probabilities
        with an option outside the reference's mask zeroed), whatever the sum.
    atol : float, default=SUM_ATOL (1e-5)
        How far a row's sum may be from 1 without ``normalize``.

    Returns
    -------
    kl : ndarray of shape (N,), float64
        ``sum_k p_k log(p_k / q_k)`` with ``0 log 0 = 0`` and ``p log(p / 0) = inf`` for
        ``p > 0``; >= 0 (round-off negatives set to 0), lower is better; exactly 0 when the two
        rows are equal.

    Raises
    ------
    ValueError
        Shapes differ; a value is NaN or negative on a valid option; a row does not sum to 1
        within ``atol`` (without ``normalize``) or has no mass (with it); ``floor`` is not in
        (0, 1). The message names the argument, the row and the fix.

    See Also
    --------
    scipy.stats.entropy : ``entropy(p, q)`` on one row's valid options equals this (it
        normalises both rows).
    kl_divergence_from_logits : exact from logits, for outputs that have them.

    References
    ----------
    S. Kullback and R. A. Leibler, "On Information and Sufficiency", Ann. Math. Statist. 22
    (1951); element-wise terms as ``scipy.special.rel_entr``.
    """
    p, q = check_2d_pair(p_ref, p_var, names=("p_ref", "p_var"))
    mask = check_mask(option_mask, p.shape)
    if floor is not None and not 0.0 < floor < 1.0:
        raise ValueError(f"floor must be in (0, 1) or None, got {floor}.")
    p_sum = _check_distributions("p_ref", p, mask, atol, normalize)
    _check_distributions("p_var", q, mask, atol, normalize)
    p = np.where(mask, p, 0.0)
    q = np.where(mask, q, 0.0)
    if floor is not None:
        q = np.where(mask, np.maximum(q, np.minimum(p, floor)), 0.0)
    p = p / p_sum[:, None]
    q = q / q.sum(axis=1, keepdims=True)
    terms = np.where(mask, rel_entr(p, np.where(mask, q, 1.0)), 0.0)
    return np.maximum(terms.sum(axis=1), 0.0)


def kl_divergence_from_logits(ref_logits, var_logits, option_mask, *, ref_temperature=1.0,
                              var_temperature=1.0):
    """KL(reference ‖ variant) from logits, exactly: no floor, no float32 underflow, nats.

    With ``log p = log_softmax(ref_logits / T_ref)`` and ``log q = log_softmax(var_logits /
    T_var)`` over each row's valid options, in float64, ``KL = Σ_k p_k (log p_k - log q_k)``.
    An option the variant's float32 probabilities round to 0 keeps its finite log: logits
    [0, -10] vs [0, -200] give 8.58e-3 (≈ 190 e^-10), where the floored probabilities give
    7.6e-4.

    Parameters
    ----------
    ref_logits, var_logits : array-like of shape (N, K), float
        Raw logits; entries outside ``option_mask`` are ignored.
    option_mask : array-like of shape (N, K), bool
        Valid options (the reference's); every row needs at least one.
    ref_temperature, var_temperature : float or array-like of shape (N,), default=1.0
        Each side's own temperature (``DecisionOutputs.temperature``).

    Returns
    -------
    kl : ndarray of shape (N,), float64
        >= 0 (round-off negatives set to 0), lower is better; exactly 0 for identical rows.

    Raises
    ------
    ValueError
        If shapes disagree, a row has no valid option, a temperature is not > 0 or a valid logit
        is not finite.

    See Also
    --------
    kl_divergence : the same from probabilities, for outputs without logits.
    scipy.stats.entropy : ``entropy(p, q)`` equals this on rows where nothing underflows.

    References
    ----------
    S. Kullback and R. A. Leibler, Ann. Math. Statist. 22 (1951); ``scipy.special.log_softmax``.
    """
    from metrics.logprobs import log_probs

    ref_logits, var_logits = check_2d_pair(ref_logits, var_logits,
                                           names=("ref_logits", "var_logits"))
    logp = log_probs(ref_logits, option_mask, ref_temperature)
    logq = log_probs(var_logits, option_mask, var_temperature)
    return kl_from_log_probs(logp, logq, option_mask)


def kl_from_log_probs(logp, logq, option_mask):
    """``Σ_k exp(logp_k) (logp_k - logq_k)`` over valid options, clipped at 0, shape (N,).

    ``logp``/``logq`` as :func:`metrics.logprobs.log_probs` returns them (finite on valid
    options); a reference option with ``exp(logp) = 0`` contributes 0.
    """
    mask = np.asarray(option_mask, dtype=bool)
    diff = np.where(mask, logp - np.where(mask, logq, 0.0), 0.0)
    terms = np.where(mask, np.exp(np.where(mask, logp, -np.inf)) * diff, 0.0)
    return np.maximum(terms.sum(axis=1), 0.0)

"""KL divergence between the reference's and a variant's option probabilities.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``kl_divergence`` is lower-is-better (0 = identical distributions).
"""

import numpy as np
from scipy.special import rel_entr

from metrics._checks import check_2d_pair, check_mask

#: Floor applied to the variant's probabilities before the log, so a variant that rounds a
#: reference-probable option to exactly 0 gives a large finite KL instead of inf.
PROB_FLOOR = 1e-12


def kl_divergence(p_ref, p_var, option_mask, *, floor=PROB_FLOOR):
    """KL(reference ‖ variant) over each example's valid options, natural log (nats).

    Parameters
    ----------
    p_ref, p_var : array-like of shape (N, K), float
        Probabilities (``DecisionOutputs.probs``); entries outside ``option_mask`` are ignored.
    option_mask : array-like of shape (N, K), bool
        True for valid options; every row needs at least one.
    floor : float, default=1e-12
        On valid options, ``p_var`` is raised to at least ``min(p_ref, floor)``: a variant zero
        where the reference has mass (which would make the KL infinite) becomes ``floor``, while
        equal rows stay equal (KL exactly 0). Both rows are then
        renormalised to sum to 1 over valid options (float32 outputs sum to 1 only to ~1e-7),
        which makes the result >= 0 up to round-off; remaining round-off negatives are set to 0.

    Returns
    -------
    kl : ndarray of shape (N,), float64
        ``sum_k p_k log(p_k / q_k)`` with ``0 log 0 = 0``; >= 0, lower is better; exactly 0 when
        the two rows are equal.

    Raises
    ------
    ValueError
        If shapes differ, values are NaN, negative or above 1 (+1e-6), a reference row has no mass
        on its valid options, or ``floor`` is not in (0, 1).

    See Also
    --------
    scipy.stats.entropy : ``entropy(p, q)`` on one row's valid options equals this after the same
        clipping (it renormalises too).

    References
    ----------
    S. Kullback and R. A. Leibler, "On Information and Sufficiency", Ann. Math. Statist. 22
    (1951); element-wise terms as ``scipy.special.rel_entr``.
    """
    p, q = check_2d_pair(p_ref, p_var, names=("p_ref", "p_var"))
    mask = check_mask(option_mask, p.shape)
    if not 0.0 < floor < 1.0:
        raise ValueError(f"floor must be in (0, 1), got {floor}.")
    for name, a in (("p_ref", p), ("p_var", q)):
        valid = a[mask]
        if np.isnan(valid).any():
            raise ValueError(f"{name} has NaN on valid options.")
        if (valid < 0).any() or (valid > 1 + 1e-6).any():
            raise ValueError(f"{name} has values outside [0, 1] on valid options; pass probabilities.")
    p = np.where(mask, p, 0.0)
    q = np.where(mask, np.maximum(q, np.minimum(p, floor)), 0.0)
    p_sum = p.sum(axis=1, keepdims=True)
    if (p_sum <= 0).any():
        raise ValueError("p_ref has a row with zero mass on its valid options.")
    p = p / p_sum
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
    kl_divergence : the same from probabilities (floored), for outputs without logits.
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

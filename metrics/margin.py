"""Logit drift, top-two margins and the margin (2ε) certificate.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``max_abs_logit_diff`` is lower-is-better, a larger ``top2_margin`` is a safer example.

The certificate: if every valid logit of an example moves by at most ε, and the reference's top-two
gap exceeds 2ε, the top-1 option cannot change (the winner loses at most ε, the runner-up gains at
most ε). It says nothing about probabilities, scores or actions, and since probabilities are
softmax(logits / T), a small temperature amplifies the same raw ε.
"""

import numpy as np

from metrics._checks import check_2d_pair, check_mask


def max_abs_logit_diff(ref_logits, var_logits, option_mask):
    """Largest absolute change of a valid raw logit, per example.

    Parameters
    ----------
    ref_logits, var_logits : array-like of shape (N, K), float
        Raw logits before temperature. Entries outside ``option_mask`` are ignored.
    option_mask : array-like of shape (N, K), bool
        True for valid options; every row needs at least one.

    Returns
    -------
    diff : ndarray of shape (N,), float64
        ``max_k |var_logits[i, k] - ref_logits[i, k]|`` over valid k; >= 0, lower is better.

    Raises
    ------
    ValueError
        If shapes differ, the mask is not bool, or a row has no valid option.

    References
    ----------
    The margin rule of ``docs/method.md``; the same bound as
    the logit-margin certificates of Tsuzuku et al., "Lipschitz-Margin Training", NeurIPS 2018.
    """
    ref, var = check_2d_pair(ref_logits, var_logits, names=("ref_logits", "var_logits"))
    mask = check_mask(option_mask, ref.shape)
    return np.max(np.where(mask, np.abs(var - ref), 0.0), axis=1)


def top2_margin(logits, option_mask):
    """Gap between the largest and second-largest valid raw logit, per example.

    Parameters
    ----------
    logits : array-like of shape (N, K), float
        Raw logits before temperature (a margin in probability or T-scaled units is not the one
        the certificate needs).
    option_mask : array-like of shape (N, K), bool
        True for valid options; every row needs at least one.

    Returns
    -------
    margin : ndarray of shape (N,), float64
        >= 0; 0 for an exact tie. ``+inf`` for an example with a single valid option, whose
        prediction cannot change (such examples are always certified).

    Raises
    ------
    ValueError
        If ``logits`` is not 2-D, or the mask's shape/dtype is wrong or a row is empty.

    Examples
    --------
    >>> top2_margin([[3.0, 1.0, 2.5], [1.0, 0.0, 0.0]], [[True, True, True], [True, False, False]])
    array([0.5, inf])
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2:
        raise ValueError(f"logits must be 2-D of shape (N, K), got shape {logits.shape}.")
    mask = check_mask(option_mask, logits.shape)
    if logits.shape[1] < 2:
        return np.full(logits.shape[0], np.inf)
    z = np.where(mask, logits, -np.inf)
    top = -np.sort(-z, axis=1)[:, :2]
    margin = top[:, 0] - top[:, 1]  # inf - (-inf) = inf where only one option is valid
    return np.where(mask.sum(axis=1) < 2, np.inf, margin)


def epsilon_max(max_abs_logit_diff_calibration):
    """The certificate's ε: the largest per-example logit drift seen on the calibration split.

    Parameters
    ----------
    max_abs_logit_diff_calibration : array-like of shape (M,), float
        :func:`max_abs_logit_diff` of the variant on calibration examples (disjoint from the
        examples it will certify).

    Returns
    -------
    epsilon : float
        ``max`` of the input, >= 0. An empirical bound: it holds on unseen examples only as far as
        the calibration split is representative.

    Raises
    ------
    ValueError
        If the input is empty, not 1-D, contains NaN/inf, or a negative value.
    """
    d = np.asarray(max_abs_logit_diff_calibration, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(
            "max_abs_logit_diff_calibration must be a non-empty 1-D array, got shape "
            f"{d.shape}; run the variant on at least one calibration example."
        )
    if not np.all(np.isfinite(d)):
        raise ValueError("max_abs_logit_diff_calibration has NaN or inf values; check the logits.")
    if np.any(d < 0):
        raise ValueError("max_abs_logit_diff_calibration has negative values; pass |Δlogit|.")
    return float(d.max())


def certified(ref_margin, epsilon):
    """Examples whose top-1 option provably survives any logit drift of at most ``epsilon``.

    Parameters
    ----------
    ref_margin : array-like of shape (N,), float
        :func:`top2_margin` of the reference logits (``+inf`` for single-option examples).
    epsilon : float
        Bound on the per-logit drift, >= 0 (e.g. from :func:`epsilon_max`); ``inf`` (a
        calibration row answered with NaN or inf, :mod:`metrics.finite`) certifies nothing.

    Returns
    -------
    cert : ndarray of shape (N,), bool
        ``ref_margin > 2 * epsilon`` (strict, so an exact tie is never certified).

    Raises
    ------
    ValueError
        If ``epsilon`` is negative or NaN, or ``ref_margin`` is not 1-D or has NaN.
    """
    margin = np.asarray(ref_margin, dtype=np.float64)
    if margin.ndim != 1:
        raise ValueError(f"ref_margin must be 1-D of shape (N,), got shape {margin.shape}.")
    if np.isnan(margin).any():
        raise ValueError("ref_margin has NaN values; compute it with top2_margin.")
    epsilon = float(epsilon)
    if not epsilon >= 0:  # NaN or negative; +inf (an unbounded drift) certifies nothing
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon}.")
    return margin > 2.0 * epsilon if np.isfinite(epsilon) else np.zeros(margin.shape, bool)

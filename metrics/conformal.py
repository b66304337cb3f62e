"""Split-conformal bounds on the per-example logit drift (the certificate's ε, second way).

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``conformal_quantile`` is a bound (smaller is a tighter certificate), ``coverage`` a rate that
should reach the promised ``1 - alpha``.
"""

import math

import numpy as np

from metrics._checks import check_1d


def _check_scores(scores, name):
    s = check_1d(scores, name=name, dtype=np.float64)
    if s.size == 0:
        raise ValueError(f"{name} must be non-empty; run the variant on at least one calibration example.")
    if np.isnan(s).any() or (s == -np.inf).any():
        raise ValueError(f"{name} has NaN or -inf values; check the logits.")
    # +inf is an unbounded drift (a row the variant answered with NaN or inf, metrics.finite):
    # it sorts last, as the largest score
    return s


def conformal_rank(n, alpha):
    """The rank ``ceil((n + 1)(1 - alpha))`` of the split-conformal quantile (1-based).

    Returns
    -------
    rank : int
        May exceed ``n``, in which case the quantile is ``+inf`` (too few calibration examples for
        this ``alpha``: at least ``ceil(1/alpha) - 1`` are needed).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}; e.g. alpha = 0.05 for 95% coverage.")
    # round first so that (n + 1) * (1 - alpha) = 760.0000000001 is not lifted to 761
    return int(math.ceil(round((n + 1) * (1.0 - alpha), 9)))


def conformal_quantile(scores, *, alpha=0.05):
    """Split-conformal upper bound for a new example's score.

    Parameters
    ----------
    scores : array-like of shape (n,), float
        Non-conformity scores of n calibration examples, here ``max_k |Δlogit_k|``
        (:func:`metrics.margin.max_abs_logit_diff`), raw-logit units; ``+inf`` for a row the
        variant answered with NaN or inf (:mod:`metrics.finite`: an unbounded drift).
    alpha : float, default=0.05
        Miscoverage level in (0, 1).

    Returns
    -------
    epsilon : float
        The ``ceil((n + 1)(1 - alpha))``-th smallest score; ``+inf`` when that rank exceeds n. If
        the calibration and new examples are exchangeable, a new example's score is <= epsilon
        with probability >= 1 - alpha (and < 1 - alpha + 1/(n + 1) without ties).

    Raises
    ------
    ValueError
        If ``scores`` is empty, not 1-D, has NaN or -inf, or ``alpha`` is outside (0, 1).

    References
    ----------
    V. Vovk, A. Gammerman and G. Shafer, "Algorithmic Learning in a Random World", 2005;
    J. Lei et al., "Distribution-Free Predictive Inference for Regression", JASA 2018, Sec. 2.2;
    A. N. Angelopoulos and S. Bates, "A Gentle Introduction to Conformal Prediction", 2021, Sec. 1.

    Examples
    --------
    >>> conformal_quantile(np.arange(1.0, 20.0), alpha=0.1)  # rank ceil(20 * 0.9) = 18
    18.0
    """
    s = _check_scores(scores, "scores")
    rank = conformal_rank(s.size, alpha)
    if rank > s.size:
        return float("inf")
    return float(np.sort(s)[rank - 1])


def coverage(scores, epsilon):
    """Share of examples whose score is at most ``epsilon`` (the empirical coverage).

    Parameters
    ----------
    scores : array-like of shape (N,), float
        E.g. ``max_abs_logit_diff`` on the eval split.
    epsilon : float
        The bound (may be ``inf``).

    Returns
    -------
    coverage : float
        In [0, 1]; compare with the promised ``1 - alpha``. NaN when N = 0.
    """
    s = check_1d(scores, name="scores", dtype=np.float64)
    if s.size == 0:
        return float("nan")
    return float(np.mean(s <= float(epsilon)))


def epsilon_by_bucket(scores, n_options, *, alpha=0.05):
    """ε both ways (max and split-conformal) per option-count bucket and overall.

    Parameters
    ----------
    scores : array-like of shape (n,), float
        Calibration ``max_abs_logit_diff``.
    n_options : array-like of shape (n,), int
        Number of valid options per calibration example (the temperature bucket).
    alpha : float, default=0.05

    Returns
    -------
    table : dict
        ``{"all": {...}, K: {...}}`` with, for each, ``n``, ``epsilon_max`` and
        ``epsilon_conformal`` (floats, conformal may be inf).
    """
    s = _check_scores(scores, "scores")
    k = check_1d(n_options, name="n_options", n=s.size).astype(np.int64)
    out = {"all": {"n": int(s.size), "epsilon_max": float(s.max()),
                   "epsilon_conformal": conformal_quantile(s, alpha=alpha)}}
    for kk in np.unique(k):
        sk = s[k == kk]
        out[int(kk)] = {"n": int(sk.size), "epsilon_max": float(sk.max()),
                        "epsilon_conformal": conformal_quantile(sk, alpha=alpha)}
    return out

"""Seeded percentile-bootstrap confidence intervals over examples.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; an interval
inherits the direction of its statistic.
"""

from functools import lru_cache

import numpy as np


def bootstrap_indices(n, *, n_boot=1000, seed=0):
    """Row indices of ``n_boot`` resamples with replacement, shape (n_boot, n), int64, read-only.

    The same ``(n, n_boot, seed)`` always gives the same indices (``numpy.random.default_rng``);
    the last few are kept (a judge draws the same resamples for every clause and figure).
    """
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot}.")
    if isinstance(seed, (int, np.integer)):
        return _indices(max(int(n), 0), int(n_boot), int(seed))
    return _indices.__wrapped__(max(int(n), 0), int(n_boot), seed)


@lru_cache(maxsize=4)
def _indices(n, n_boot, seed):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, max(n, 1), size=(n_boot, n))
    idx.flags.writeable = False
    return idx


def bootstrap_ci(statistic, n, *, n_boot=1000, confidence=0.95, seed=0, vectorized=False):
    """Percentile-bootstrap interval of a statistic of n i.i.d. examples.

    Parameters
    ----------
    statistic : callable
        ``statistic(idx) -> float`` for ``idx`` of shape (n,) (rows of one resample, with
        repeats); with ``vectorized=True``, ``statistic(idx) -> (n_boot,)`` for idx of shape
        (n_boot, n).
    n : int
        Number of examples.
    n_boot : int, default=1000
    confidence : float, default=0.95
        In (0, 1).
    seed : int, default=0

    Returns
    -------
    (low, high) : tuple of float
        The ``(1 - confidence)/2`` and ``(1 + confidence)/2`` percentiles of the resampled
        statistic (NaN resamples dropped); ``(nan, nan)`` when n = 0 or every resample is NaN.

    Raises
    ------
    ValueError
        If ``n_boot`` < 1 or ``confidence`` is outside (0, 1).

    References
    ----------
    B. Efron and R. J. Tibshirani, "An Introduction to the Bootstrap", 1993, Ch. 13.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    idx = bootstrap_indices(n, n_boot=n_boot, seed=seed)
    if n == 0:
        return float("nan"), float("nan")
    if vectorized:
        stats = np.asarray(statistic(idx), dtype=np.float64)
    else:
        stats = np.array([statistic(i) for i in idx], dtype=np.float64)
    stats = stats[~np.isnan(stats)]
    if stats.size == 0:
        return float("nan"), float("nan")
    a = (1.0 - confidence) / 2.0
    with np.errstate(invalid="ignore"):
        low, high = np.percentile(stats, [100 * a, 100 * (1 - a)])
    return float(low), float(high)

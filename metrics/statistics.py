"""Statistics of a per-example column over a stratum (``rate``, ``count``, ``mean``, ``max``,
percentiles, ...), for one set of rows and for many bootstrap resamples at once.

A bool column (0/1) has ``BOOL_STATISTICS``, a float column ``FLOAT_STATISTICS``, a set-level
metric only ``value`` (``SET_STATISTICS``); :mod:`metrics.registry` says which metric is which.
Percentiles interpolate linearly, as ``numpy.percentile``.
"""

import numpy as np

BOOL_STATISTICS = ("rate", "count")
FLOAT_STATISTICS = ("mean", "max", "min", "p50", "p95", "p99", "p90", "p999", "rms")
SET_STATISTICS = ("value",)
STATISTICS = BOOL_STATISTICS + FLOAT_STATISTICS + SET_STATISTICS
#: Percentile statistics and their q (percent).
PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p90": 90.0, "p999": 99.9}


def percentile(values, q):
    """``numpy.percentile(values, q)`` (linear), but inf-safe: two equal infinite neighbours give
    inf, not ``inf - inf = NaN`` (``ref_margin`` is +inf for single-option examples).

    ``values`` is a non-empty 1-D float array; returns a float.
    """
    v = np.sort(values)
    pos = q / 100.0 * (v.size - 1)
    i = int(np.floor(pos))
    frac = pos - i
    lo, hi = v[i], v[min(i + 1, v.size - 1)]
    if frac == 0.0 or lo == hi:
        return float(lo)
    return float(lo + frac * (hi - lo))


def column_statistic(values, statistic):
    """``statistic`` (one of ``BOOL_STATISTICS + FLOAT_STATISTICS``) of a non-empty 1-D float
    array with no NaN (bool columns as 0/1); a float."""
    if statistic in ("rate", "mean"):
        return float(values.mean())
    if statistic == "count":
        return float(values.sum())
    if statistic == "max":
        return float(values.max())
    if statistic == "min":
        return float(values.min())
    if statistic == "rms":
        return float(np.sqrt(np.mean(values ** 2)))
    return percentile(values, PERCENTILES[statistic])


def column_statistic_rows(values, statistic):
    """``statistic`` along axis 1 of a (B, n) float array (bootstrap resamples), shape (B,).

    Matches :func:`column_statistic` row by row except for percentiles between infinities (the
    caller resamples with :func:`column_statistic` when a value is infinite).
    """
    if statistic in ("rate", "mean"):
        return values.mean(axis=1)
    if statistic == "count":
        return values.sum(axis=1)
    if statistic == "max":
        return values.max(axis=1)
    if statistic == "min":
        return values.min(axis=1)
    if statistic == "rms":
        return np.sqrt(np.mean(values ** 2, axis=1))
    with np.errstate(invalid="ignore"):
        return np.percentile(values, PERCENTILES[statistic], axis=1)

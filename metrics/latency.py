"""Latency summaries and paired speed-ups from alternated timing rounds.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``*_ms`` values are lower-is-better, ``speedup_*`` higher-is-better (> 1 = variant faster).
"""

import numpy as np

_PERCENTILE_METHOD = "linear"


def _check_times(times_ms, name):
    t = np.asarray(times_ms, dtype=np.float64)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of milliseconds, got shape {t.shape}.")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(f"{name} must be finite and >= 0 (milliseconds); drop failed runs first.")
    return t


def latency_summary(times_ms):
    """Summary statistics of repeated timings.

    Parameters
    ----------
    times_ms : array-like of shape (n,), float
        Wall-clock times in milliseconds (warm-up runs already removed).

    Returns
    -------
    summary : dict
        ``p50_ms``, ``p95_ms`` (``numpy.percentile``, linear interpolation), ``mean_ms``,
        ``sem_ms`` (standard error of the mean, ddof=1; NaN when n = 1), ``min_ms``, ``max_ms``
        (floats) and ``n`` (int).

    Raises
    ------
    ValueError
        If ``times_ms`` is empty, not 1-D, or holds NaN/inf/negative values.

    Examples
    --------
    >>> latency_summary([1.0, 2.0, 3.0, 4.0])["p50_ms"]
    2.5
    """
    t = _check_times(times_ms, "times_ms")
    p50, p95 = np.percentile(t, [50, 95], method=_PERCENTILE_METHOD)
    sem = float(t.std(ddof=1) / np.sqrt(t.size)) if t.size > 1 else float("nan")
    return {
        "p50_ms": float(p50),
        "p95_ms": float(p95),
        "mean_ms": float(t.mean()),
        "sem_ms": sem,
        "min_ms": float(t.min()),
        "max_ms": float(t.max()),
        "n": int(t.size),
    }


def paired_speedup(ref_ms, var_ms, *, n_boot=2000, confidence=0.95, seed=0):
    """Median speed-up of a variant over the reference from strictly alternated rounds.

    Round i timed the reference (``ref_ms[i]``) and the variant (``var_ms[i]``) back to back, so
    the per-round ratio ``ref_ms[i] / var_ms[i]`` cancels drift shared by the pair. Never divide
    two separately-measured medians instead.

    Parameters
    ----------
    ref_ms, var_ms : array-like of shape (n,), float
        Per-round times in milliseconds, > 0, paired by index.
    n_boot : int, default=2000
        Bootstrap resamples of the rounds.
    confidence : float, default=0.95
        Level of the percentile-bootstrap interval, in (0, 1).
    seed : int, default=0
        Seed of ``numpy.random.default_rng`` for the bootstrap (the result is reproducible).

    Returns
    -------
    speedup : dict
        ``speedup_median`` (median per-round ratio; > 1 = variant faster), ``speedup_ci_low``,
        ``speedup_ci_high`` (percentile-bootstrap interval of that median), ``ratio_min``,
        ``ratio_max``, ``confidence``, ``n_rounds`` and ``variant_wins`` (rounds with ratio > 1).

    Raises
    ------
    ValueError
        If the inputs differ in length, are empty, or hold non-finite or non-positive times, or
        ``n_boot`` < 1 or ``confidence`` is outside (0, 1).

    References
    ----------
    B. Efron and R. J. Tibshirani, "An Introduction to the Bootstrap", 1993, Ch. 13
    (percentile interval).
    """
    ref = _check_times(ref_ms, "ref_ms")
    var = _check_times(var_ms, "var_ms")
    if ref.shape != var.shape:
        raise ValueError(
            f"ref_ms ({ref.size}) and var_ms ({var.size}) must have one time per alternated round each."
        )
    if np.any(ref <= 0) or np.any(var <= 0):
        raise ValueError("ref_ms and var_ms must be > 0 to form ratios.")
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    ratio = ref / var
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, ratio.size, size=(int(n_boot), ratio.size))
    boot = np.median(ratio[idx], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(boot, [100 * alpha, 100 * (1 - alpha)], method=_PERCENTILE_METHOD)
    return {
        "speedup_median": float(np.median(ratio)),
        "speedup_ci_low": float(low),
        "speedup_ci_high": float(high),
        "ratio_min": float(ratio.min()),
        "ratio_max": float(ratio.max()),
        "confidence": float(confidence),
        "n_rounds": int(ratio.size),
        "variant_wins": int(np.sum(ratio > 1.0)),
    }


def relative_trend(values):
    """Least-squares slope of ``values`` against their round index, relative to their median.

    A harness that pollutes itself (a table that grows every round, memory that is never
    freed) shows up as a positive trend: each round costs a bit more than the one before.

    Parameters
    ----------
    values : array-like of shape (n,), float
        One value per round in round order (milliseconds, bytes, ...), finite and >= 0.

    Returns
    -------
    float
        Slope per round divided by the median (e.g. 0.01 = +1% of the median per round);
        0.0 when n < 3 or the median is 0.

    Raises
    ------
    ValueError
        If ``values`` is empty, not 1-D, or holds NaN/inf/negative values.

    Examples
    --------
    >>> relative_trend([10.0, 10.0, 10.0, 10.0])
    0.0
    >>> round(relative_trend([10.0, 11.0, 12.0]), 3)
    0.091
    """
    v = _check_times(values, "values")
    med = float(np.median(v))
    if v.size < 3 or med == 0.0:
        return 0.0
    slope = float(np.polyfit(np.arange(v.size, dtype=np.float64), v, 1)[0])
    return slope / med

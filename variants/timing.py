"""Warm latency of reference and variant, timed in strict alternation (A B A B ...).

Method (../shared/seeds/DIGEST.md, second document): warm up both, then alternate one
reference call and one variant call per round, each synchronised with ``mx.eval`` inside the
timed region, so drift in machine load hits both alike. The speed-up is the median of the
per-round ratios (:func:`metrics.latency.paired_speedup`), never a ratio of two medians.
"""

import time

import mlx.core as mx

from metrics.latency import latency_summary, paired_speedup

TIMED_REGION = "forward: prepared token ids -> option logits (tokenisation excluded)"


def _timed(fn, peaks=None):
    if peaks is not None:
        mx.reset_peak_memory()
    t0 = time.perf_counter()
    mx.eval(fn())
    ms = (time.perf_counter() - t0) * 1e3
    if peaks is not None:
        peaks.append(int(mx.get_peak_memory()))
    return ms


def time_alternating(ref_fn, var_fn, *, warmup=2, rounds=20, min_rounds=3, budget_s=30.0):
    """Time ``ref_fn`` and ``var_fn`` (each returns an mx.array) in strict alternation.

    Parameters
    ----------
    ref_fn, var_fn : callable () -> mx.array
    warmup : int, default=2
        Untimed calls of each before timing.
    rounds : int, default=20
        Timed rounds wanted (one reference + one variant call each).
    min_rounds : int, default=3
        Rounds run even when ``budget_s`` is exhausted.
    budget_s : float, default=30.0
        Wall-clock budget (seconds) for the timed rounds; stops early after ``min_rounds``.

    Returns
    -------
    dict
        ``ref_ms``, ``var_ms`` (lists, one per round), their :func:`latency_summary`, the
        :func:`paired_speedup` of the pair, ``rounds`` actually run, ``stopped_by``, and the
        peak MLX memory of each (``mx.get_peak_memory`` reset before every timed call; bytes).
    """
    if rounds < 1 or min_rounds < 1 or warmup < 0:
        raise ValueError("rounds and min_rounds must be >= 1 and warmup >= 0")
    for _ in range(warmup):
        _timed(ref_fn)
        _timed(var_fn)
    ref_ms, var_ms, ref_peak, var_peak = [], [], [], []
    start = time.perf_counter()
    stopped_by = "rounds"
    for i in range(rounds):
        ref_ms.append(_timed(ref_fn, ref_peak))
        var_ms.append(_timed(var_fn, var_peak))
        if i + 1 >= min_rounds and time.perf_counter() - start > budget_s and i + 1 < rounds:
            stopped_by = "budget"
            break
    return {
        "rounds": len(ref_ms),
        "stopped_by": stopped_by,
        "warmup": warmup,
        "ref_ms": ref_ms,
        "var_ms": var_ms,
        "ref": latency_summary(ref_ms),
        "var": latency_summary(var_ms),
        "speedup": paired_speedup(ref_ms, var_ms),
        "ref_peak_memory_bytes": max(ref_peak),
        "var_peak_memory_bytes": max(var_peak),
    }

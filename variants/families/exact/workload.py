"""Workloads for the exact family: the eval split as it is and a Zipf-repeated draw of it, each
timed as a stream of calls (reference and variant alternated per call), side by side.

- ``eval``: the eval split's rows in order, cut into calls of B rows (few repeats: whatever
  duplicate texts the data holds).
- ``zipf``: calls × B rows drawn from the eval rows with bounded-Zipf repeats (SciPy
  ``scipy.stats.zipfian(a=exponent, n=n_eval)``: P(rank k) ∝ k^-exponent, k = 1..n_eval),
  seeded; which row holds which rank is a seeded permutation.

A cache variant starts each stream cold (empty). Its hit cost ε is measured separately, on the
eval workload's first call: the same request repeated (a full hit after one full miss) against
the same call with the cache emptied before it (the miss path), alternated with the reference;
this is the one place a request is repeated on purpose, and the record says so.

MLX is imported only by the timing functions; :func:`zipf_rows` and :func:`repeat_rate` are
NumPy/SciPy.
"""

import time

import numpy as np


def zipf_rows(n_items, n_draws, exponent, seed):
    """(n_draws,) int64 rows in [0, n_items) with bounded-Zipf repeats (deterministic in ``seed``).

    Raises
    ------
    ValueError
        ``n_items`` or ``n_draws`` < 1, or ``exponent`` not > 0 (naming --zipf-exponent).
    """
    from scipy.stats import zipfian

    if n_items < 1 or n_draws < 1:
        raise ValueError(f"a Zipf workload needs >= 1 item and draw, got {n_items}, {n_draws}")
    if not (np.isfinite(exponent) and exponent > 0):
        raise ValueError(f"--zipf-exponent {exponent!r} must be a finite number > 0, e.g. 1.1")
    rng = np.random.default_rng([int(seed), 19])
    ranks = zipfian(float(exponent), int(n_items)).rvs(size=int(n_draws), random_state=rng)
    perm = rng.permutation(int(n_items))
    return perm[np.asarray(ranks, np.int64) - 1]


def repeat_rate(rows):
    """Share of draws that repeat an earlier one: 1 − distinct / total (0 for no draws)."""
    rows = np.asarray(rows)
    return 0.0 if rows.size == 0 else 1.0 - len(np.unique(rows)) / rows.size


def workload_rows(n_eval, batch_size, calls, exponent, seed):
    """{"eval": rows, "zipf": rows}: the first ``calls × batch_size`` eval rows in order (all
    of them when fewer) and as many Zipf draws."""
    total = int(batch_size) * int(calls)
    return {"eval": np.arange(min(total, n_eval), dtype=np.int64),
            "zipf": zipf_rows(n_eval, total, exponent, seed)}


def _timed(fn):
    t0 = time.perf_counter()
    staged = fn()
    return (time.perf_counter() - t0) * 1e3, staged.ms["forward"]


def _stats(model):
    return dict(getattr(model, "exact_stats", {}))


def _delta(after, before):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def time_stream(reference, variant, taskset, rows, batch_size):
    """One stream: calls of ``batch_size`` rows of ``taskset`` (``rows`` in order), reference
    and variant alternated per call (end to end: tokenise, forward, post-process), the variant's
    cache cold at the start. Returns the stream's record (see :func:`workload_timing`)."""
    from variants.runtime.timing import end_to_end_call

    calls = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
    warm = taskset.subset(calls[0])
    for m in (reference, variant):  # compile / allocate once; untimed
        end_to_end_call(m, warm)()
    if hasattr(variant, "exact_reset"):
        variant.exact_reset()
    ref_ms, var_ms, ref_fwd, var_fwd, per_call = [], [], [], [], []
    for c in calls:
        sub = taskset.subset(c)
        t, f = _timed(end_to_end_call(reference, sub))
        ref_ms.append(t)
        ref_fwd.append(f)
        before = _stats(variant)
        t, f = _timed(end_to_end_call(variant, sub))
        var_ms.append(t)
        var_fwd.append(f)
        per_call.append(_delta(_stats(variant), before))
    tot = {k: sum(p.get(k, 0) for p in per_call) for k in ("rows", "unique", "cache_hits",
                                                          "computed")}
    n = len(rows)
    rec = {"calls": len(calls), "batch_size": int(batch_size), "rows": int(n),
           "distinct_rows": int(len(np.unique(rows))), "repeat_rate": repeat_rate(rows),
           "ref_ms": ref_ms, "var_ms": var_ms, "ref_forward_ms": ref_fwd,
           "var_forward_ms": var_fwd,
           "ref_mean_ms": float(np.mean(ref_ms)), "var_mean_ms": float(np.mean(var_ms)),
           "speedup_mean": float(np.sum(ref_ms) / np.sum(var_ms)),
           "speedup_median": float(np.median(np.array(ref_ms) / np.array(var_ms))),
           "forward_speedup_mean": float(np.sum(ref_fwd) / np.sum(var_fwd)),
           "cold_first_call_ms": {"ref": ref_ms[0], "var": var_ms[0]},
           "timed_region": "end to end per call (tokenise, forward, post-process); reference "
                           "and variant alternated call by call; variant cache cold at start"}
    if tot["rows"]:
        rec.update(unique=tot["unique"], U_over_N=tot["unique"] / tot["rows"],
                   ideal_dedup_speedup=tot["rows"] / tot["unique"], computed=tot["computed"],
                   cache_hits=tot["cache_hits"], cache_hit_rate=tot["cache_hits"] / tot["rows"],
                   h=1.0 - tot["computed"] / tot["rows"],
                   ideal_speedup=tot["rows"] / max(tot["computed"], 1))
    return rec


def hit_cost(reference, variant, taskset, rows, rounds=5):
    """ε and the miss path of a cache variant on one call (``rows`` of ``taskset``): per round
    the reference, the variant with its cache emptied first (every row a miss) and the variant
    again on the same request (every row a hit), end to end. Returns medians (ms),
    ``epsilon`` = hit / miss, ``miss_overhead`` = miss / reference, and a note that this
    repeats one request on purpose."""
    from variants.runtime.timing import end_to_end_call

    sub = taskset.subset(rows)
    ref_fn, var_fn = end_to_end_call(reference, sub), end_to_end_call(variant, sub)
    ref_fn(), var_fn()
    ref, miss, hit = [], [], []
    for _ in range(int(rounds)):
        ref.append(_timed(ref_fn)[0])
        variant.exact_cache.clear()
        miss.append(_timed(var_fn)[0])
        hit.append(_timed(var_fn)[0])
    variant.exact_reset()
    r, m, h = (float(np.median(x)) for x in (ref, miss, hit))
    return {"rows": int(len(rows)), "rounds": int(rounds), "ref_ms": ref, "miss_ms": miss,
            "hit_ms": hit, "ref_median_ms": r, "miss_median_ms": m, "hit_median_ms": h,
            "epsilon": h / m, "miss_overhead": m / r,
            "note": "the same request repeated on purpose: 'hit' is a call whose every row is "
                    "in the cache, 'miss' the same call with the cache emptied before it"}


def workload_timing(reference, variant, taskset, *, kind, batch_size, calls, exponent, seed):
    """timing.json's ``workloads`` for one exact variant: {"eval": stream, "zipf": stream,
    "settings": {...}} and for a cache variant ``hit_cost`` and per workload the cost model
    ``model_relative_latency`` = 1 − h + h·ε beside ``measured_relative_latency`` (variant mean
    / reference mean)."""
    n = len(taskset)
    b = max(1, min(int(batch_size), n))
    out = {"settings": {"batch_size": b, "calls": int(calls), "zipf_exponent": float(exponent),
                        "seed": int(seed), "n_eval": n,
                        "zipf": "scipy.stats.zipfian(a=exponent, n=n_eval), seeded"}}
    for name, rows in workload_rows(n, b, calls, exponent, seed).items():
        out[name] = time_stream(reference, variant, taskset, rows, b)
    if kind == "cache":
        out["hit_cost"] = hit_cost(reference, variant, taskset, np.arange(b))
        eps = out["hit_cost"]["epsilon"]
        for name in ("eval", "zipf"):
            s = out[name]
            s["model_relative_latency"] = 1.0 - s["h"] + s["h"] * eps
            s["measured_relative_latency"] = s["var_mean_ms"] / s["ref_mean_ms"]
    return out

"""An alarm for timings faster than the work they claim: a call that beats physics is a bug.

A forward must at least run its GEMMs. The encoder's Linear layers alone do
``2 · in · out`` FLOPs per real token (attention products, softmax, norms ignored, so the count is
a lower bound). The machine's rate is the fastest fp32 GEMM rate seen here: the best of a few
square ``mx.matmul`` (:func:`gemm_rate`), or the reference's own forward in the same measurement
when that ran faster (several CPU streams, a loaded machine while the GEMMs were timed). No
call can take less than

    floor_ms = 1e3 · FLOPs / (SAFETY · rate),

with FLOPs = the reference's Linear FLOPs on the call with the fewest real tokens / the
variant's claimed ``ideal_speedup`` (its cost model; 1 when it claims none: a quantized model
does the same multiplies; ``max_speedup`` instead when the family's work depends on the data and
one batch may gain more, e.g. early exit) and :data:`SAFETY` = 2 (a call would have to run at
twice the best rate measured on this machine; machine load moves the measured rate by less). A timed variant
call faster than the floor, or a measured speed-up more than :data:`IDEAL_FACTOR` times the
cost model's ideal, is flagged (``implausible``) with its reasons: a forward returning cached
logits, a lazy graph left unevaluated, a clock read in the wrong place. The flag is a warning
in timing.json and report.md, not a verdict: a variant that really skips work (an output cache
on repeated timing batches) earns it and should say so.

A speed-up with a cold call among its rounds (:mod:`variants.runtime.warmth`: the first call of
its shape since the buffer cache was cleared, e.g. under ``--timing-warmup 0``) is flagged too:
a cold reference call inflates the ratio (a first B=1 call measured ~30-120 ms against ~9 ms
warm), a cold variant call deflates it. The reason gives the median over the warm rounds alone.
"""

import functools
import time

import numpy as np

import mlx.core as mx
import mlx.nn as nn

#: A measured speed-up above this multiple of the cost model's ideal is flagged.
IDEAL_FACTOR = 3.0
#: The floor assumes a call could run this many times faster than the best rate measured.
SAFETY = 2.0
#: Square sizes and repeats of the GEMM-rate measurement.
GEMM_SIZES = (384, 768, 1024)
GEMM_REPEATS = 5


@functools.cache
def gemm_rate(sizes=GEMM_SIZES, repeats=GEMM_REPEATS):
    """Peak fp32 GEMM rate of this machine as MLX runs it: over ``sizes``, the fastest of
    ``repeats`` timed ``(n, n) @ (n, n)`` products (one untimed first) as ``2 n³ / seconds``,
    the best size's.

    Returns
    -------
    dict
        ``flops_per_s`` (float), ``n`` (the best size), ``best_ms``, ``per_size``
        ({n: FLOP/s}), ``repeats`` and ``how`` (a sentence). Cached per process (one
        measurement per sweep).
    """
    per_size, best_ms = {}, {}
    for n in sizes:
        a = mx.random.normal((n, n), key=mx.random.key(0))
        b = mx.random.normal((n, n), key=mx.random.key(1))
        mx.eval(a, b)
        mx.eval(a @ b)
        best = float("inf")
        for _ in range(int(repeats)):
            t0 = time.perf_counter()
            mx.eval(a @ b)
            best = min(best, time.perf_counter() - t0)
        per_size[int(n)], best_ms[int(n)] = 2.0 * n ** 3 / best, best * 1e3
    n = max(per_size, key=per_size.get)
    return {"flops_per_s": per_size[n], "n": n, "best_ms": best_ms[n], "per_size": per_size,
            "repeats": int(repeats),
            "how": f"fastest of {repeats} fp32 (n, n) @ (n, n) mx.matmul, mx.eval inside, "
                   f"best of n in {list(sizes)}"}


def linear_flops_per_token(module):
    """``Σ 2 · in · out`` over the nn.Linear layers of ``module.encoder`` (of ``module`` when it
    has no ``encoder``), quantized ones by their unpacked sizes (an exported, packed
    checkpoint): the encoder's GEMM FLOPs per token, a lower bound of its work.

    Raises
    ------
    ValueError
        When the module has no Linear layer (nothing to bound the work with).
    """
    enc = getattr(module, "encoder", module)
    def in_dims(m):  # packed: 32 / bits values per uint32
        return m.weight.shape[1] * 32 // m.bits if isinstance(m, nn.QuantizedLinear) \
            else m.weight.shape[1]
    total = sum(2 * m.weight.shape[0] * in_dims(m) for _, m in enc.named_modules()
                if isinstance(m, (nn.Linear, nn.QuantizedLinear)))
    if not total:
        raise ValueError(f"{type(module).__name__} has no Linear layer to count FLOPs of")
    return int(total)


def real_tokens(model, taskset):
    """Real (non-padding) tokens of ``taskset`` as ``model`` (a DecisionModel) prepares it in
    one batch (int)."""
    batches, _ = model.prepare(taskset, batch_size=len(taskset))
    return int(sum(int(b.attention_mask.astype(mx.int32).sum().item()) for b in batches))


def cold_reason(ref_ms, var_ms, ref_cold, var_cold):
    """The alarm's reason for a speed-up with cold calls among its rounds, or None.

    Parameters
    ----------
    ref_ms, var_ms : sequence of float
        Per-round times, milliseconds.
    ref_cold, var_cold : sequence of bool or None
        Per-round cold labels (timing.json ``ref_cold`` / ``var_cold``); None = not recorded
        (a run from before they were): no reason.

    Returns
    -------
    (str or None, int, float or None)
        The reason, the rounds with a cold call, and the median of ``ref_ms / var_ms`` over the
        rounds whose two calls were warm (None when no such round or a time is not positive).
    """
    if ref_cold is None or var_cold is None:
        return None, 0, None
    cold = np.asarray(ref_cold, bool) | np.asarray(var_cold, bool)
    n = int(cold.sum())
    if not n:
        return None, 0, None
    r, v = np.asarray(ref_ms, float)[~cold], np.asarray(var_ms, float)[~cold]
    warm = float(np.median(r / v)) if len(r) and (r > 0).all() and (v > 0).all() else None
    return (f"speed-up includes cold calls: {n} of {len(cold)} rounds timed a call that was the "
            f"first of its shape since the buffer cache was cleared (reference "
            f"{int(np.sum(ref_cold))}, variant {int(np.sum(var_cold))}); "
            + (f"median over the {len(r)} warm rounds {warm:.3g}×" if warm is not None
               else "no round had both calls warm")
            + " (raise --timing-warmup)"), n, warm


def assess(var_ms, speedup, *, flops, rate, ideal_speedup=None, ref_ms=None, max_speedup=None,
           ref_cold=None, var_cold=None):
    """The plausibility record of one timed entry.

    Parameters
    ----------
    var_ms : sequence of float
        The variant's timed calls, milliseconds.
    speedup : float or None
        The measured speed-up (median of per-round ratios).
    flops : float
        The reference's Linear FLOPs on the call with the fewest real tokens.
    rate : float
        Peak GEMM rate, FLOP/s (:func:`gemm_rate`).
    ideal_speedup : float, optional
        The variant's cost-model ideal; None or not positive = 1.
    max_speedup : float, optional
        The most the variant's cost model lets any one call gain when its work depends on the
        data (early exit: layers / the earliest exit layer); used instead of the ideal when
        larger, so a batch that happens to exit early is not flagged.
    ref_ms : sequence of float, optional
        The reference's timed calls: ``flops / min(ref_ms)`` replaces ``rate`` when higher
        (the rate its own forward reached).
    ref_cold, var_cold : sequence of bool, optional
        Per-round cold labels; any cold round flags the entry (:func:`cold_reason`; needs
        ``ref_ms``).

    Returns
    -------
    dict
        ``implausible`` (bool), ``reasons`` (list of str), ``floor_ms``, ``variant_flops``,
        ``gemm_flops_per_s``, ``reference_flops_per_s`` (None without ``ref_ms``),
        ``rate_flops_per_s`` (the higher), ``safety``, ``fastest_var_ms``,
        ``rounds_below_floor``, ``ideal_speedup``, ``speedup_over_ideal`` (None without a
        speed-up), ``cold_rounds`` (rounds with a cold call; 0 when unlabelled) and
        ``warm_speedup_median`` (:func:`cold_reason`; None without cold rounds).
    """
    ideal = ideal_speedup if ideal_speedup and ideal_speedup > 0 else 1.0
    ideal = max(ideal, max_speedup or 0.0)
    var_flops = flops / ideal
    ref_rate = 1e3 * flops / min(ref_ms) if ref_ms and min(ref_ms) > 0 else None
    best = max(rate, ref_rate or 0.0)
    floor = 1e3 * var_flops / (SAFETY * best)
    below = sum(1 for t in var_ms if t < floor)
    reasons = []
    if below:
        reasons.append(f"{below} of {len(var_ms)} variant calls faster than the {floor:.3g} ms "
                       f"floor ({var_flops:.3g} Linear FLOPs at {SAFETY:g}× the best measured "
                       f"{best / 1e9:.3g} GFLOP/s; fastest {min(var_ms):.3g} ms)")
    over = None if speedup is None else speedup / ideal
    if over is not None and over > IDEAL_FACTOR:
        reasons.append(f"speed-up {speedup:.3g}× is {over:.3g}× the cost model's ideal "
                       f"{ideal:.3g}× (more than {IDEAL_FACTOR:g}×)")
    why, cold_rounds, warm = (cold_reason(ref_ms, var_ms, ref_cold, var_cold) if ref_ms
                              else (None, 0, None))
    if why:
        reasons.append(why)
    return {"implausible": bool(reasons), "reasons": reasons, "floor_ms": floor,
            "variant_flops": var_flops, "gemm_flops_per_s": rate,
            "reference_flops_per_s": ref_rate, "rate_flops_per_s": best, "safety": SAFETY,
            "fastest_var_ms": min(var_ms), "rounds_below_floor": below,
            "ideal_speedup": ideal, "speedup_over_ideal": over, "cold_rounds": cold_rounds,
            "warm_speedup_median": warm}

"""Warm latency of reference and variant, timed in strict alternation (A B A B ...).

Method (docs/method.md, "Strict A/B alternation"): warm up both, then alternate one
reference call and one variant call per round, each synchronised inside the timed region
(``mx.eval``, or a NumPy copy of the result), so drift in machine load hits both alike. The
speed-up is the median of the per-round ratios (:func:`metrics.latency.paired_speedup`), never a
ratio of two medians. Defaults: 5 warm-ups, 50 timed rounds, under a
wall-clock budget per measurement.

Two timed regions (``TIMED_REGIONS``):

- ``forward``: prepared token ids -> option logits, ``mx.eval`` inside; tokenisation and
  post-processing excluded.
- ``end_to_end``: texts -> tokenisation -> forward -> post-processing into the decision outputs
  (probabilities, expected score, confidence, action probabilities, as NumPy arrays).

:func:`end_to_end_call` clocks the three stages of one end-to-end call separately, so a single
alternated measurement yields both regions: the ``forward`` times are the forward stage of the
same calls (same rounds, same alternation).

Every measurement starts from an empty buffer cache (:func:`variants.runtime.warmth.clear_buffer_cache`),
so its memory numbers are its own, and labels each timed call cold or warm
(:mod:`variants.runtime.warmth`: the first call of its shape since that clear is cold).
"""

import itertools
import time
from dataclasses import dataclass, field

import mlx.core as mx

from metrics.latency import latency_summary, paired_speedup, relative_trend
from runs.outputs import finish_outputs
from variants import defaults
from variants.runtime import warmth
from variants.runtime.memory import process_rss_bytes

TIMED_REGIONS = {
    "forward": "forward: prepared token ids -> option logits, mx.eval inside the timed region "
               "(tokenisation and post-processing excluded)",
    "end_to_end": "end to end: texts -> tokenisation -> forward -> post-processing into the "
                  "decision outputs (probabilities, expected score, confidence, action "
                  "probabilities as NumPy arrays)",
}
#: The forward region's description (kept for callers of the first timing.json schema).
TIMED_REGION = TIMED_REGIONS["forward"]
#: Memory held besides the allocator peak (max over rounds, read just after each call): MLX's
#: buffer cache (emptied when the measurement starts) and the process RSS (:mod:`variants.runtime.memory`; both models are loaded in the
#: process, so the RSS is the same process for reference and variant).
HELD_KEYS = ("ref_cache_memory_bytes", "var_cache_memory_bytes", "ref_process_rss_bytes",
             "var_process_rss_bytes")
#: The cold labels of a measurement (:func:`time_alternating`): per round (lists of bool) and
#: counted; a forward stage is as cold as its call.
COLD_KEYS = ("ref_cold", "var_cold", "ref_cold_calls", "var_cold_calls")
#: Stages of :func:`end_to_end_call`, in call order.
STAGES = ("tokenise", "forward", "postprocess")

# docs/method.md: 5 warm-ups, 50 timed rounds (the values live in variants.defaults)
DEFAULT_WARMUP = defaults.TIMING_WARMUP
DEFAULT_ROUNDS = defaults.TIMING_ROUNDS
DEFAULT_MIN_ROUNDS = defaults.TIMING_MIN_ROUNDS
DEFAULT_BUDGET_S = defaults.TIMING_BUDGET_S
#: Warm-ups stop (after the first) once they have used this share of the budget.
WARMUP_BUDGET_SHARE = 0.25


@dataclass
class Staged:
    """What a staged call returns: milliseconds and peak MLX memory (bytes) per stage.

    :func:`time_alternating` recognises it: the call's total is still clocked around the whole
    call, and each stage's times are collected into a paired measurement of their own.
    ``cold``: True when the call ran a shape its model had not run since the buffer cache was
    last cleared (:func:`variants.runtime.warmth.is_cold`), None when unknown.
    """

    ms: dict = field(default_factory=dict)
    peak_bytes: dict = field(default_factory=dict)
    result: object = None
    cold: bool = None


def end_to_end_call(model, taskset):
    """A function that runs ``model`` end to end on ``taskset`` and returns a :class:`Staged`.

    Stages: ``tokenise`` (``model.prepare``: texts -> one PreparedBatch of all ``len(taskset)``
    texts, padded to the longest), ``forward`` (``model.raw_logits`` on that batch:
    ``model.forward`` + ``mx.eval`` + a copy of the (N, K) logits to NumPy; the forward-only
    region) and ``postprocess`` (:func:`runs.outputs.finish_outputs`: temperature,
    probabilities, expected score, confidence, action probabilities). Peak memory is reset before each stage.
    ``Staged.cold`` says whether the batch's (B, L) shape is new to ``model`` since the buffer
    cache was last cleared (:mod:`variants.runtime.warmth`); the call then records the shape.

    Parameters
    ----------
    model : variants.models.decision.DecisionModel
        With temperatures for every option count in ``taskset``.
    taskset : variants.datasets.tasks.TaskSet
        The texts of one batch (N >= 1).

    Returns
    -------
    callable () -> Staged
        ``Staged.result`` is the :class:`~runs.outputs.DecisionOutputs` of the call.

    Raises
    ------
    ValueError
        If ``taskset`` is empty (raised at once) or a temperature is missing (raised when called).
    """
    n = len(taskset)
    if n < 1:
        raise ValueError("end_to_end_call needs at least one text")

    def call():
        ms, peak = {}, {}
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        batches, _ = model.prepare(taskset, batch_size=n)
        t_tok = time.perf_counter()
        peak["tokenise"] = int(mx.get_peak_memory())
        shapes = warmth.batch_shapes(batches)
        cold = warmth.is_cold(model, shapes)
        mx.reset_peak_memory()
        t1 = time.perf_counter()
        raw = model.raw_logits(taskset, batches)  # forward + mx.eval per batch, (N, K) NumPy
        t2 = time.perf_counter()
        peak["forward"] = int(mx.get_peak_memory())
        mx.reset_peak_memory()
        t2b = time.perf_counter()
        extra = {}
        if getattr(model, "last_exit_layer", None) is not None:  # early exit reports its layers
            extra["exit_layer"] = model.last_exit_layer
        result = finish_outputs(
            raw, taskset.option_mask, model.temperature_of(taskset), taskset.option_scores,
            taskset.action_map, ids=taskset.ids, task=taskset.task, labels=taskset.labels,
            human_dist=taskset.human_dist, **extra)
        t3 = time.perf_counter()
        peak["postprocess"] = int(mx.get_peak_memory())
        warmth.record(model, shapes)
        ms.update(tokenise=(t_tok - t0) * 1e3, forward=(t2 - t1) * 1e3,
                  postprocess=(t3 - t2b) * 1e3)
        return Staged(ms=ms, peak_bytes=peak, result=result, cold=cold)

    return call


def rotating(calls):
    """One function calling ``calls`` in turn (call k runs ``calls[k % len(calls)]``): two
    rotations given to :func:`time_alternating`, which calls both alike, run the same
    position in every round (e.g. the same text for reference and variant). The function's
    ``cycle`` attribute is ``len(calls)``: :func:`time_alternating` warms every position."""
    if len(calls) == 1:
        return calls[0]
    it = itertools.cycle(calls)

    def call():
        return next(it)()

    call.cycle = len(calls)
    return call


def _call(fn):
    """One synchronised call: (total ms, allocator peak bytes, bytes active before, Staged or
    None, {"cache_bytes", "rss_bytes"} read just after the call, outside the timed region)."""
    before = int(mx.get_active_memory())
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    out = fn()
    if isinstance(out, Staged):
        ms = (time.perf_counter() - t0) * 1e3
        return ms, max(out.peak_bytes.values(), default=0), before, out, _held()
    mx.eval(out)
    ms = (time.perf_counter() - t0) * 1e3
    return ms, int(mx.get_peak_memory()), before, None, _held()


def _held():
    """MLX's buffer cache and the process RSS now (:mod:`variants.runtime.memory`), bytes."""
    return {"cache_bytes": int(mx.get_cache_memory()), "rss_bytes": process_rss_bytes()}


def _speedup(ref_ms, var_ms):
    """paired_speedup, or None when a time is 0 (a stage too short for the clock)."""
    if min(ref_ms) <= 0 or min(var_ms) <= 0:
        return None
    return paired_speedup(ref_ms, var_ms)


def _pair(ref_ms, var_ms, ref_peak, var_peak, ref_before=None, var_before=None):
    over = {}
    if ref_before is not None:
        over = {"ref_peak_over_active_bytes": max(p - b for p, b in zip(ref_peak, ref_before)),
                "var_peak_over_active_bytes": max(p - b for p, b in zip(var_peak, var_before))}
    return {
        "ref_ms": ref_ms,
        "var_ms": var_ms,
        "ref": latency_summary(ref_ms),
        "var": latency_summary(var_ms),
        "speedup": _speedup(ref_ms, var_ms),
        "ref_peak_memory_bytes": max(ref_peak),
        "var_peak_memory_bytes": max(var_peak),
        "ref_peak_memory_bytes_rounds": ref_peak,
        "var_peak_memory_bytes_rounds": var_peak,
        "ref_trend_per_round": relative_trend(ref_ms),
        "var_trend_per_round": relative_trend(var_ms),
        **over,
    }


def time_alternating(ref_fn, var_fn, *, warmup=DEFAULT_WARMUP, rounds=DEFAULT_ROUNDS,
                     min_rounds=DEFAULT_MIN_ROUNDS, budget_s=DEFAULT_BUDGET_S):
    """Time ``ref_fn`` and ``var_fn`` in strict alternation, under a wall-clock budget.

    Each function returns an ``mx.array`` (or a tree of them; evaluated with ``mx.eval`` inside
    the timed region) or a :class:`Staged` (already synchronised; its stages are measured too).
    MLX's buffer cache is emptied first (:func:`variants.runtime.warmth.clear_buffer_cache`), so
    the memory numbers are this measurement's own, and every timed call is labelled cold or
    warm: a :class:`Staged` call by its ``cold`` (the first of its shape since the clear), any
    other call cold when it is its function's first since the clear (its shape is unknown).

    Parameters
    ----------
    ref_fn, var_fn : callable () -> mx.array | Staged
    warmup : int, default=5
        Untimed calls of each (alternated) before timing; 0 times cold first calls (labelled
        so). When >= 1, at least one per position of a :func:`rotating` function (its
        ``cycle``), so that every timed shape is warmed; after those, warm-ups stop once they
        have used ``WARMUP_BUDGET_SHARE`` of ``budget_s``.
    rounds : int, default=50
        Timed rounds wanted (one reference + one variant call each).
    min_rounds : int, default=3
        Rounds run even when the budget is exhausted.
    budget_s : float, default=30.0
        Wall-clock budget (seconds) of the whole measurement, warm-ups included. After
        ``min_rounds``, no round starts that the last round's duration says would end past it.

    Returns
    -------
    dict
        ``ref_ms``, ``var_ms`` (per round, ms), their :func:`latency_summary` (``ref``, ``var``),
        the :func:`paired_speedup` (``speedup``), ``ref_peak_memory_bytes`` /
        ``var_peak_memory_bytes`` (max over rounds; ``mx.get_peak_memory`` reset before every
        call, so it includes every array alive then: both models' weights) and their per-round
        lists ``*_rounds``, ``ref_peak_over_active_bytes`` / ``var_peak_over_active_bytes`` (max
        over rounds of the peak minus ``mx.get_active_memory`` just before the call: the
        call's own activations and workspace), ``ref_trend_per_round`` /
        ``var_trend_per_round`` (:func:`metrics.latency.relative_trend`),
        ``ref_active_before_bytes_rounds`` / ``var_active_before_bytes_rounds`` (active bytes
        just before each call), ``ref_cache_memory_bytes`` / ``var_cache_memory_bytes`` (max over
        rounds of ``mx.get_cache_memory`` just after the call: freed buffers MLX kept since the
        clear, not in the peak) and ``ref_process_rss_bytes`` / ``var_process_rss_bytes`` (max over rounds of
        the process's resident set just after the call: interpreter, libraries, both models),
        ``cache_cleared_bytes`` (what the buffer cache held before this measurement emptied it),
        ``ref_cold`` / ``var_cold`` (per round, bool: the call was cold), ``ref_cold_calls`` /
        ``var_cold_calls`` (how many), ``active_memory_bytes_rounds`` (``mx.get_active_memory``
        after each round) and
        ``active_memory_growth_bytes`` (last - first), ``rounds`` (run), ``rounds_requested``,
        ``min_rounds``, ``warmup`` (requested), ``warmup_run``, ``budget_s``, ``elapsed_s``,
        ``stopped_by`` ("rounds": all requested rounds ran; "budget": stopped early). With
        :class:`Staged` calls also ``stages``: {stage: the same pair fields for that stage}.

    Raises
    ------
    ValueError
        If ``rounds`` or ``min_rounds`` < 1, ``warmup`` < 0 or ``budget_s`` <= 0.
    """
    if rounds < 1 or min_rounds < 1 or warmup < 0:
        raise ValueError("rounds and min_rounds must be >= 1 and warmup >= 0")
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s}")
    cleared = warmth.clear_buffer_cache()
    start = time.perf_counter()
    warm = 0
    cycle = max(getattr(ref_fn, "cycle", 1), getattr(var_fn, "cycle", 1)) if warmup else 0
    for _ in range(max(warmup, cycle)):
        _call(ref_fn)
        _call(var_fn)
        warm += 1
        if warm >= cycle and time.perf_counter() - start > WARMUP_BUDGET_SHARE * budget_s:
            break
    ref_ms, var_ms, ref_peak, var_peak, active = [], [], [], [], []
    before = {"ref": [], "var": []}
    held = {"ref": [], "var": []}
    cold = {"ref": [], "var": []}
    stages = {}
    stopped_by = "rounds"
    for i in range(rounds):
        r0 = time.perf_counter()
        for fn, times, peaks, side in ((ref_fn, ref_ms, ref_peak, "ref"),
                                       (var_fn, var_ms, var_peak, "var")):
            ms, peak, active_before, staged, after = _call(fn)
            cold[side].append(bool(staged.cold) if staged is not None and staged.cold is not None
                              else warm == 0 and not times)
            times.append(ms)
            peaks.append(peak)
            before[side].append(active_before)
            held[side].append(after)
            if staged is not None:
                for s, v in staged.ms.items():
                    st = stages.setdefault(s, {"ref_ms": [], "var_ms": [], "ref_peak": [],
                                               "var_peak": []})
                    st[f"{side}_ms"].append(v)
                    st[f"{side}_peak"].append(int(staged.peak_bytes.get(s, 0)))
        active.append(int(mx.get_active_memory()))
        now = time.perf_counter()
        if i + 1 >= min_rounds and i + 1 < rounds and now + (now - r0) - start > budget_s:
            stopped_by = "budget"
            break
    out = {
        "rounds": len(ref_ms),
        "rounds_requested": int(rounds),
        "min_rounds": int(min_rounds),
        "stopped_by": stopped_by,
        "warmup": int(warmup),
        "warmup_run": warm,
        "budget_s": float(budget_s),
        "elapsed_s": time.perf_counter() - start,
        **_pair(ref_ms, var_ms, ref_peak, var_peak, before["ref"], before["var"]),
        "active_memory_bytes_rounds": active,
        "active_memory_growth_bytes": active[-1] - active[0],
        "ref_active_before_bytes_rounds": before["ref"],
        "var_active_before_bytes_rounds": before["var"],
        "cache_cleared_bytes": cleared,
        "ref_cold": cold["ref"], "var_cold": cold["var"],
        "ref_cold_calls": sum(cold["ref"]), "var_cold_calls": sum(cold["var"]),
        **{f"{side}_{what}": max(h[key] for h in held[side])
           for side in ("ref", "var")
           for what, key in (("cache_memory_bytes", "cache_bytes"),
                             ("process_rss_bytes", "rss_bytes"))},
    }
    if stages:
        out["stages"] = {s: _pair(v["ref_ms"], v["var_ms"], v["ref_peak"], v["var_peak"])
                         for s, v in stages.items()}
    return out


def split_regions(measurement):
    """The ``forward`` and ``end_to_end`` entries of timing.json from one staged measurement.

    Parameters
    ----------
    measurement : dict
        :func:`time_alternating` of two :func:`end_to_end_call` functions.

    Returns
    -------
    forward, end_to_end : dict, dict
        Both carry the run fields (``rounds``, ``rounds_requested``, ``stopped_by``, ...,
        the cold labels :data:`COLD_KEYS`: a forward stage is as cold as its call) and
        ``timed_region``. ``forward`` holds the forward stage's pair fields (``ref_ms``,
        ``var_ms``, ``ref``, ``var``, ``speedup``, peak memory of that stage) and
        ``measured_as``; ``end_to_end`` holds the whole calls' pair fields and ``stages_p50_ms``
        {stage: {"ref": p50, "var": p50}}.

    Raises
    ------
    KeyError
        If ``measurement`` has no ``forward`` stage.
    """
    run = {k: measurement[k] for k in ("rounds", "rounds_requested", "min_rounds", "stopped_by",
                                       "warmup", "warmup_run", "budget_s", "elapsed_s",
                                       "active_memory_bytes_rounds",
                                       "active_memory_growth_bytes", "cache_cleared_bytes")
           + HELD_KEYS + COLD_KEYS}
    stages = measurement["stages"]
    # the forward stage's own peak minus the bytes active before the call (its workspace)
    fwd_over = {f"{side}_peak_over_active_bytes": max(
        p - b for p, b in zip(stages["forward"][f"{side}_peak_memory_bytes_rounds"],
                              measurement[f"{side}_active_before_bytes_rounds"]))
        for side in ("ref", "var")}
    fwd = {**run, **stages["forward"], **fwd_over, "timed_region": TIMED_REGIONS["forward"],
           "measured_as": "forward stage of the alternated end-to-end calls (same rounds)"}
    e2e = {**run, **{k: v for k, v in measurement.items() if k not in run and k != "stages"},
           "timed_region": TIMED_REGIONS["end_to_end"],
           "stages_p50_ms": {s: {"ref": v["ref"]["p50_ms"], "var": v["var"]["p50_ms"]}
                             for s, v in stages.items()}}
    return fwd, e2e

"""The sweep's speed measurement: which eval texts are timed, and one variant timed against the
reference (strict alternation, both timed regions, :mod:`variants.runtime.timing`) into timing.json's
content."""

import mlx.core as mx
import numpy as np

from variants import BLAS_INFO
from variants.runtime import device
from variants.arch import encoder, modernbert
from variants.sweep import plausible
from variants.runtime import qlinear
from variants.runtime.int8_linear import int8_record
from variants.runtime.memory import model_bytes  # noqa: F401
from variants.runtime.timing import (TIMED_REGIONS, end_to_end_call, rotating, split_regions,
                                     time_alternating)

#: Version of timing.json (1 = forward only, no schema_version key; 2 = + end_to_end, method,
#: model_bytes, cold_start). Documented in results/README.md.
TIMING_SCHEMA_VERSION = 2


def kernel(model):
    """The Linear kernel(s) a DecisionModel's forward runs now, for timing records: the
    quantized Linears' (:func:`variants.runtime.qlinear.kernels`: ``unpack+gemm``, ``dequant+gemm``,
    ``quantized_matmul``) and ``fused-layer-cpp`` when fp32 layers run as one compiled op
    (:mod:`variants.runtime.fused_layer`; ModernBERT's: ``fused-mbert-layer-cpp``,
    :mod:`variants.arch.modernbert_fused`; its quantized layers': ``fused-mbert-qlayer-cpp``,
    :mod:`variants.arch.modernbert_fused_q`; its W8A8 layers': ``fused-mbert-int8layer-cpp``,
    :mod:`variants.arch.modernbert_fused_i8`), comma-joined when mixed, else ``fp32 gemm``;
    the null control (:class:`variants.families.exact.build.NullMixin`) ``fp32 gemm (plain
    MLX)``."""
    from variants.families.exact.build import NullMixin
    from variants.families.w8a8 import build as w8a8

    if isinstance(model, NullMixin):  # the null control: the plain path, whatever is built
        return "fp32 gemm (plain MLX)"
    fused = (encoder.compiled_paths(model.module), modernbert.compiled_paths(model.module))
    names = qlinear.kernels(model.module) + [n for n in fused if n]
    names += [w8a8.kernel_name(model.module)] if w8a8.kernel_name(model.module) else []
    return ", ".join(names) or "fp32 gemm"


#: Texts the B=1 timing cycles over (one per call, the same for reference and variant): a
#: family whose path depends on the input (a student's fallback, an exit layer) is timed on a
#: mix of paths, not on one text's.
B1_TEXTS = 8


def _central_texts(texts, lengths, n):
    """Indices of ``n`` distinct texts nearest the median token length: the median text
    (stable sort) first, then the others in eval order."""
    order = np.argsort(lengths, kind="stable")
    m = len(order) // 2
    ranks = sorted(range(len(order)), key=lambda r: (abs(r - m), r))  # outward from the median
    picked, seen = [], set()
    for r in ranks:
        i = int(order[r])
        if texts[i] not in seen:
            seen.add(texts[i])
            picked.append(i)
        if len(picked) == n:
            break
    return [picked[0]] + sorted(picked[1:]) if picked else []


def timing_batches(reference, taskset, batch_sizes, seed):
    """{B: (TaskSet, seq_len)} for each of ``batch_sizes``: B=1 up to :data:`B1_TEXTS`
    distinct texts of ``taskset`` (the eval split) nearest its median token length, the median
    text first (timed one per call in rotation, :func:`time_pair`), B>1 B texts drawn with
    ``seed`` (one batch). ``seq_len`` is the padded length of the first batch (the median text
    at B=1) as ``reference`` (a DecisionModel) prepares it."""
    ts = taskset
    encs, _ = reference.tokenizer.encode(list(ts.texts))
    lengths = np.array([len(e.ids) for e in encs])
    out = {}
    for b in dict.fromkeys(batch_sizes):
        rng = np.random.default_rng(seed)
        idx = (np.array(_central_texts(list(ts.texts), lengths, B1_TEXTS)) if b == 1
               else np.sort(rng.choice(len(ts), min(b, len(ts)), replace=False)))
        sub = ts.subset(idx)
        first = timed_batches(sub, b)[0]
        batches, _ = reference.prepare(first, batch_size=len(first))
        out[b] = (sub, int(batches[0].input_ids.shape[1]))
    return out


def timed_batches(ts, b):
    """The calls of a timing set: ``ts`` itself when it holds at most ``b`` texts (one batch,
    repeated), else its consecutive ``b``-text batches (timed in rotation)."""
    if len(ts) <= b:
        return [ts]
    return [ts.subset(np.arange(i, i + b)) for i in range(0, len(ts) - b + 1, b)]


def time_pair(reference, variant, timing_sets, cfg, ideal_speedup=None, max_speedup=None):
    """timing.json content: per batch size of ``timing_sets`` ({B: (TaskSet, seq_len)}) one
    alternated measurement of end-to-end calls of ``reference`` and ``variant`` (built in the
    speed mode, parameters evaluated) gives both regions (``batches`` = forward,
    ``end_to_end``); ``cfg`` (a validated SweepConfig) gives the mode and timing settings.
    A set of more than B texts is timed as its B-text batches in rotation
    (:func:`timed_batches`), the same batch for both models in each round; its entries add
    ``texts_cycled`` (batches) and ``seq_lens`` (each one's padded length).

    Every entry also gets ``plausibility`` (:func:`variants.sweep.plausible.assess`: the variant's
    calls against the floor of the reference's Linear FLOPs on the call with the fewest real
    tokens divided by ``ideal_speedup`` — the variant's cost-model ideal, None = 1, or
    ``max_speedup`` when larger (the most one batch can gain, early exit) — at twice
    the best of the measured GEMM peak and the reference's own rate, and the speed-up against 3×
    that ideal); ``gemm_rate`` and
    ``implausible`` (any entry flagged) sit at the top level."""
    result = {"schema_version": TIMING_SCHEMA_VERSION,
              "timed_region": TIMED_REGIONS["forward"], "timed_regions": dict(TIMED_REGIONS),
              "mode": cfg.speed_mode, "dtype": device.key_part()["dtype"],
              "device": str(mx.default_device()), "blas": dict(BLAS_INFO),
              "method": {"alternation": "strict: reference, variant per round",
                         "speedup": "median of per-round ratios ref_ms / var_ms, "
                                    "percentile-bootstrap 95% CI",
                         "warmup": cfg.timing_warmup, "rounds": cfg.timing_rounds,
                         "min_rounds": cfg.timing_min_rounds,
                         "budget_s_per_measurement": cfg.timing_budget_s,
                         "peak_memory": "allocator peak: mx.get_peak_memory, reset before "
                                        "every call",
                         "call_memory": "peak_over_active: that peak minus mx.get_active_memory "
                                        "just before the call (the call's own activations and "
                                        "workspace), max over rounds",
                         "cache_cleared": "mx.clear_cache before each batch size's measurement "
                                          "(its warm-ups included): cache_cleared_bytes is what "
                                          "it held then",
                         "cache_memory": "mx.get_cache_memory just after each call (freed "
                                         "buffers MLX keeps since the clear; not in the peak), "
                                         "max over rounds",
                         "cold": "ref_cold / var_cold per round: the call was the first of its "
                                 "(B, L) shape for its model since the clear "
                                 "(variants.runtime.warmth); any cold round flags the entry's "
                                 "plausibility",
                         "process_rss": "resident set of the whole process just after each "
                                        "call (psutil; interpreter, libraries, both models), "
                                        "max over rounds"},
              "model_bytes": {"reference": model_bytes(reference),
                              "variant": model_bytes(variant)},
              "kernel": {"reference": kernel(reference), "variant": kernel(variant)},
              # the int8 GEMM's exact scheme and oneDNN's ISA where the variant runs one
              "int8": int8_record(kernel(variant)),
              "batches": {}, "end_to_end": {}}
    for b, (ts, seq_len) in timing_sets.items():
        calls = timed_batches(ts, b)
        # each model cycles over the same batches; time_alternating calls the two alike (warm-ups
        # and rounds), so round k times batch k mod n for both
        r = time_alternating(rotating([end_to_end_call(reference, c) for c in calls]),
                             rotating([end_to_end_call(variant, c) for c in calls]),
                             warmup=cfg.timing_warmup,
                             rounds=cfg.timing_rounds, min_rounds=cfg.timing_min_rounds,
                             budget_s=cfg.timing_budget_s)
        fwd, e2e = split_regions(r)
        cycled = {} if len(calls) == 1 else {
            "texts_cycled": len(calls),
            "seq_lens": [int(reference.prepare(c, batch_size=len(c))[0][0].input_ids.shape[1])
                         for c in calls]}
        for entry in (fwd, e2e):
            entry["kernel"] = result["kernel"]["variant"]
            entry["batch_size"] = len(calls[0])
            entry["seq_len"] = seq_len
            entry.update(cycled)
        result["batches"][str(b)] = fwd
        result["end_to_end"][str(b)] = e2e
    add_plausibility(result, reference, timing_sets, ideal_speedup, max_speedup)
    return result


def add_plausibility(result, reference, timing_sets, ideal_speedup=None, max_speedup=None):
    """Add ``plausibility`` to every entry of ``result`` (:func:`time_pair`'s content) and
    ``gemm_rate`` / ``implausible`` at its top level (:mod:`variants.sweep.plausible`): the floor is
    the reference's Linear FLOPs on the timed call with the fewest real tokens."""
    if not timing_sets:
        result["implausible"] = False
        return
    rate = plausible.gemm_rate()
    per_token = plausible.linear_flops_per_token(reference.module)
    result["gemm_rate"] = rate
    for b, (ts, _) in timing_sets.items():
        flops = per_token * min(plausible.real_tokens(reference, c) for c in timed_batches(ts, b))
        for region in ("batches", "end_to_end"):
            entry = result[region][str(b)]
            entry["plausibility"] = plausible.assess(
                entry["var_ms"], (entry["speedup"] or {}).get("speedup_median"), flops=flops,
                rate=rate["flops_per_s"], ideal_speedup=ideal_speedup, ref_ms=entry["ref_ms"],
                max_speedup=max_speedup, ref_cold=entry.get("ref_cold"),
                var_cold=entry.get("var_cold"))
    result["implausible"] = any(e["plausibility"]["implausible"]
                                for region in ("batches", "end_to_end")
                                for e in result[region].values())


def cold_start_spec(sweep, timing_sets, family=None, vcfg=None, artifact=None):
    """The :func:`variants.sweep.coldstart.run_spec` spec of ``sweep``'s reference (``vcfg`` None) or
    of variant ``vcfg`` of ``family``: the smallest timed batch, and either ``artifact`` (the
    variant's weights folder, :func:`variants.families.artifact.write_weights`: the child loads
    that and nothing else) or the checkpoint, the run's reference head and temperatures
    (``reference/fitted.npz``) and the :class:`BuildInputs` fields the family's build reads."""
    b = min(timing_sets)
    from variants.models import fitted_state
    from variants.sweep.inputs import checkpoint_path

    source = sweep.cfg.resolve_model()
    spec = {"model": source,
            "taskset": timed_batches(timing_sets[b][0], b)[0],  # B=1: the median text
            "device": sweep.cfg.device, "dtype": sweep.cfg.dtype,
            "max_length": sweep.cfg.max_length_choice()}
    if artifact is not None:
        spec.update(artifact=str(artifact), family=sweep.cfg.family, variant=vcfg.name)
        return spec
    ck = checkpoint_path(sweep.cfg, source)
    spec.update(checkpoint=None if ck is None else str(ck),
                head_path=str((sweep.out / fitted_state.RUN_FILE).resolve()))
    if vcfg is not None:
        spec.update(family=sweep.cfg.family, params=dict(sweep.cfg.params), variant=vcfg.name,
                    config=vcfg,  # a variant given as a config (a search's finalist) is in no ladder
                    mode=sweep.cfg.speed_mode, calibration=sweep.tasksets["calibration"],
                    cache_dir=str(sweep.cache.resolve()),
                    fit=sweep.tasksets["fit"] if "fit" in family.inputs else None)
    return spec

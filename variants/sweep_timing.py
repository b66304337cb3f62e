"""The sweep's speed measurement: which eval texts are timed, and one variant timed against the
reference (strict alternation, both timed regions, :mod:`variants.timing`) into timing.json's
content."""

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from variants import BLAS_INFO, device, fused_layer, qlinear
from variants.timing import TIMED_REGIONS, end_to_end_call, split_regions, time_alternating

#: Version of timing.json (1 = forward only, no schema_version key; 2 = + end_to_end, method,
#: model_bytes, cold_start). Documented in results/README.md.
TIMING_SCHEMA_VERSION = 2


def model_bytes(model):
    """Bytes of a DecisionModel's parameters as stored (quantized layers: packed weights +
    scales + biases; fp32 elsewhere)."""
    return int(sum(v.nbytes for _, v in tree_flatten(model.module.parameters())))


def kernel(model):
    """The Linear kernel(s) a DecisionModel's forward runs now, for timing records: the
    quantized Linears' (:func:`variants.qlinear.kernels`: ``unpack+gemm``, ``dequant+gemm``,
    ``quantized_matmul``) and ``fused-layer-cpp`` when fp32 layers run as one compiled op
    (:mod:`variants.fused_layer`), comma-joined when mixed, else ``fp32 gemm``."""
    names = qlinear.kernels(model.module) + [n for n in (fused_layer.used_in(model.module),) if n]
    return ", ".join(names) or "fp32 gemm"


def timing_batches(reference, taskset, batch_sizes, seed):
    """{B: (TaskSet, seq_len)} for each of ``batch_sizes``: B=1 the text of ``taskset`` (the eval
    split) of median token length, B>1 B texts drawn with ``seed``. ``seq_len`` is the padded
    length of the batch as ``reference`` (a DecisionModel) prepares it."""
    ts = taskset
    encs, _ = reference.tokenizer.encode(list(ts.texts))
    lengths = np.array([len(e.ids) for e in encs])
    median_idx = int(np.argsort(lengths, kind="stable")[len(lengths) // 2])
    out = {}
    for b in dict.fromkeys(batch_sizes):
        rng = np.random.default_rng(seed)
        idx = (np.array([median_idx]) if b == 1
               else np.sort(rng.choice(len(ts), min(b, len(ts)), replace=False)))
        sub = ts.subset(idx)
        batches, _ = reference.prepare(sub, batch_size=len(sub))
        out[b] = (sub, int(batches[0].input_ids.shape[1]))
    return out


def time_pair(reference, variant, timing_sets, cfg):
    """timing.json content: per batch size of ``timing_sets`` ({B: (TaskSet, seq_len)}) one
    alternated measurement of end-to-end calls of ``reference`` and ``variant`` (built in the
    speed mode, parameters evaluated) gives both regions (``batches`` = forward,
    ``end_to_end``); ``cfg`` (a validated SweepConfig) gives the mode and timing settings."""
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
                         "peak_memory": "mx.get_peak_memory, reset before every call"},
              "model_bytes": {"reference": model_bytes(reference),
                              "variant": model_bytes(variant)},
              "kernel": {"reference": kernel(reference), "variant": kernel(variant)},
              "batches": {}, "end_to_end": {}}
    for b, (ts, seq_len) in timing_sets.items():
        r = time_alternating(end_to_end_call(reference, ts),
                             end_to_end_call(variant, ts), warmup=cfg.timing_warmup,
                             rounds=cfg.timing_rounds, min_rounds=cfg.timing_min_rounds,
                             budget_s=cfg.timing_budget_s)
        fwd, e2e = split_regions(r)
        for entry in (fwd, e2e):
            entry["kernel"] = result["kernel"]["variant"]
            entry["batch_size"] = len(ts)
            entry["seq_len"] = seq_len
        result["batches"][str(b)] = fwd
        result["end_to_end"][str(b)] = e2e
    return result


def cold_start_spec(sweep, timing_sets, family=None, vcfg=None):
    """The :func:`variants.coldstart.run_spec` spec of ``sweep``'s reference (``vcfg`` None) or
    of variant ``vcfg`` of ``family``: the smallest timed batch, the cached head, and the
    :class:`BuildInputs` fields the family's build reads."""
    b = min(timing_sets)
    from variants.sweep_inputs import checkpoint_path

    source = sweep.cfg.resolve_model()
    ck = checkpoint_path(sweep.cfg, source)
    spec = {"model": source, "checkpoint": None if ck is None else str(ck),
            "taskset": timing_sets[b][0], "device": sweep.cfg.device, "dtype": sweep.cfg.dtype,
            "head_path": str((sweep.cache / "heads" / f"{sweep.cfg.model}-{sweep.head_key}.npz")
                             .resolve())}
    if vcfg is not None:
        spec.update(family=sweep.cfg.family, params=dict(sweep.cfg.params), variant=vcfg.name,
                    mode=sweep.cfg.speed_mode, calibration=sweep.tasksets["calibration"],
                    cache_dir=str(sweep.cache.resolve()),
                    fit=sweep.tasksets["fit"] if "fit" in family.inputs else None)
    return spec

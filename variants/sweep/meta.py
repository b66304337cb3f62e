"""run.json's content: what a sweep ran, with which versions and settings, and how it ended."""

import platform
from dataclasses import asdict

import mlx.core as mx

from variants import BLAS_INFO, __version__
from variants.runtime import device, parallel
from variants.runtime.cpu import cpu_info
from variants.sweep.timing import model_bytes
from variants.checkpoints.special_tokens import count_special_only, special_only_ids


def _versions():
    import numpy
    import sklearn
    import tokenizers

    return {"mlx": mx.__version__, "numpy": numpy.__version__, "sklearn": sklearn.__version__,
            "tokenizers": tokenizers.__version__, "python": platform.python_version(),
            "mlx_variants": __version__, "platform": platform.platform()}


def _ort_record(cfg):
    """run.json's ``onnxruntime``: version, execution provider, graph optimisation level(s) and
    intra-op threads of the onnx family's sessions (:mod:`variants.onnx.session`)."""
    from variants.onnx.session import OPT_LEVELS, cores, ort

    return {"version": ort().__version__, "providers": ["CPUExecutionProvider"],
            "graph_optimization_level": sorted({OPT_LEVELS[v.opt_level] for v in cfg.variants}),
            "intra_op_num_threads": cores(), "inter_op_num_threads": 1}


def _reference_fit(model):
    from variants.models import fitted_state

    rec = model.fitted_record
    return None if rec is None else dict(rec, file=fitted_state.RUN_FILE)


def run_metadata(sweep):
    """run.json's content for a :class:`variants.sweep.run.Sweep` that has prepared its inputs and
    reference: identity, config (with the variant names), contract, versions, device, checkpoint,
    data splits and tokenizer, reference size, fitted state (``reference_fit``) and
    temperatures, status ("complete", "partial" or "failed" by the variants that failed to build), the family's report blocks (``extras``) and
    the sweep's time breakdown (:meth:`variants.sweep.clock.SweepClock.breakdown`, taken now) and
    the reference's segment profile (:func:`variants.sweep.ref_profile.reference_profile`).
    Documented in results/README.md."""
    cfg = sweep.cfg
    d = asdict(cfg)
    d["variants"] = [v.name for v in cfg.variants]
    breakdown = sweep.clock.breakdown()
    failed = dict(getattr(sweep, "failed", {}))
    return {
        "identity": cfg.identity(),
        "config": d,
        "contract": sweep.contract.name,
        "versions": _versions(),
        # --family onnx: the runtime that computes the variants (its version and settings)
        **({"onnxruntime": _ort_record(cfg)} if cfg.family == "onnx" else {}),
        "blas": dict(BLAS_INFO),
        "device": cfg.device,  # what --device / $VARIANTS_DEVICE chose and variants.runtime.device.use set
        "dtype": cfg.dtype,
        "device_info": dict(device.key_part(), mlx_device=str(mx.default_device())),
        "cpu": cpu_info(),  # model, vector ISA, oneDNN's ISA and int8 scheme (runtime/cpu.py)
        "checkpoint": {"path": str(sweep.checkpoint.path), "sha256": sweep.checkpoint.sha256},
        "model": cfg.resolve_model().describe(),
        "data": {
            "source": ("VADER ICWSM 2014 ground truth (data/vader, MIT)" if cfg.data is None
                       else str(cfg.data)),
            "file": None if cfg.data is None else {
                "path": str(cfg.data),
                "fingerprint": cfg.inputs_identity.get("data_fingerprint")},
            "splits": {s: {"n": len(ts), "fingerprint": ts.fingerprint()}
                       for s, ts in sweep.tasksets.items()},
            "truncated_texts": sweep.truncated,
            # kept and judged like any other row, but counted: the model saw no text at all
            "special_only_texts": {s: count_special_only(ts.texts, sweep.checkpoint.tokenizer)
                                   for s, ts in sweep.tasksets.items()},
            "special_only_ids": {s: special_only_ids(ts, sweep.checkpoint.tokenizer)
                                 for s, ts in sweep.tasksets.items()},
            "max_tokens": sweep.checkpoint.tokenizer.max_length,
            "tokenizer": sweep.checkpoint.tokenizer.settings(),
        },
        "reference_model_bytes": model_bytes(sweep.ref_model),
        # where the reference's head and temperatures came from, and their hash
        # (variants.models.fitted_state); the state itself is in reference/fitted.npz
        "reference_fit": _reference_fit(sweep.ref_model),
        "temperatures": {str(k): v for k, v in sweep.ref_model.temperatures.items()},
        # the reference against itself on a second compute path (variants.sweep.noise)
        "reference_noise": getattr(sweep, "ref_noise", None),
        "temperature_fits": {str(k): v for k, v in getattr(sweep.ref_model, "temperature_fits", {}).items()},
        "wall_s": breakdown["wall_s"],
        "reused_variants": sweep.reused,
        "reference_outputs_from_cache": dict(sweep.ref_outputs_cached),
        "cold_start": sweep.cold_start,
        "parallel": parallel.info(),
        "status": ("complete" if not failed else
                   "partial" if len(failed) < len(cfg.variants) else "failed"),
        "failed_variants": failed,
        "extras": dict(getattr(sweep, "extras", {})),
        "sweep_time": breakdown,
        # the reference forward's segments and Amdahl ceilings (variants.sweep.ref_profile)
        "segment_profile": getattr(sweep, "segment_profile", None),
        # --executor process|ray only (variants.sweep.quality): a local run.json is unchanged
        **({"executor": {"kind": ex.kind, "workers": ex.workers,
                         "ray_address": getattr(ex, "address", None),
                         "ran": "quality passes; timing and cold starts in the sweep's process"}}
           if (ex := getattr(sweep, "executor", None)) is not None and ex.kind != "local"
           else {}),
    }

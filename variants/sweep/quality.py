"""A sweep variant's quality pass (build in the quality mode, outputs on the calibration and eval
splits), in the sweep's process or as an executor unit (``variants sweep --executor process|ray
--workers N``, :mod:`variants.executors`).

With a process or Ray executor every variant that is not reused runs its quality pass on the
workers first, ``workers`` at a time (:func:`premeasure`); each worker loads the inputs from
paths (:func:`init_worker`: the validated config, the reference's fitted head from the cache the
sweep wrote before, the prepared batches) and refuses a config whose identity is not the
sweep's. Then the sweep goes through the variants in order as it always does: the speed mode
build, the timing (strict A/B alternation against the reference) and the cold starts run in the
sweep's own process, after the workers have stopped, so no variant is timed while another
computes on the same machine. The outputs are the same as the local pass's: the same builder,
the same batches, the driver's MLX stream count in each worker.
"""

import time
from dataclasses import asdict, fields
from pathlib import Path

SPLITS = ("calibration", "eval")
PATHS = ("results_dir", "contract", "model_config", "checkpoint", "data")


def quality_outputs(sweep, family, vcfg):
    """``(outs, info)`` of ``vcfg``: ``outs`` {split: DecisionOutputs}, ``info`` the builder's
    dict with the config, modes, ``quality_wall_s`` and the family's ``outputs_info`` (the
    keys in build.json's order). From :func:`premeasure`'s results when there, else built and
    run here. Raises the builder's ValueError (a variant that cannot be built)."""
    from variants.families.family import judged_mode

    cfg = sweep.cfg
    mode = judged_mode(family, cfg, vcfg)
    done = getattr(sweep, "premeasured", {}).pop(vcfg.name, None)
    t0 = time.perf_counter()
    if done is None:
        with sweep.clock("variant_build"):
            var_model, info = family.build(sweep.ref_model, vcfg, sweep._inputs(family),
                                           mode=mode)
    else:
        _raise(done)
        info = done["info"]
    sweep.clock.counts["variants_built"] += 1
    info.update(config=asdict(vcfg), family=cfg.family, quality_mode=mode,
                speed_mode=cfg.speed_mode)
    if done is None:
        with sweep.clock("variant_forward"):
            outs = {split: sweep._outputs(var_model, split, vcfg.name) for split in SPLITS}
        info["quality_wall_s"] = time.perf_counter() - t0
    else:
        outs, info["quality_wall_s"] = done["outputs"], done["wall_s"]
    sweep.clock.counts["variant_output_batches"] += sum(len(sweep.batches[s]) for s in SPLITS)
    if family.outputs_info is not None:  # e.g. the student's eval fallback rate
        info.update(family.outputs_info(info, outs))
    return outs, info


def _raise(done):
    """Re-raise a worker's build error as the local pass would have raised it."""
    if "value_error" not in done:
        return
    from runs.readers import CorruptFileError

    if done.get("corrupt"):
        raise CorruptFileError(*done["corrupt"])
    raise ValueError(done["value_error"])


def payload(cfg):
    """What a worker needs (plain data): the config's keywords (paths made absolute, as a Ray
    worker's working directory is not the sweep's; no progress bars) and its identity."""
    kw = {f.name: getattr(cfg, f.name) for f in fields(cfg)
          if f.name not in ("variants", "inputs_identity")}
    for k in PATHS:
        if kw.get(k) is not None and Path(kw[k]).exists():
            kw[k] = str(Path(kw[k]).resolve())
    kw["progress"] = False
    return {"cfg": kw, "identity": _plain(cfg.identity())}


def _reference_sha256(sweep):
    return (getattr(sweep.ref_model, "fitted_record", None) or {}).get("sha256")


def _plain(x):
    import json

    return json.loads(json.dumps(x, default=str))


def init_worker(payload):
    """A worker's state: the validated config (its identity must be the sweep's), the fitted
    reference (from the cache), the splits and their prepared batches. Raises RuntimeError on
    another identity."""
    from variants.families import get_family
    from variants.models import fitted_reference
    from variants.runtime import device
    from variants.sweep.config import SweepConfig
    from variants.sweep.inputs import cache_parts, load_inputs

    cfg = SweepConfig(**payload["cfg"]).validate()
    device.use(cfg.device or device.requested(), cfg.dtype)
    _, checkpoint, tasksets = load_inputs(cfg)
    mine = _plain(cfg.identity())
    if {k: v for k, v in mine.items() if k not in PATHS} != \
            {k: v for k, v in payload["identity"].items() if k not in PATHS}:
        raise RuntimeError("a sweep worker's inputs are not the sweep's (identity differs)")
    cache = Path(cfg.results_dir) / ".cache"
    ref, _ = fitted_reference(cfg.resolve_model(), checkpoint, tasksets, cache,
                              log=lambda m: None, extra_key=cache_parts(cfg))
    from variants.models.fitted_state import check_same_head

    check_same_head(ref, payload.get("reference_sha256"), "sweep")
    batches = {s: ref.prepare(tasksets[s], cfg.batch_size)[0] for s in SPLITS}
    return {"cfg": cfg, "ref": ref, "tasksets": tasksets, "batches": batches, "cache": cache,
            "family": get_family(cfg.family)}


def run_variant(state, spec):
    """One variant's quality pass on a worker: ``{"outputs": {split: DecisionOutputs}, "info",
    "wall_s"}``, or ``{"value_error": message, "corrupt": (path, kind, problem) or None}`` when
    its build raises ValueError (the sweep re-raises it at the variant's turn)."""
    from runs.readers import CorruptFileError
    from variants.families.family import BuildInputs, judged_mode

    cfg, family, ts = state["cfg"], state["family"], state["tasksets"]
    t0 = time.perf_counter()
    inputs = BuildInputs(calibration=ts["calibration"], fit=ts["fit"],
                         cache_dir=state["cache"]).only(family.inputs)
    try:
        model, info = family.build(state["ref"], spec["vcfg"], inputs,
                                   mode=judged_mode(family, cfg, spec["vcfg"]))
    except CorruptFileError as e:
        return {"value_error": str(e), "corrupt": (str(e.path), e.kind, e.problem)}
    except ValueError as e:
        return {"value_error": str(e), "corrupt": None}
    outs = {s: model.outputs(ts[s], state["batches"][s]) for s in SPLITS}
    return {"outputs": outs, "info": info, "wall_s": time.perf_counter() - t0}


def premeasure(sweep):
    """Run the quality pass of every variant without a complete folder on ``sweep.executor``
    (nothing to do when it is None or local); the results wait in ``sweep.premeasured`` for
    :func:`quality_outputs`. The wall time counts as ``variant_forward``. A variant whose worker
    died twice is built again here, at its turn."""
    ex = getattr(sweep, "executor", None)
    sweep.premeasured = {}
    if ex is None or ex.kind == "local":
        return
    files = ("outputs.npz", "calibration_outputs.npz", "build.json", "timing.json")
    todo = [v for v in sweep.cfg.variants
            if not all((sweep.out / v.name / f).exists() for f in files)]
    if not todo:
        return

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc="quality passes", unit="variant",
               disable=not sweep.cfg.progress)

    def on_result(i, spec, res):
        bar.update(1)
        if "error" not in res:  # lost twice: quality_outputs builds it in this process
            sweep.premeasured[spec["vcfg"].name] = res

    sweep.log(f"quality pass of {len(todo)} variant(s) on {ex.workers} {ex.kind} worker(s); "
              "timing follows here, one variant at a time")
    with sweep.clock("variant_forward"), ex, bar:
        ex.run(init_worker, (dict(payload(sweep.cfg), reference_sha256=_reference_sha256(sweep)),),
               run_variant,
               [{"vcfg": v} for v in todo], on_result)

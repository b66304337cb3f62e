"""Resume checks: before a sweep writes anything, the run folder it would resume must hold the
same sweep (identity, tokenizer settings, the reference's fitted state) and each variant folder
the same variant, in files that are not corrupt (read with the validating readers of :mod:`runs.readers` and
:mod:`runs.npz_readers`); a resumed variant's timing.json gets what it lacks measured
(:func:`complete_reused_timing`)."""

import json
import time
from dataclasses import asdict
from pathlib import Path

from metrics._checks import short_repr
from runs.io import write_json
from runs.judge import require_family
from runs.npz_readers import check_same_ids, read_outputs
from runs.readers import read_build, read_run_json, read_timing
from variants.sweep.config import SweepError
from variants.sweep.cold_variant import variant_cold_start


def read_json(path):
    """run.json as a dict; {} when missing (CorruptFileError when corrupt, see prepare())."""
    path = Path(path)
    return read_run_json(path) if path.exists() else {}


def check_run_tokenizer(out, settings):
    """Refuse to resume ``out`` when its run.json records other tokenizer settings
    (``data.tokenizer``, e.g. another max length) than ``settings``
    (:meth:`variants.checkpoints.load.TextTokenizer.settings`): its variant outputs hold other token
    ids. Raises SweepError naming the settings that differ."""
    saved = read_json(out / "run.json")
    old = saved.get("data", {}) if isinstance(saved, dict) else {}
    old = old.get("tokenizer") if isinstance(old, dict) else None
    new = settings
    if isinstance(old, dict) and old.get("fingerprint") not in (None, new["fingerprint"]):
        diff = {k: (old.get(k), v) for k, v in json.loads(json.dumps(new)).items()
                if old.get(k) != v}
        raise SweepError(f"{out} was swept with other tokenizer settings {diff} (old, "
                         f"new); choose another --run name or delete {out}")


def check_reference_fit(out, meta, record):
    """Refuse to resume ``out`` when its run.json (``meta``) records another reference head
    and temperatures (``reference_fit.sha256``) than ``record`` (the reference's
    ``fitted_record`` now): its variants were judged against another reference. Raises
    SweepError naming both hashes and the fix."""
    old = (meta or {}).get("reference_fit") if isinstance(meta, dict) else None
    if isinstance(old, dict) and record and old.get("sha256") not in (None, record["sha256"]):
        raise SweepError(f"{out} was swept with another reference head and temperatures "
                         f"(sha256 {str(old['sha256'])[:16]}…, {old.get('source')}; now "
                         f"{record['sha256'][:16]}…, {record['source']}); choose another --run "
                         f"name or delete {out}")


def _diff(old, new, prefix=""):
    """{dotted key: (old, new)} of the values that differ, descending into dicts both sides
    hold (an edited TOML names its changed key, not both whole TOMLs). At the top, only the
    keys ``new`` has (an older run.json may hold keys no longer written)."""
    out = {}
    for k in dict.fromkeys([*old, *new]) if prefix else new:
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(_diff(a, b, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = (a, b)
    return out


def check_run_folder(out, cfg, tasksets):
    """Refuse to resume ``out`` when its run.json's identity (:meth:`SweepConfig.identity`)
    differs from ``cfg``'s, or a variant folder holds another variant
    (:func:`check_variant_folders`). Raises SweepError (CorruptFileError for a corrupt file)."""
    run_json = out / "run.json"
    if run_json.exists():
        meta = read_run_json(run_json)  # CorruptFileError: exit 2
        old = dict(meta.get("identity", {}))
        # runs from before --device: the device run.json recorded ("Device(cpu, 0)"), float32
        old.setdefault("device", "gpu" if "gpu" in str(meta.get("device", "cpu")) else "cpu")
        old.setdefault("dtype", "float32")
        new = json.loads(json.dumps(cfg.identity()))
        diff = _diff(old, new)
        if diff:
            why = ""
            if "quality_mode" in diff and getattr(cfg, "_quality_follows_speed", False):
                why = (f" (its variants are judged on the model they time, in {cfg.speed_mode} "
                       "mode: W8A8 Linears; that folder judged them otherwise)")
            raise SweepError(
                f"{out} holds a sweep with other settings {diff} (old, new){why}; "
                f"choose another --run name or delete {out}")
    check_variant_folders(out, cfg.variants, tasksets)

def check_variant_folders(out, variants, tasksets):
    """Each of ``variants``' folders in ``out`` about to be resumed must hold the variant this sweep asks for, in
    files that are not corrupt.

    Every saved file the resume reads (outputs.npz, calibration_outputs.npz, build.json,
    timing.json) is read with its validating reader (:mod:`runs.readers`,
    :mod:`runs.npz_readers`) here, before anything is written: a corrupt one raises
    CorruptFileError naming it (delete it and rerun; only that variant is rebuilt), outputs
    of another split size raise SweepError.
    Folder names encode a variant's parameters only approximately (an exit threshold of
    0.1234 and one of 0.1231 both give ``t0.123``), so the config its build.json recorded
    (``config``, the variant dataclass as built) is compared with the requested one. Fields
    only one side has (an older build.json, a field added since) are not compared.
    """
    for vcfg in variants:
        vdir = out / vcfg.name
        for f, split in (("outputs.npz", "eval"), ("calibration_outputs.npz", "calibration")):
            if (vdir / f).exists():
                ids = read_outputs(vdir / f)["ids"]
                n, want = len(ids), len(tasksets[split])
                if n != want:
                    raise SweepError(f"{vdir / f} holds {n} {split} examples, this sweep "
                                     f"uses {want}; delete {vdir} or choose another --run")
                check_same_ids(vdir / f, ids, tasksets[split].ids, f"this sweep's {split} split")
        if (vdir / "timing.json").exists():
            read_timing(vdir / "timing.json")
        build_json = vdir / "build.json"
        if not build_json.exists():
            continue
        build = read_build(build_json)
        if (vdir / "timing.json").exists():
            require_family(build_json, build)
        old = build.get("config")
        if not isinstance(old, dict):
            continue
        new = json.loads(json.dumps(asdict(vcfg)))
        diff = {k: (old[k], v) for k, v in new.items() if k in old and old[k] != v}
        if diff:
            fields = "; ".join(f"{k}: saved {short_repr(a)}, requested {short_repr(b)}"
                               for k, (a, b) in diff.items())
            raise SweepError(
                f"variant {vcfg.name}: {build_json} was built with other settings ({fields})"
                f"; resuming would reuse the wrong variant. Choose another --run name or "
                f"delete {build_json.parent}")


def complete_reused_timing(sweep, family, vcfg, timing_sets, path):
    """Measure what the timing.json at ``path`` of a reused variant (``vcfg`` of ``family``)
    lacks for ``sweep`` (a :class:`variants.sweep.run.Sweep` with its reference ready): batch sizes
    of ``timing_sets`` ({B: (TaskSet, seq_len)}) without forward or end-to-end timing, the
    family's extra fields its ``extra_stale`` calls stale, the cold start under
    ``--cold-start all``. An earlier forward measurement is kept; the file is rewritten
    (atomically) only when something was added."""
    cfg = sweep.cfg
    timing = read_timing(path)
    sizes = list(dict.fromkeys(cfg.timing_batch_sizes))
    missing = [b for b in sizes if str(b) not in timing.get("batches", {})
               or str(b) not in timing.get("end_to_end", {})]
    changed = retime = False
    variant_kernel = str((timing.get("kernel") or {}).get("variant", ""))
    if "dnnl" in variant_kernel:  # timed on the compiled int8 GEMM: this CPU's scheme / ISA?
        from variants.runtime.int8_linear import int8_record

        now = int8_record(variant_kernel)
        if timing.get("int8") != now:
            # one timing.json holds one kernel's times: every batch size is timed again
            sweep.log(f"{vcfg.name}: timed with int8 {timing.get('int8')}, now {now}; "
                      "timing every batch size again")
            missing, retime = sizes, True
            timing["batches"], timing["end_to_end"] = {}, {}
    if missing:
        sweep.log(f"{vcfg.name}: timing of batch sizes {missing} incomplete (forward or "
                  "end to end missing); timing them")
        t1 = time.perf_counter()
        new = sweep._time_variant(family, vcfg, {b: timing_sets[b] for b in missing},
                                  extra=False)
        timing.setdefault("batches", {})
        timing.setdefault("end_to_end", {})
        for b in missing:
            # keep an earlier forward measurement; add what is missing
            timing["batches"].setdefault(str(b), new["batches"][str(b)])
            timing["end_to_end"][str(b)] = new["end_to_end"][str(b)]
        for k in ("schema_version", "timed_regions", "method", "model_bytes", "kernel", "int8"):
            if retime:  # every entry is new: so are its kernel and int8 records
                timing[k] = new.get(k)
            else:
                timing.setdefault(k, new.get(k))
        timing["wall_s"] = timing.get("wall_s", 0.0) + time.perf_counter() - t1
        changed = True
    stale = family.extra_stale and family.extra_stale(timing, cfg, vcfg)
    if stale:  # e.g. exact workloads of another --zipf-exponent: measure them again
        sweep.log(f"{vcfg.name}: {stale}; timing them again")
        with sweep.clock("variant_build"):
            var_model, _ = family.build(sweep.ref_model, vcfg, sweep._inputs(family),
                                        mode=cfg.speed_mode)
        with sweep.clock("timing"):
            timing.update(family.time_extra(sweep.ref_model, var_model,
                                            sweep.tasksets["eval"], cfg, vcfg))
        changed = True
    if cfg.cold_start == "all" and "cold_start" not in timing:
        timing["cold_start"] = variant_cold_start(sweep, family, vcfg, timing_sets)
        changed = True
    if changed:
        write_json(path, timing)

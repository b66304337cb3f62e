"""What ``variants export SOURCE`` exports: a run folder and one of its variants, or a search
folder (its winner, judged under ``OUT/final``), rebuilt here from the run's own record
(``run.json``'s config, the variant's ``build.json``) in the packed form a deployment runs.

Bad input raises :class:`ExportError` (exit 2) with one line naming the problem and the fix,
before anything is written.
"""

import json
from dataclasses import dataclass, fields
from pathlib import Path

from metrics._checks import short_path, short_repr
from variants.export import EXPORTABLE, NOT_EXPORTABLE


class ExportError(ValueError):
    """Bad input to export or verify (exit 2)."""


@dataclass
class Judged:
    """One judged variant: ``run_dir`` (the sweep's run folder), ``name``, ``vdir`` (its folder),
    ``run`` (run.json), ``build`` (build.json), ``verdict`` (verdict.json), ``search`` (the
    search folder when exported from one, else None)."""

    run_dir: Path
    name: str
    vdir: Path
    run: dict
    build: dict
    verdict: dict
    search: Path | None = None


def _read(path, what, fix):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ExportError(f"{short_path(path)} is missing ({what}); {fix}") from None
    except (OSError, ValueError) as e:
        raise ExportError(f"{short_path(path)} cannot be read ({type(e).__name__}); {fix}") \
            from None


def locate(source, variant=None, allow_fail=False):
    """The :class:`Judged` variant of ``source`` (a run folder with ``variant``, or a search
    folder: its winner). Raises ExportError: no such folder, a search with no winner, an
    unknown variant (listing the run's), a variant without outputs, a family that does not
    export (saying what it is), a FAILED variant without ``allow_fail``."""
    src = Path(source)
    if not src.is_dir():
        raise ExportError(f"SOURCE {short_path(src)} is not a folder; pass a run folder (with "
                          "--variant NAME) or a search folder")
    search = None
    if (src / "search.json").exists():
        res = _read(src / "search.json", "the search's result", "rerun the search")
        winner = res.get("winner")
        if not winner or not res.get("finalists"):
            raise ExportError(f"search {short_path(src)} has no winner judged on eval; export a "
                              "run folder's variant with --variant NAME")
        if variant is not None and variant != winner["name"]:
            raise ExportError(f"--variant {short_repr(variant)}: a search folder exports its "
                              f"winner {winner['name']}; drop --variant or pass the run folder "
                              f"{short_path(src / 'final')}")
        search, src, variant = src, src / "final", winner["name"]
    if not (src / "run.json").exists():
        raise ExportError(f"{short_path(src)} holds no run.json; pass a run folder written by "
                          "variants sweep (or a search folder)")
    run = _read(src / "run.json", "the run's record", "rerun the sweep")
    names = sorted(p.name for p in src.iterdir() if (p / "build.json").exists())
    if variant is None:
        raise ExportError(f"--variant is required for a run folder; choose one of: "
                          f"{', '.join(names) or '(none)'}")
    vdir = src / variant
    if variant == "reference" or not (vdir / "build.json").exists():
        raise ExportError(f"--variant {short_repr(variant)} is not a variant of "
                          f"{short_path(src)}; choose one of: {', '.join(names) or '(none)'}")
    for f in ("outputs.npz", "verdict.json"):
        if not (vdir / f).exists():
            raise ExportError(f"{short_path(vdir)} has no {f}: the variant was not judged; "
                              f"run variants check {short_path(src)} (or rerun the sweep)")
    build = _read(vdir / "build.json", "the variant's build record", "rerun the sweep")
    family = build.get("family", run.get("config", {}).get("family"))
    if family not in EXPORTABLE:
        why = NOT_EXPORTABLE.get(family, "an unknown family")
        raise ExportError(f"{variant}: the {family} family does not export ({why}); export a "
                          f"variant of {', '.join(EXPORTABLE[:-1])} or {EXPORTABLE[-1]}")
    verdict = _read(vdir / "verdict.json", "the variant's verdict", "run variants check")
    if not verdict.get("passed") and not allow_fail:
        raise ExportError(f"{variant} FAILED its contract ({', '.join(verdict.get('failed', []))})"
                          "; pass --allow-fail to export it anyway (the model card says so)")
    return Judged(src, variant, vdir, run, build, verdict, search)


def sweep_config(judged):
    """The :class:`variants.sweep.config.SweepConfig` the run was made with (run.json's
    ``config``), validated; its results dir is the recorded one when it still exists (its
    caches), else the run folder's parent."""
    from variants.families import get_family
    from variants.sweep.config import SweepConfig

    rec = dict(judged.run.get("config", {}))
    family = get_family(rec.get("family", "quant"))
    names = {f.name for f in fields(SweepConfig)} - {"variants", "inputs_identity", "params"}
    kw = {k: v for k, v in rec.items() if k in names}
    model = judged.run.get("model") if isinstance(judged.run.get("model"), dict) else {}
    if kw.get("model_config") is None and model.get("factory"):  # the factory, not its name
        kw["model"] = model["factory"]
    kw["params"] = {k: v for k, v in rec.items() if k in family.params}
    if not Path(kw.get("results_dir") or "").is_dir():
        kw["results_dir"] = str(judged.run_dir.parent)
    kw.update(progress=False, cold_start="none")
    if "timing_batch_sizes" in kw:
        kw["timing_batch_sizes"] = tuple(kw["timing_batch_sizes"])
    return SweepConfig(**kw).validate()


def run_reference(judged, source, checkpoint, log=print):
    """The reference with the run's own head and temperatures (``reference/fitted.npz``, its
    hash checked against run.json's ``reference_fit``), or None for a run from before they were
    kept. Raises ExportError when the file does not hash to run.json's record
    (CorruptFileError when it does not read)."""
    from variants.models import fitted_state as fs

    path = judged.run_dir / fs.RUN_FILE
    rec = judged.run.get("reference_fit")
    if not path.exists() or not isinstance(rec, dict):
        return None
    model = source.build(checkpoint)
    state = fs.read_state(path, model)
    got = fs.state_sha256(state)
    if got != rec.get("sha256"):
        raise ExportError(f"{short_path(path)} hashes {got[:16]}…, run.json's reference_fit "
                          f"says {str(rec.get('sha256'))[:16]}…: not the judged reference; "
                          "restore the file or rerun the sweep")
    fs.apply_state(model, state)
    model.fitted_record = {k: rec.get(k) for k in ("source", "sha256", "from")}
    log(f"reference head and temperatures from {short_path(path)} (sha256 {got[:16]}, "
        f"{rec.get('source')})")
    return model


def _tuples(value):
    """``value`` read from JSON with its lists as tuples again (a frozen config's sequences:
    an exit variant's ``exit_layers``, a pruning ``schedule``; hashable as the sweep built
    them)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def rebuild(judged, log=print):
    """``(cfg, contract, checkpoint, tasksets, reference, variant, info)``: the run's inputs, the
    reference with the run's own head and temperatures (:func:`run_reference`; a run without
    them: from the cache, else fitted again the same way) and the variant built again from its
    ``build.json`` config in the packed (``native``) form."""
    from variants.families import get_family
    from variants.families.family import BuildInputs
    from variants.models import fitted_reference
    from variants.sweep.inputs import cache_parts, load_inputs

    cfg = sweep_config(judged)
    contract, checkpoint, tasksets = load_inputs(cfg)
    cache = Path(cfg.results_dir) / ".cache"
    reference = run_reference(judged, cfg.resolve_model(), checkpoint, log=log)
    if reference is None:
        reference, _ = fitted_reference(cfg.resolve_model(), checkpoint, tasksets, cache,
                                        log=log, extra_key=cache_parts(cfg))
    family = get_family(judged.build["family"])
    vcfg = family.config(**{k: _tuples(v) for k, v in judged.build["config"].items()})
    inputs = BuildInputs(calibration=tasksets["calibration"], fit=tasksets["fit"],
                         cache_dir=cache).only(family.inputs)
    variant, info = family.build(reference, vcfg, inputs, mode="native")
    return cfg, contract, checkpoint, tasksets, reference, variant, info

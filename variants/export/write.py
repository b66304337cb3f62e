"""``variants export``: write a judged variant as an MLX checkpoint folder (:mod:`variants.export`
says what it holds). Everything is written into a temporary sibling folder and renamed into
place at the end, so a failed export leaves nothing behind.
"""

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from metrics._checks import short_path
from variants.export.source import ExportError
from variants.families.artifact import BLOCK, FORMAT_VERSION, write_weights

#: the judged arrays shipped for ``variants verify``: destination -> file in the run folder
JUDGED = {"outputs.npz": "{variant}/outputs.npz",
          "judged/calibration_outputs.npz": "{variant}/calibration_outputs.npz",
          "judged/reference_outputs.npz": "reference/outputs.npz",
          "judged/reference_calibration_outputs.npz": "reference/calibration_outputs.npz"}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_out(out):
    """Raise ExportError unless ``out`` is absent or an empty folder, and a folder can be made
    where it goes (tried with a temporary folder in its nearest existing parent, removed at
    once: a read-only or virtual file system such as /proc or /sys, a parent that is a file),
    so that a bad ``--out`` is refused before the variant is built."""
    from metrics._checks import short_repr
    from runs.names import control_problem

    if not str(out).strip():  # Path("") is the current folder
        raise ExportError("--out is empty; pass a new folder")
    if control_problem(out):
        raise ExportError(f"--out {short_repr(str(out))} {control_problem(out)}; pass a plain "
                          "path")
    out = Path(out)
    if out.name in ("", ".."):  # "/", ".", "..": no new folder's name
        raise ExportError(f"--out {short_path(out)} names no new folder; pass a new folder, "
                          "e.g. --out shipped/model")
    if out.is_file():
        raise ExportError(f"--out {short_path(out)} is a file; pass a new folder (export never "
                          "overwrites)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {short_path(out)} is not empty; pass a new folder (export "
                          "never overwrites)")
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".export-check-", dir=parent))
    except OSError as e:
        raise ExportError(f"--out {short_path(out)}: cannot create the folder in {parent} "
                          f"({e.strerror or type(e).__name__}); pass a writable folder") from None


def save_taskset(ts, path):
    """The TaskSet's arrays as an .npz (no pickles): what verify runs the model on."""
    arrays = {k: np.asarray(getattr(ts, k)) for k in ("ids", "task", "texts", "option_texts",
                                                     "option_mask", "option_scores",
                                                     "action_map", "labels", "human_dist")}
    arrays["ids"] = arrays["ids"].astype(str)
    arrays["action_names"] = np.asarray(list(ts.action_names), dtype=str)
    if ts.questions is not None:
        arrays["questions"] = np.asarray(ts.questions, dtype=str)
    np.savez(path, **arrays)


def load_taskset(path):
    """The TaskSet :func:`save_taskset` wrote."""
    from variants.datasets.tasks import TaskSet

    with np.load(path, allow_pickle=False) as z:
        d = {k: z[k] for k in z.files}
    return TaskSet(ids=d["ids"], task=d["task"], texts=d["texts"],
                   option_texts=d["option_texts"], option_mask=d["option_mask"],
                   option_scores=d["option_scores"], action_map=d["action_map"],
                   action_names=tuple(d["action_names"].tolist()), labels=d["labels"],
                   human_dist=d["human_dist"], questions=d.get("questions"))


def versions():
    from importlib import metadata

    import mlx.core as mx

    try:
        pkg = metadata.version("mlx-variants")
    except metadata.PackageNotFoundError:
        pkg = "unknown"
    return {"mlx-variants": pkg, "mlx": mx.__version__, "numpy": np.__version__}


def half_scales(path):
    """The half-precision dtypes (``float16``, ``bfloat16``; sorted) of the ``*.scales`` arrays
    in safetensors file ``path`` ([] when all are float32 or there are none)."""
    import mlx.core as mx

    found = {str(v.dtype).rpartition(".")[2] for k, v in mx.load(str(path)).items()
             if k.endswith("scales")}
    return sorted(found & {"float16", "bfloat16"})


def _reference_fit(judged, reference, tmp):
    """Write the reference's head and temperatures the variant was built from into ``tmp``
    (``judged/reference_fitted.npz``); returns the manifest's ``reference_fit`` (``source``,
    ``sha256`` as run.json records it, ``from``, ``file``), or None for a model fitted
    outside :func:`variants.models.fitted_reference`."""
    from runs.io import write_npz
    from variants.models import fitted_state as fs

    if reference.fitted_record is None:
        return None
    run_copy = judged.run_dir / fs.RUN_FILE
    if run_copy.exists() and (judged.run.get("reference_fit") or {}).get("sha256") == \
            reference.fitted_record["sha256"]:
        shutil.copyfile(run_copy, tmp / fs.EXPORT_FILE)
    else:  # a run from before reference/fitted.npz: the state it was rebuilt with
        write_npz(tmp / fs.EXPORT_FILE, fs.state_of(reference))
    return dict(reference.fitted_record, file=fs.EXPORT_FILE)


def export(judged, out, log=print, card=None):
    """Write ``judged`` (:class:`variants.export.source.Judged`) to folder ``out``; returns the
    manifest dict. ``card``: ``card(facts) -> str`` (default
    :func:`variants.export.card.markdown`), the model card's renderer.

    Raises
    ------
    ExportError
        ``out`` not empty; the variant built again is not the judged one (its build record's
        bytes differ).
    """
    from variants.export import card as card_mod
    from variants.export.source import rebuild

    out = Path(out)
    check_out(out)
    cfg, contract, ck, tasksets, reference, variant, info = rebuild(judged, log=log)
    if info.get("model_bytes") != judged.build.get("model_bytes"):
        raise ExportError(f"{judged.name} built again stores {info.get('model_bytes')} bytes, "
                          f"the judged build {judged.build.get('model_bytes')}; rerun the sweep "
                          "with this package version")
    source = cfg.resolve_model()
    tmp = out.with_name(f".{out.name}.export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        config = write_weights(variant, ck, source, tmp, family=judged.build["family"],
                               variant=judged.name, variant_config=judged.build["config"],
                               batch_size=cfg.batch_size, near_tie_margin=cfg.near_tie_margin)
        quant = config.get("quantization")
        from contracts.contract import PACKAGED

        if cfg.contract is None or cfg.contract in PACKAGED:
            from importlib import resources

            text = resources.files("contracts").joinpath(
                f"{cfg.contract or 'default'}.toml").read_text()
        else:
            text = Path(cfg.contract).read_text()
        (tmp / "contract.toml").write_text(text)
        shutil.copyfile(judged.vdir / "verdict.json", tmp / "verdict.json")
        (tmp / "judged").mkdir()
        for dest, src in JUDGED.items():
            shutil.copyfile(judged.run_dir / src.format(variant=judged.name), tmp / dest)
        save_taskset(tasksets["eval"], tmp / "eval_rows.npz")
        reference_fit = _reference_fit(judged, reference, tmp)
        timing = judged.vdir / "timing.json"
        facts = {"name": judged.name, "family": judged.build["family"], "build": judged.build,
                 "verdict": judged.verdict, "run": judged.run, "model": source.name,
                 "kind": source.kind, "contract": contract.name, "n_eval": len(tasksets["eval"]),
                 "timing": json.loads(timing.read_text()) if timing.exists() else None,
                 "bytes": (tmp / "model.safetensors").stat().st_size,
                 "search": str(judged.search) if judged.search else None,
                 "quantization": quant, "lowrank": config[BLOCK]["lowrank"],
                 "reference_fit": reference_fit,
                 "architecture": (config.get("architectures") or [None])[0],
                 "model_type": config.get("model_type"),
                 **{k: config[BLOCK][k] for k in ("names", "kept", "decision_head",
                                                  "input_scaled", "w8a8", "wrapper")},
                 "row_embedding": config[BLOCK].get("row_embedding"),
                 "half_scales": half_scales(tmp / "model.safetensors")}
        (tmp / "README.md").write_text((card or card_mod.markdown)(facts))
        # the model card as the run's self-contained HTML report for this one variant
        # (report.html, and the report.json it embeds); listed in the manifest like every file
        from runs.html import write_html_report

        write_html_report(judged.run_dir, variants=[judged.name], out_dir=tmp)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        manifest = {
            "format_version": FORMAT_VERSION, "variant": judged.name,
            "files": {f: sha256(tmp / f) for f in files},
            "reference_checkpoint_sha256": ck.sha256,
            "data_fingerprint": tasksets["eval"].fingerprint(),
            "reference_fit": reference_fit,
            "run_identity": judged.run.get("identity"),
            "verdict": {"passed": bool(judged.verdict.get("passed")),
                        "failed": judged.verdict.get("failed", [])},
            "versions": versions()}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"exported {judged.name} to {out} ({manifest['files'] and len(manifest['files'])} "
        f"files, model.safetensors {facts['bytes'] / 1e6:.2f} MB)")
    return manifest

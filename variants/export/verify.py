"""``variants verify DIR``: prove an exported folder is the model that was judged.

1. Every file the manifest lists is hashed again (SHA-256); a missing or changed file is bad
   input (exit 2), named with the expected and found hash. A file in the folder that the
   manifest does not list (an emptied ``files`` would otherwise check nothing), or a listed
   path outside the folder, is bad input too. The reference's head and temperatures
   (``judged/reference_fitted.npz``) must hash, array by array
   (:func:`variants.models.fitted_state.state_sha256`), to the manifest's ``reference_fit``
   (what the run's run.json recorded).
2. The folder is loaded packed (:func:`variants.export.load.load_variant`) and run on the judged
   eval rows (``eval_rows.npz``, same batch size and order as the sweep); its logits are
   compared with the judged ``outputs.npz`` (max |Δlogit| over valid options), and the
   contract is judged again with the recomputed eval outputs (the judged calibration outputs
   and reference outputs as before) to see whether any clause's verdict changes.

Exit 0: the files match, max |Δlogit| <= ``tolerance`` x max(1, max |judged logit|) (the
logits' own scale: float32 spacing at a logit of 80, or a regression value of 25,000, is above
any absolute 1e-5) and no verdict changed; 1: the outputs
or a verdict differ; 2: bad input (not an exported folder, a file missing or tampered).
"""

import json
import zipfile
from pathlib import Path

import numpy as np

from metrics._checks import short_path, short_repr
from variants.export.source import ExportError

TOLERANCE = 1e-5


def check_files(folder):
    """The manifest (dict) after checking every listed file's SHA-256 and that every file in
    ``folder`` (but manifest.json) is listed. Raises ExportError naming the first missing,
    changed (expected and found hash) or unlisted file, or a listed path outside ``folder``."""
    from variants.export.write import sha256

    folder = Path(folder)
    mpath = folder / "manifest.json"
    if not mpath.is_file():
        raise ExportError(f"{short_path(folder)} has no manifest.json; pass a folder written by "
                          "variants export")
    try:
        manifest = json.loads(mpath.read_text())
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError):
        raise ExportError(f"{short_path(mpath)} is not a manifest written by variants export; "
                          "export the variant again") from None
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ExportError(f"{short_path(mpath)} names {short_repr(name)}, outside the "
                              "folder; export the variant again")
    for name, want in files.items():
        p = folder / name
        if not p.is_file():
            raise ExportError(f"{short_path(p)} is missing (listed in manifest.json); restore "
                              "it or export the variant again")
        got = sha256(p)
        if got != want:
            raise ExportError(f"{short_path(p)} was changed: manifest.json expects sha256 "
                              f"{want}, found {got}; restore the file or export again")
    for p in sorted(folder.rglob("*")):
        name = p.relative_to(folder).as_posix()
        if p.is_file() and name != "manifest.json" and name not in files:
            raise ExportError(f"{short_path(p)} is not listed in manifest.json, so it is not "
                              "the judged model's; remove it or export the variant again")
    return manifest


def check_reference_fit(folder, manifest):
    """The manifest's ``reference_fit`` after checking that its file's arrays hash to its
    ``sha256`` (None for a folder exported before it was kept). Raises ExportError naming the
    file, both hashes and the fix."""
    from variants.models import fitted_state as fs

    rec = manifest.get("reference_fit")
    if rec is None:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("file"), str):
        raise ExportError(f"{short_path(Path(folder) / 'manifest.json')}: reference_fit is not "
                          "a record of the reference's fitted state; export the variant again")
    path = Path(folder) / rec["file"]
    if Path(rec["file"]).is_absolute() or ".." in Path(rec["file"]).parts or \
            rec["file"] not in manifest.get("files", {}):
        raise ExportError(f"{short_path(Path(folder) / 'manifest.json')}: reference_fit names "
                          f"{short_repr(rec['file'])}, not a file it lists; export the variant "
                          "again")
    state = _read(path, "the reference's fitted state", lambda: fs.read_state(path))
    got = fs.state_sha256(state)
    if got != rec.get("sha256"):
        raise ExportError(f"{short_path(path)} hashes {got[:16]}…, manifest.json's "
                          f"reference_fit (the run's) says {str(rec.get('sha256'))[:16]}…: not "
                          "the judged reference's head and temperatures; export the variant "
                          "again")
    return rec


def _dict(value):
    if not isinstance(value, dict):
        raise ValueError(f"a JSON object was expected, found {type(value).__name__}")
    return value


def _read(path, what, read):
    """``read()``; an unreadable file is ExportError naming ``path`` and the fix."""
    try:
        return read()
    except (ValueError, KeyError, TypeError, OSError, zipfile.BadZipFile) as e:
        raise ExportError(f"{short_path(path)} cannot be read as {what} ({type(e).__name__}: "
                          f"{short_repr(str(e))}); export the variant again") from None


def verify(folder, tolerance=TOLERANCE, log=print):
    """Verify ``folder`` (module docstring). Returns a dict: ``max_abs_dlogit``,
    ``bit_identical``, ``reference_fit`` (the manifest's, its hash checked; None when the
    folder has none), ``changed`` (clause ids whose status differs), ``statuses``
    ({id: [judged, now]}), ``n_rows``, ``tolerance`` (the absolute one applied: ``tolerance``
    x max(1, max |judged logit|)), ``ok``. Raises ExportError (bad input)."""
    from contracts.contract import load_contract
    from runs.judge import judge_outputs
    from runs.npz_readers import OUTPUT_FIELDS
    from runs.outputs import DecisionOutputs
    from variants.checkpoints.files import CheckpointError
    from variants.export.load import load_variant
    from variants.export.write import load_taskset
    from variants.sweep.timed_check import compare

    folder = Path(folder)
    manifest = check_files(folder)
    fit = check_reference_fit(folder, manifest)
    try:
        model, _ = load_variant(folder)
    except CheckpointError as e:
        raise ExportError(str(e)) from None
    config = json.loads((folder / "config.json").read_text())
    ts = _read(folder / "eval_rows.npz", "the judged eval rows",
               lambda: load_taskset(folder / "eval_rows.npz"))
    if ts.fingerprint() != manifest.get("data_fingerprint"):
        raise ExportError(f"{short_path(folder / 'eval_rows.npz')} is not the judged rows "
                          "(data fingerprint differs); export the variant again")
    batches, _ = model.prepare(ts, config["mlx_variants"].get("batch_size", 32))
    now = model.outputs(ts, batches)
    judged = _read(folder / "outputs.npz", "judged outputs",
                   lambda: DecisionOutputs.load(folder / "outputs.npz", "judged outputs"))
    mask = np.asarray(judged.option_mask, bool)
    a, b = np.asarray(now.logits, np.float64), np.asarray(judged.logits, np.float64)
    if a.shape != b.shape or not np.array_equal(np.asarray(now.ids), np.asarray(judged.ids)):
        raise ExportError(f"{short_path(folder / 'outputs.npz')} does not hold the rows of "
                          "eval_rows.npz; export the variant again")
    # NaN or inf logits (weights that overflow) match only the same value: else inf
    dmax = compare(judged, now)["max_abs_dlogit"]
    finite = np.isfinite(b) & mask
    scale = max(1.0, float(np.abs(b[finite]).max()) if finite.any() else 1.0)
    tolerance = tolerance * scale  # relative to the judged logits' scale (module docstring)

    def fields(o):
        return {k: np.asarray(getattr(o, k)) for k in OUTPUT_FIELDS}

    j = folder / "judged"
    def judged_file(name):
        return fields(_read(j / name, "outputs", lambda: DecisionOutputs.load(j / name, "outputs")))

    ref_cal = judged_file("reference_calibration_outputs.npz")
    ref_eval = judged_file("reference_outputs.npz")
    var_cal = judged_file("calibration_outputs.npz")
    contract = load_contract(str(folder / "contract.toml"))
    saved = _read(folder / "verdict.json", "a verdict",
                  lambda: _dict(json.loads((folder / "verdict.json").read_text())))
    from runs.settings import resolve_settings

    settings = resolve_settings(contract, near_tie_margin=config["mlx_variants"].get(
        "near_tie_margin"))
    _, verdict, _ = judge_outputs(ref_cal, ref_eval, var_cal, fields(now), contract,
                                  settings=settings)
    before = {c["id"]: c.get("status") for c in saved.get("clauses", [])}
    statuses = {r.id: [before.get(r.id), r.status] for r in verdict.results}
    changed = [i for i, (x, y) in statuses.items() if x != y]
    res = {"max_abs_dlogit": dmax,
           "bit_identical": bool(np.array_equal(a[mask], b[mask], equal_nan=True)),
           "reference_fit": fit,
           "changed": changed, "statuses": statuses, "n_rows": len(ts),
           "tolerance": tolerance, "ok": dmax <= tolerance and not changed}
    same = "bit-identical" if res["bit_identical"] else f"tolerance {tolerance:g}"
    differ = "" if dmax <= tolerance else f"; outputs differ from {short_path(folder / 'outputs.npz')}"
    log(f"{folder}: {len(manifest['files'])} files match manifest.json; {len(ts)} eval rows "
        f"recomputed: max |Δlogit| {dmax:.3g} ({same}){differ}, "
        f"{'no verdict changed' if not changed else 'verdicts changed: ' + ', '.join(changed)}")
    return res

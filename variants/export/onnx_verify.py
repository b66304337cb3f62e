"""``variants verify DIR`` for a folder written by ``variants export --format onnx``: prove
``model.onnx`` computes the logits that were judged, here, and that the verdict holds.

1. Every file the manifest lists is hashed again (:func:`variants.export.verify.check_files`).
2. ``model.onnx`` runs in ONNX Runtime (:func:`variants.onnx.session.make_session`) on the
   judged eval batches as they were fed (``judged/eval_inputs.npz``: same rows, same batches);
   its logits are compared with the judged ones (``judged/outputs.npz``, max |Δlogit| over valid
   options, relative to the logits' scale as the MLX verify does).
3. The contract (``contract.toml``) is judged again on the recomputed eval outputs (with the
   judged calibration outputs and the reference's), to see whether any clause's status changes.

Exit 0: the files match, max |Δlogit| within tolerance and no verdict changed; 1: the outputs or
a verdict differ (on another CPU ONNX Runtime's float kernels may round differently: the report
names this machine's CPU); 2: bad input.
"""

import json
from pathlib import Path

import numpy as np

from metrics._checks import short_path
from variants.export.source import ExportError


def is_onnx_folder(folder):
    """True when ``folder``'s manifest.json says ``"format": "onnx"``."""
    try:
        return json.loads((Path(folder) / "manifest.json").read_text()).get("format") == "onnx"
    except (OSError, ValueError, AttributeError):
        return False


def _batches(path):
    data = np.load(path)
    k = 0
    while f"index_{k}" in data:
        yield (data[f"index_{k}"], data[f"input_ids_{k}"], data[f"attention_mask_{k}"],
               data[f"token_type_ids_{k}"])
        k += 1


def verify_onnx(folder, tolerance, log=print):
    """Verify an ONNX folder (module docstring). Returns the dict :func:`variants.export.verify.
    verify` returns (``max_abs_dlogit``, ``bit_identical``, ``changed``, ``statuses``,
    ``n_rows``, ``tolerance``, ``ok``; ``reference_fit`` None). Raises ExportError (bad
    input)."""
    from contracts.contract import load_contract
    from runs.action_map import recover_action_map
    from runs.judge import judge_outputs
    from runs.judge_file import outputs_from_logits
    from runs.npz_readers import OUTPUT_FIELDS
    from runs.outputs import DecisionOutputs
    from runs.settings import resolve_settings
    from variants.export.verify import check_files
    from variants.onnx.session import feeds, make_session
    from variants.runtime.cpu import cpu_info

    folder = Path(folder)
    manifest = check_files(folder)
    j = folder / "judged"
    try:
        judged = DecisionOutputs.load(j / "outputs.npz", "judged outputs")
        fields = {n: {k: np.asarray(getattr(o, k)) for k in OUTPUT_FIELDS} for n, o in (
            (n, DecisionOutputs.load(j / f"{n}.npz", n)) for n in (
                "calibration_outputs", "reference_outputs", "reference_calibration_outputs"))}
    except (OSError, ValueError, KeyError) as e:
        raise ExportError(f"{short_path(j)}: the judged outputs cannot be read "
                          f"({type(e).__name__}); export the variant again") from None
    session = make_session(folder / "model.onnx")
    facts = json.loads((folder / "onnx.json").read_text())
    output = facts["graph_output"]
    logits = np.full(np.shape(judged.logits), np.nan, np.float32)
    n_rows = 0
    for index, ids, mask, types in _batches(j / "eval_inputs.npz"):
        y = session.run([output], feeds(session, ids, mask, types))[0]
        logits[index] = np.asarray(y, np.float32)[:, :logits.shape[1]]
        n_rows += len(index)
    if n_rows != len(logits):
        raise ExportError(f"{short_path(j / 'eval_inputs.npz')} holds {n_rows} rows, the judged "
                          f"outputs {len(logits)}; export the variant again")
    ref = fields["reference_outputs"]
    now = outputs_from_logits(ref, logits, recover_action_map(ref))
    mask_ = np.asarray(judged.option_mask, bool)
    a, b = np.asarray(now.logits, np.float64), np.asarray(judged.logits, np.float64)
    diff = np.where(mask_, np.abs(a - b), 0.0)
    dmax = float(np.nanmax(diff)) if diff.size else 0.0
    finite = np.isfinite(b) & mask_
    tol = tolerance * max(1.0, float(np.abs(b[finite]).max()) if finite.any() else 1.0)
    contract = load_contract(str(folder / "contract.toml"))
    saved = json.loads((folder / "verdict.json").read_text())
    _, verdict, _ = judge_outputs(fields["reference_calibration_outputs"], ref,
                                  fields["calibration_outputs"],
                                  {k: np.asarray(getattr(now, k)) for k in OUTPUT_FIELDS},
                                  contract, settings=resolve_settings(
                                      contract, near_tie_margin=facts.get("near_tie_margin")))
    before = {c["id"]: c.get("status") for c in saved.get("clauses", [])}
    statuses = {r.id: [before.get(r.id), r.status] for r in verdict.results}
    changed = [i for i, (x, y) in statuses.items() if x != y]
    res = {"max_abs_dlogit": dmax, "bit_identical": bool(np.array_equal(a[mask_], b[mask_])),
           "reference_fit": None, "changed": changed, "statuses": statuses, "n_rows": n_rows,
           "tolerance": tol, "ok": dmax <= tol and not changed}
    same = "bit-identical" if res["bit_identical"] else f"tolerance {tol:g}"
    log(f"{folder}: {len(manifest['files'])} files match manifest.json; model.onnx run by ONNX "
        f"Runtime on {n_rows} judged eval rows ({cpu_info()['model']}): max |Δlogit| {dmax:.3g} "
        f"({same}), {'no verdict changed' if not changed else 'verdicts changed: ' + ', '.join(changed)}")
    return res

"""``variants export --format onnx``: a judged model as one ONNX graph, judged again as it runs in
ONNX Runtime, so its verdict travels with the file.

What is written (the folder must not exist or be empty; written beside it and renamed into
place, nothing half-written):

- ``model.onnx``: the whole decision module (:func:`variants.onnx.graph.decision_graph`: the
  encoder, the model's pooling and head) built from the MLX arrays of the judged model — the
  reference (``--variant reference``), or a quant / W8A8 / low-rank variant rebuilt from its
  build.json (:func:`variants.export.source.rebuild`): fp32 Linears as MatMul, 2- and 4-bit
  affine as ``MatMulNBits``, other formats dequantized in the graph bit for bit, W8A8 as
  per-token uint8 codes and ``MatMulInteger`` u8 x u8 (:mod:`variants.onnx.linear_nodes`);
- ``verdict.json``: the contract's verdict on **the graph's own logits**, computed by ONNX
  Runtime on the run's calibration and eval rows and judged as every variant is
  (:func:`runs.judge_file.judge_file`; the run gains the variant ``<name>-onnx``), and
  ``judged/onnx_logits.npz`` (those logits, by row id), ``judged/eval_inputs.npz`` (the eval
  batches' token inputs), the graph's and the reference's decision outputs
  (``judged/outputs.npz``, ``calibration_outputs.npz``, ``reference_outputs.npz``,
  ``reference_calibration_outputs.npz``): what ``variants verify`` recomputes and judges again
  (:mod:`variants.export.onnx_verify`);
- ``mlx_verdict.json``: the MLX model's verdict as the sweep judged it, with the largest
  |Δlogit| between the two on the eval rows (``onnx.json``);
- the tokenizer files, ``contract.toml``, ``manifest.json`` (SHA-256 of every file), and a
  ``README.md`` model card saying how to run it.
"""

import json
import shutil
from pathlib import Path

import numpy as np

from metrics._checks import short_path
from variants.export.source import ExportError, Judged, locate, rebuild, run_reference, \
    sweep_config
from variants.export.write import check_out, sha256, versions

#: families whose modules the ONNX graph builders take (prune / exit move tokens or rows)
ONNX_FAMILIES = ("quant", "w8a8", "lowrank")


def _refuse_family(name, family):
    from variants.families.artifact import EXPORTABLE

    if family not in ONNX_FAMILIES:
        raise ExportError(f"{name}: --format onnx exports the reference and "
                          f"{', '.join(ONNX_FAMILIES)} variants, not the {family} family"
                          + ("; export it as an MLX folder (drop --format)"
                             if family in EXPORTABLE else ""))


def _locate_onnx(source, variant):
    """:func:`variants.export.source.locate` for ``--format onnx``: a family the graph builders
    do not take is refused first (one line), before the verdict (the caller checks that)."""
    build = Path(source) / str(variant) / "build.json"
    if variant is not None and build.is_file():
        try:
            family = json.loads(build.read_text()).get("family")
        except ValueError:
            family = None
        if isinstance(family, str):
            _refuse_family(variant, family)
    judged = locate(source, variant, allow_fail=True)
    _refuse_family(judged.name, judged.build.get("family"))
    return judged


def _reference_judged(source):
    src = Path(source)
    if not (src / "run.json").exists():
        raise ExportError(f"{short_path(src)} holds no run.json; pass a run folder written by "
                          "variants sweep with --variant reference")
    run = json.loads((src / "run.json").read_text())
    family = (run.get("config") or {}).get("family", "quant")
    return Judged(src, "reference", src / "reference", run, {"family": family, "config": {}},
                  {"passed": True, "failed": []})


def _rebuild_reference(judged, log):
    from variants.models import fitted_reference
    from variants.sweep.inputs import cache_parts, load_inputs

    cfg = sweep_config(judged)
    contract, checkpoint, tasksets = load_inputs(cfg)
    reference = run_reference(judged, cfg.resolve_model(), checkpoint, log=log)
    if reference is None:
        reference, _ = fitted_reference(cfg.resolve_model(), checkpoint, tasksets,
                                        Path(cfg.results_dir) / ".cache", log=log)
    return cfg, contract, checkpoint, tasksets, reference, reference


def _logits_file(model, reference, tasksets, path, inputs_path):
    """Run ``model`` (the ONNX Runtime stand-in) on the calibration and eval rows; write them
    as an npz of ``ids`` and ``logits`` (N, K) float32, and the eval batches' token inputs as
    ``inputs_path`` (``index_k``, ``input_ids_k``, ``attention_mask_k``, ``token_type_ids_k``
    per batch k: what ``variants verify`` feeds again); returns the eval logits."""
    ids, logits, inputs = [], [], {}
    for split in ("calibration", "eval"):
        ts = tasksets[split]
        batches, _ = model.prepare(ts)
        ids += [str(i) for i in ts.ids]
        logits.append(model.raw_logits(ts, batches))
    for k, b in enumerate(batches):  # the eval split's
        inputs.update({f"index_{k}": np.asarray(b.index, np.int64),
                       f"input_ids_{k}": np.array(b.input_ids, np.int64),
                       f"attention_mask_{k}": np.array(b.attention_mask, np.int64),
                       f"token_type_ids_{k}": np.array(b.token_type_ids, np.int64)})
    np.savez(path, ids=np.array(ids), logits=np.concatenate(logits).astype(np.float32))
    np.savez(inputs_path, **inputs)
    return logits[-1]


def export_onnx(source, variant, out, allow_fail=False, log=print):
    """Write the judged ``variant`` of ``source`` (or ``"reference"``) as an ONNX folder ``out``
    (module docstring); returns the ``onnx.json`` dict.

    Raises
    ------
    ExportError
        ``out`` not empty; a family other than :data:`ONNX_FAMILIES`; a model kind the graph
        cannot end (a marker model); a FAILED variant without ``allow_fail``.
    ValueError
        ONNX Runtime or the onnx package missing (naming the extra).
    """
    from runs.judge_file import judge_file
    from variants.families.artifact import TOKENIZER_FILES
    from variants.onnx.check import check_graph
    from variants.onnx.graph import decision_graph
    from variants.onnx.graph_bert import save
    from variants.onnx.session import OrtModule, make_session, ort, session_record

    ort()
    out = Path(out)
    check_out(out)
    if variant == "reference":
        judged = _reference_judged(source)
        cfg, contract, ck, tasksets, reference, model = _rebuild_reference(judged, log)
    else:
        judged = _locate_onnx(source, variant)
        if not judged.verdict.get("passed") and not allow_fail:
            raise ExportError(f"{judged.name} FAILED its contract ("
                              f"{', '.join(judged.verdict.get('failed', []))}); pass "
                              "--allow-fail to export it anyway (the model card says so)")
        cfg, contract, ck, tasksets, reference, model, _ = rebuild(judged, log=log)
    try:
        graph = decision_graph(model.module)
    except ValueError as e:
        raise ExportError(f"{judged.name}: {e}") from None
    tmp = out.with_name(f".{out.name}.export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "judged").mkdir(parents=True)
    try:
        save(graph, tmp / "model.onnx")
        session = make_session(tmp / "model.onnx")
        kind, output = check_graph(session, reference)
        nbytes = (tmp / "model.onnx").stat().st_size
        ort_model = reference.replace_module(
            OrtModule(session, output, nbytes, session_record(session)))
        log(f"{judged.name}: judging model.onnx as ONNX Runtime runs it (calibration and eval "
            "rows)")
        logits_path = tmp / "judged" / "onnx_logits.npz"
        onnx_eval = _logits_file(ort_model, reference, tasksets, logits_path,
                                 tmp / "judged" / "eval_inputs.npz")
        name = f"{judged.name}-onnx"
        judge_file(judged.run_dir, logits_path, name=name, force=True, log=log)
        onnx_verdict = json.loads((judged.run_dir / name / "verdict.json").read_text())
        mlx_eval = np.load(judged.vdir / "outputs.npz")["logits"]
        dmax = float(np.nanmax(np.abs(onnx_eval - mlx_eval))) if mlx_eval.shape == \
            onnx_eval.shape else None
        shutil.copyfile(judged.run_dir / name / "verdict.json", tmp / "verdict.json")
        # what `variants verify` judges again: the graph's outputs, the reference's
        for dest, src in (("outputs.npz", judged.run_dir / name / "outputs.npz"),
                          ("calibration_outputs.npz",
                           judged.run_dir / name / "calibration_outputs.npz"),
                          ("reference_outputs.npz", judged.run_dir / "reference" / "outputs.npz"),
                          ("reference_calibration_outputs.npz",
                           judged.run_dir / "reference" / "calibration_outputs.npz")):
            shutil.copyfile(src, tmp / "judged" / dest)
        if (judged.vdir / "verdict.json").exists():
            shutil.copyfile(judged.vdir / "verdict.json", tmp / "mlx_verdict.json")
        for f in TOKENIZER_FILES:
            if (Path(ck.path) / f).is_file():
                shutil.copyfile(Path(ck.path) / f, tmp / f)
        text = _contract_text(cfg)
        (tmp / "contract.toml").write_text(text)
        facts = {"variant": judged.name, "family": judged.build["family"],
                 "graph_output": output, "stands_for": kind, "onnx_bytes": nbytes,
                 "ort": session_record(session), "judged_as": name,
                 "onnx_verdict": {"passed": bool(onnx_verdict.get("passed")),
                                  "failed": onnx_verdict.get("failed", [])},
                 "mlx_verdict": {"passed": bool(judged.verdict.get("passed")),
                                 "failed": judged.verdict.get("failed", [])},
                 "max_abs_dlogit_vs_mlx": dmax, "n_eval": len(tasksets["eval"]),
                 "n_calibration": len(tasksets["calibration"]),
                 "model": cfg.model_config or cfg.resolve_model().name,
                 "near_tie_margin": cfg.near_tie_margin}
        (tmp / "onnx.json").write_text(json.dumps(facts, indent=2) + "\n")
        (tmp / "README.md").write_text(card(facts))
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        manifest = {"format": "onnx", "variant": judged.name,
                    "files": {f: sha256(tmp / f) for f in files},
                    "reference_checkpoint_sha256": ck.sha256,
                    "data_fingerprint": tasksets["eval"].fingerprint(),
                    "run_identity": judged.run.get("identity"),
                    "verdict": facts["onnx_verdict"],
                    "versions": dict(versions(), onnxruntime=ort().__version__,
                                     onnx=__import__("onnx").__version__)}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"exported {judged.name} to {out}/model.onnx ({nbytes / 1e6:.2f} MB): ONNX Runtime "
        f"{'PASS' if facts['onnx_verdict']['passed'] else 'FAIL'}, MLX "
        f"{'PASS' if facts['mlx_verdict']['passed'] else 'FAIL'}, max |Δlogit| "
        f"{dmax if dmax is not None else float('nan'):.3g}")
    return facts


def _contract_text(cfg):
    from contracts.contract import PACKAGED

    if cfg.contract is None or cfg.contract in PACKAGED:
        from importlib import resources

        return resources.files("contracts").joinpath(f"{cfg.contract or 'default'}.toml") \
            .read_text()
    return Path(cfg.contract).read_text()


def card(f):
    """The folder's README.md (Markdown) from its ``onnx.json`` facts."""
    v = lambda d: "PASS" if d["passed"] else "FAIL (" + ", ".join(d["failed"]) + ")"  # noqa: E731
    d = f["max_abs_dlogit_vs_mlx"]
    return (f"# {f['variant']} as ONNX ({f['family']})\n\n"
            f"`model.onnx` ({f['onnx_bytes'] / 1e6:.2f} MB), built by mlx-variants from the "
            "judged MLX model's own arrays. Inputs `input_ids`, `attention_mask`, "
            "`token_type_ids` (int64, batch x tokens, from the tokenizer files here); output "
            f"`{f['graph_output']}` (the decision module's output: "
            + ("its logits" if f["graph_output"] == "logits" else "the text embedding")
            + ").\n\n"
            "## Verdicts\n\n"
            f"- **As ONNX Runtime runs this file**: {v(f['onnx_verdict'])} — its logits on the "
            f"run's {f['n_calibration']} calibration and {f['n_eval']} eval rows "
            "(`judged/onnx_logits.npz`) judged by `contract.toml` "
            f"(the run's variant `{f['judged_as']}`); ONNX Runtime {f['ort']['onnxruntime']}, "
            f"{f['ort']['graph_optimization_level']}, "
            f"{f['ort']['intra_op_num_threads']} threads.\n"
            f"- The MLX model it was built from: {v(f['mlx_verdict'])}; max |Δlogit| between "
            "the two on the eval rows: " + (f"{d:.3g}" if d is not None else "n/a") + ".\n\n"
            "## Run it\n\n```python\nimport onnxruntime as ort\nfrom tokenizers import "
            "Tokenizer\ntok = Tokenizer.from_file(\"tokenizer.json\")\ns = ort.InferenceSession("
            "\"model.onnx\", providers=[\"CPUExecutionProvider\"])\n```\n\n"
            f"Re-judge it anywhere with `variants sweep --family onnx --onnx model.onnx` and the "
            f"run's model ({f['model']}) and data, or judge a file of its logits with `variants "
            "judge RUN --outputs FILE`.\n")

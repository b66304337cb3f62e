"""variants export / verify / load: a judged variant written as an MLX folder, loaded packed
(nothing re-quantized), verified against the judged outputs, and loaded by plain MLX
(``nn.quantize`` with the config's quantization block, ``load_weights(strict=True)``) to the
same logits; bad input exits 2 with nothing written."""

import json
import re
import shutil

import numpy as np
import pytest
from tiny_run import TINY

MAP = r"value=8,word_embeddings=8"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny judged runs of minilm-sentiment: a mixed quant variant with quantized
    embeddings (4 bits, value projections and the word table at 8; its cold starts measured),
    and a low-rank one."""
    from variants.cli import main

    root = tmp_path_factory.mktemp("export")
    tiny = [a if a != "none" else "all" for a in TINY]  # this run's cold starts are measured
    assert main(["sweep", *tiny, "--results-dir", str(root), "--run", "q", "--bits", "4",
                 "--quantize-embeddings", "--bits-map", MAP]) == 0
    assert main(["sweep", *TINY, "--results-dir", str(root), "--run", "lr", "--family",
                 "lowrank", "--methods", "plain", "--ratios", "0.5"]) == 0
    names = {r: [p.name for p in (root / r).iterdir() if (p / "build.json").exists()]
             for r in ("q", "lr")}
    return root, {r: n[0] for r, n in names.items()}


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    from variants.cli import main

    root, names = runs
    out = {}
    for r in ("q", "lr"):
        out[r] = tmp_path_factory.mktemp("out") / r
        assert main(["export", str(root / r), "--variant", names[r], "--out", str(out[r]),
                     "--allow-fail"]) == 0
    return out


def test_folder_is_mlx_layout_with_a_manifest(exported, runs):
    from variants.export.write import sha256

    q = exported["q"]
    cfg = json.loads((q / "config.json").read_text())
    assert cfg["model_type"] == "bert" and cfg["hidden_size"] == 384  # the original config
    quant = cfg["quantization"]  # keyed by transformers' module paths (BertModel's)
    assert quant["group_size"] == 64 and quant["bits"] == 4 and quant["mode"] == "affine"
    assert quant["embeddings.word_embeddings"] == {"group_size": 64, "bits": 8}
    assert quant["encoder.layer.0.attention.self.value"] == {"group_size": 64, "bits": 8}
    assert "head" not in quant  # the decision head by role, full precision, no such name
    assert cfg["mlx_variants"]["head_quantization"] == {"head": False}
    import mlx.core as mx

    w = mx.load(str(q / "model.safetensors"))
    assert w["encoder.layer.0.attention.self.query.weight"].dtype == mx.uint32
    assert w["encoder.layer.0.attention.self.query.weight"].shape == (384, 384 * 4 // 32)
    assert w["encoder.layer.0.attention.self.value.weight"].shape == (384, 384 * 8 // 32)
    assert w["encoder.layer.0.attention.self.query.scales"].shape == (384, 384 // 64)
    assert w["embeddings.position_embeddings.weight"].shape == (512, 384 * 4 // 32)
    assert w["pooler.dense.weight"].dtype == mx.float32  # kept as the checkpoint has it
    own = mx.load(str(q / "decision_head.safetensors"))
    assert sorted(own) == ["head.bias", "head.weight"]
    assert own["head.weight"].dtype == mx.float32 and own["head.weight"].shape == (3, 384)
    manifest = json.loads((q / "manifest.json").read_text())
    files = sorted(p.relative_to(q).as_posix() for p in q.rglob("*") if p.is_file()
                   and p.name != "manifest.json")
    assert sorted(manifest["files"]) == files
    assert all(sha256(q / f) == h for f, h in manifest["files"].items())
    for f in ("tokenizer.json", "model.toml", "contract.toml", "verdict.json", "README.md",
              "outputs.npz", "eval_rows.npz", "decision_head.safetensors"):
        assert f in manifest["files"], f
    assert set(manifest["versions"]) == {"mlx-variants", "mlx", "numpy"}
    card = (q / "README.md").read_text()
    assert "## Contract clauses" in card and "What was not tested" in card
    assert "Architecture: `BertModel` (`model_type` bert)" in card
    assert "(3 the decision model does not read: `embeddings.position_ids`, `pooler." in card
    assert "- mlx-embeddings: `mlx_embeddings.load(\"THIS_FOLDER\")`" in card
    assert "not the decision head" in card and "`decision_head.safetensors`" in card
    # the whole model at 4 bits (word table and values at 8) is far below fp32's 90.3 MB
    assert (q / "model.safetensors").stat().st_size < 30e6
    lr = json.loads((exported["lr"] / "config.json").read_text())
    assert "quantization" not in lr and lr["mlx_variants"]["lowrank"]
    f = lr["mlx_variants"]["lowrank"]["encoder.layers.0.intermediate"]
    assert (f["out"], f["in"]) == (1536, 384) and 0 < f["rank"] < 384


def test_model_card_is_the_html_report_of_the_one_variant(exported, runs):
    """report.html in the exported folder: the run's HTML report for that variant alone, its
    embedded JSON equal to the report.json beside it, both in the manifest."""
    import re

    from variants.export.write import sha256

    root, names = runs
    q = exported["q"]
    page = (q / "report.html").read_text()
    data = json.loads((q / "report.json").read_text())
    assert [v["name"] for v in data["variants"]] == [names["q"]]
    block = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    assert block and json.loads(block.group(1)) == data
    assert "http://" not in page and "https://" not in page
    manifest = json.loads((q / "manifest.json").read_text())
    for f in ("report.html", "report.json"):
        assert manifest["files"][f] == sha256(q / f)


@pytest.mark.parametrize("run", ["q", "lr"])
def test_verify_recomputes_the_judged_outputs(exported, run):
    from variants.export.verify import verify

    res = verify(exported[run], log=lambda m: None)
    assert res["ok"] and res["changed"] == [] and res["max_abs_dlogit"] <= 1e-5
    assert res["n_rows"] == 30


def test_loaded_packed_and_by_plain_mlx_give_the_judged_logits(exported):
    """load_variant keeps the file's packed arrays (no re-quantization); plain MLX following
    the model card (a transformers-named BertModel port, tests/export/plain_bert.py;
    nn.quantize with mlx-lm's predicate over config.json's block; load_weights strict), with
    the fitted head from decision_head.safetensors on its mean-pooled output, gives the judged
    logits."""
    import mlx.core as mx
    import mlx.nn as nn

    import plain_bert
    from runs.outputs import DecisionOutputs
    from variants.checkpoints.load import load_checkpoint
    from variants.export.load import load_variant
    from variants.export.write import load_taskset

    q = exported["q"]
    model, ck = load_variant(q)
    file = mx.load(str(q / "model.safetensors"))
    qv = model.module.encoder.layers[0].attention.value
    assert isinstance(qv, nn.QuantizedLinear) and qv.bits == 8
    assert mx.array_equal(qv.weight, file["encoder.layer.0.attention.self.value.weight"])
    assert isinstance(model.module.encoder.embeddings.word_embeddings, nn.QuantizedEmbedding)
    assert type(model.module.head) is nn.Linear
    assert isinstance(load_checkpoint(q).encoder.layers[3].intermediate, nn.QuantizedLinear)
    ts = load_taskset(q / "eval_rows.npz")
    batches, _ = model.prepare(ts, 32)
    ours = np.asarray(model.raw_logits(ts, batches))
    # plain MLX: transformers' BertModel from config.json, quantized by the block, strict
    cfg = json.loads((q / "config.json").read_text())
    net = plain_bert.load_as_the_card_says(q, plain_bert.BertModel(cfg))
    assert isinstance(net.encoder.layer[0].attention.self.value, nn.QuantizedLinear)
    assert net.encoder.layer[0].attention.self.value.bits == 8
    head = nn.Linear(384, 3)
    head.load_weights([(k[5:], v) for k, v in
                       mx.load(str(q / "decision_head.safetensors")).items()], strict=True)

    def logits(ids, mask, types):
        hidden, _ = net(ids, mask, types)
        m = mask.astype(mx.float32)[..., None]
        pooled = (hidden * m).sum(axis=1) / m.sum(axis=1)  # sentence-transformers' mean
        return head(pooled / mx.linalg.norm(pooled, axis=-1, keepdims=True))

    # 6 rows of each batch: plain MLX's CPU quantized matmul runs at reference-BLAS speed
    # (~13 s for all 30 rows), and every row takes the same path
    plain, order = [], []
    for b in batches:
        plain.append(np.asarray(logits(b.input_ids[:6], b.attention_mask[:6],
                                       b.token_type_ids[:6])))
        order.append(np.asarray(b.index)[:6])
    plain, order = np.concatenate(plain), np.concatenate(order)
    judged = DecisionOutputs.load(q / "outputs.npz", "judged")
    np.testing.assert_allclose(plain, ours[order], rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours, np.asarray(judged.logits), rtol=0, atol=1e-5)


def test_tampered_file_is_named_with_both_hashes(exported, tmp_path, capsys):
    from variants.cli import main

    copy = tmp_path / "c"
    shutil.copytree(exported["q"], copy)
    with open(copy / "model.toml", "a") as f:
        f.write("# edited\n")
    assert main(["verify", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.toml was changed: manifest.json expects sha256" in err and ", found " in err
    assert len(err.splitlines()) == 1


def test_run_records_the_reference_fit_and_export_carries_it(runs, exported):
    """Issue #38: run.json says where the reference's head and temperatures came from and
    their array hash; the run keeps them (reference/fitted.npz); export ships that file, its
    manifest and card carry the run's hash, and the exported head is that head. The second
    sweep on the same fit and calibration rows read the first one's from the cache."""
    import mlx.core as mx

    from variants.models import fitted_state as fs

    root, _ = runs
    recs = {r: json.loads((root / r / "run.json").read_text())["reference_fit"]
            for r in ("q", "lr")}
    assert recs["q"]["source"] == "fitted" and recs["lr"]["source"] == "cache"
    assert recs["q"]["sha256"] == recs["lr"]["sha256"] and len(recs["q"]["sha256"]) == 64
    assert recs["q"]["file"] == "reference/fitted.npz"
    assert recs["q"]["from"].startswith(".cache/heads/minilm-sentiment-")
    for r in ("q", "lr"):
        state = fs.read_state(root / r / "reference" / "fitted.npz")
        assert fs.state_sha256(state) == recs[r]["sha256"]
        assert state["head_weight"].shape == (3, 384) and state["t_keys"].tolist() == [3]
        manifest = json.loads((exported[r] / "manifest.json").read_text())
        assert manifest["reference_fit"] == dict(recs[r], file="judged/reference_fitted.npz")
        shipped = fs.read_state(exported[r] / "judged" / "reference_fitted.npz")
        assert fs.state_sha256(shipped) == recs[r]["sha256"]
    head = mx.load(str(exported["q"] / "decision_head.safetensors"))["head.weight"]  # fp32
    np.testing.assert_array_equal(np.array(head), state["head_weight"])
    assert recs["q"]["sha256"] in (exported["q"] / "README.md").read_text()


def test_verify_checks_the_reference_fit_hash(exported, tmp_path, capsys):
    """A changed judged/reference_fitted.npz is caught by its file hash; with the manifest's
    file hash forged to match, by its array hash against the run's record: one line each."""
    from variants.cli import main
    from variants.export.write import sha256
    from variants.models import fitted_state as fs

    copy = tmp_path / "c"
    shutil.copytree(exported["q"], copy)
    state = fs.read_state(copy / fs.EXPORT_FILE)
    state["t_values"] = state["t_values"] * 1.001
    np.savez(copy / fs.EXPORT_FILE, **state)
    assert main(["verify", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert "reference_fitted.npz was changed" in err and len(err.splitlines()) == 1
    m = json.loads((copy / "manifest.json").read_text())
    m["files"][fs.EXPORT_FILE] = sha256(copy / fs.EXPORT_FILE)
    (copy / "manifest.json").write_text(json.dumps(m))
    assert main(["verify", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "reference_fitted.npz hashes" in err, err
    assert f"reference_fit (the run's) says {m['reference_fit']['sha256'][:16]}" in err
    assert err.endswith("export the variant again")


@pytest.mark.parametrize("case, message", [
    ("not-empty", "is not empty; pass a new folder"),
    ("unknown", "--variant 'nope' is not a variant of"),
    ("failed", "FAILED its contract"),
    ("no-outputs", "has no outputs.npz"),
    ("student", "the student family does not export (a student is a new network trained "
                "here; export its folder with its own code)"),
    ("exact", "the exact family does not export (the exact family is a compute path"),
])
def test_bad_export_exits_2_with_nothing_written(runs, tmp_path, capsys, case, message):
    from variants.cli import main

    root, names = runs
    src, variant, out, extra = root / "q", names["q"], tmp_path / "o", ["--allow-fail"]
    if case == "not-empty":
        out.mkdir()
        (out / "x").write_text("keep")
    elif case == "unknown":
        variant = "nope"
    elif case == "failed":
        extra = []
        src = tmp_path / "run"
        shutil.copytree(root / "q", src)
        v = json.loads((src / variant / "verdict.json").read_text())
        (src / variant / "verdict.json").write_text(json.dumps(dict(v, passed=False,
                                                                     failed=["agreement"])))
    elif case == "no-outputs":
        src = tmp_path / "run"
        shutil.copytree(root / "q", src)
        (src / variant / "outputs.npz").unlink()
    elif case in ("student", "exact"):  # still refused, each with its one-line reason
        src = tmp_path / "run"
        shutil.copytree(root / "q", src)
        b = json.loads((src / variant / "build.json").read_text())
        (src / variant / "build.json").write_text(json.dumps(dict(b, family=case)))
    assert main(["export", str(src), "--variant", variant, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    if case != "not-empty":
        assert not out.exists()
    else:
        assert [p.name for p in out.iterdir()] == ["x"]
    assert not list(tmp_path.glob(".*export-tmp"))


def test_low_rank_export_loads_with_load_checkpoint(exported):
    """load_checkpoint(DIR) of a low-rank export puts the factored layers back as two Linears
    from the file (nothing factored again), stored under the Linear's transformers name plus
    ``.down`` / ``.up``; its encoder with the exported head gives the judged logits. The model
    card says only this package's loaders read such a folder (no plain-MLX recipe)."""
    import mlx.core as mx

    from runs.outputs import DecisionOutputs
    from variants.arch.lowrank import LowRankLinear
    from variants.checkpoints.load import load_checkpoint
    from variants.export.load import load_variant
    from variants.export.write import load_taskset
    from variants.models.sentiment import SentimentNet

    lr = exported["lr"]
    cfg = json.loads((lr / "config.json").read_text())
    factored = cfg["mlx_variants"]["lowrank"]
    file = mx.load(str(lr / "model.safetensors"))
    assert "encoder.layer.0.intermediate.dense.weight" not in file  # replaced by its factors
    ck = load_checkpoint(lr)
    layer = ck.encoder.layers[0].intermediate
    assert isinstance(layer, LowRankLinear)
    assert mx.array_equal(layer.down.weight, file["encoder.layer.0.intermediate.dense.down.weight"])
    assert mx.array_equal(layer.up.bias, file["encoder.layer.0.intermediate.dense.up.bias"])
    mine = [p for p, m in ck.encoder.named_modules() if isinstance(m, LowRankLinear)]
    assert sorted("encoder." + p for p in mine) == sorted(factored)
    judged = np.asarray(DecisionOutputs.load(lr / "outputs.npz", "judged").logits)
    ts = load_taskset(lr / "eval_rows.npz")
    model, _ = load_variant(lr)
    batches, _ = model.prepare(ts, 32)
    order = np.argsort(np.concatenate([b.index for b in batches]))
    net = SentimentNet(ck.encoder)
    net.head.load_weights([(k[5:], v) for k, v in
                           mx.load(str(lr / "decision_head.safetensors")).items()], strict=True)
    got = np.concatenate([np.asarray(net(b.input_ids, b.attention_mask, b.token_type_ids))
                          for b in batches])[order]
    np.testing.assert_allclose(got, judged, rtol=0, atol=1e-5)
    card = (lr / "README.md").read_text()
    assert "`<name>.down.weight`, `<name>.up.weight`" in card
    assert "only this package's loaders read this folder" in card
    assert "nn.quantize" not in card and "mlx_embeddings.load" not in card


def test_sweep_cold_start_loads_the_variant_s_exported_weights(runs, exported):
    """The sweep's cold start of a quant variant loads its weights folder (the files export
    writes), never the fp32 checkpoint; the reference's loads the fp32 checkpoint; the 4-bit
    variant's load-time allocator peak is its packed file, below the fp32 reference's."""
    from variants.checkpoints.load import minilm_path

    root, names = runs
    meta = json.loads((root / "q" / "run.json").read_text())
    ref = meta["cold_start"]
    cold = json.loads((root / "q" / names["q"] / "timing.json").read_text())["cold_start"]
    assert "error" not in cold and "error" not in ref
    fp32 = str(minilm_path() / "model.safetensors")
    assert ref["source"] == "fp32 checkpoint" and fp32 in ref["weight_files_read"]
    assert cold["source"] == "exported artifact" and cold["build_s"] == 0.0
    assert sorted(p.rsplit("/", 1)[1] for p in cold["weight_files_read"]) == [
        "decision_head.safetensors", "model.safetensors"]
    assert fp32 not in cold["weight_files_read"]
    # the same format as variants export's folder: the same bytes of its weight files
    assert cold["artifact_bytes"] == sum((exported["q"] / f).stat().st_size for f in (
        "model.safetensors", "decision_head.safetensors"))
    # loading holds the packed arrays (the files less their headers and the pooler the
    # model does not run, 0.59 MB; within 5%), nothing more; the fp32 reference all 90.3 MB
    assert 0 < cold["artifact_bytes"] - cold["model_bytes"] < 1e6
    assert cold["model_bytes"] <= cold["load_peak_memory_bytes"] <= 1.05 * cold["model_bytes"]
    assert ref["load_peak_memory_bytes"] >= 90e6 > 3 * cold["load_peak_memory_bytes"]
    for r in (ref, cold):  # the three memory numbers, apart
        assert r["first_call_peak_memory_bytes"] >= r["model_bytes"]
        assert r["process_peak_rss_bytes"] >= r["first_call_process_rss_bytes"] > 0
    summary = (root / "q" / "summary.csv").read_text()
    assert "cold_source" in summary.splitlines()[0] and "exported artifact" in summary
    report = (root / "q" / "report.md").read_text()
    import re

    assert "| loads from" in report
    assert re.search(r"\| reference +\| fp32 checkpoint +\|", report)
    assert re.search(rf"\| {re.escape(names['q'])} +\| exported artifact +\|", report)


@pytest.mark.slow
def test_sweep_runs_on_a_low_rank_export(exported, tmp_path):
    """variants sweep --checkpoint DIR on a low-rank export: its reference is the factored
    model (smaller than fp32 MiniLM's 90.3 MB), and its 8-bit variant is judged against it."""
    from variants.cli import main

    lr = exported["lr"]
    assert main(["sweep", *TINY, "--checkpoint", str(lr), "--results-dir", str(tmp_path),
                 "--run", "s", "--bits", "8"]) in (0, 1)
    run = tmp_path / "s"
    timing = json.loads((run / "q8-g64" / "timing.json").read_text())
    ref_bytes = timing["model_bytes"]["reference"]
    # the reference is the exported factored model: its file's arrays (the file adds its header)
    assert 0 < (lr / "model.safetensors").stat().st_size - ref_bytes < 1e6
    assert ref_bytes < 80e6  # fp32 MiniLM: 90.3 MB
    assert timing["model_bytes"]["variant"] < ref_bytes
    assert (run / "q8-g64" / "verdict.json").exists()


@pytest.mark.parametrize("name", ["tokenizer.json", "eval_rows.npz", "verdict.json",
                                  "outputs.npz", "judged/reference_outputs.npz",
                                  "judged/reference_fitted.npz"])
def test_unreadable_file_with_a_matching_hash_is_named_in_one_line(exported, tmp_path, capsys,
                                                                   name):
    """A file written unreadable but listed with its own hash (the hash check passes): one
    line naming the file and the fix, exit 2, no traceback."""
    import hashlib

    from variants.cli import main

    copy = tmp_path / "c"
    shutil.copytree(exported["q"], copy)
    (copy / name).write_text("garbage\n")
    m = json.loads((copy / "manifest.json").read_text())
    m["files"][name] = hashlib.sha256(b"garbage\n").hexdigest()
    (copy / "manifest.json").write_text(json.dumps(m))
    assert main(["verify", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{name} cannot" in err, err
    assert "rerun" not in err, err  # the results folder's advice does not fit an export
    assert err.endswith("export the variant again"), err


def test_weights_that_give_nan_are_outputs_that_differ_not_bad_input(exported, tmp_path, capsys):
    """Issue #39: a folder whose weights (hashes consistent: re-signed after the edit) give NaN
    logits is a verification failure (exit 1: the outputs differ from outputs.npz, the
    finite-outputs clause changes), not an internal name on exit 2."""
    import mlx.core as mx

    from variants.cli import main
    from variants.export.write import sha256

    copy = tmp_path / "nan"
    shutil.copytree(exported["q"], copy)
    weights = dict(mx.load(str(copy / "decision_head.safetensors")))
    weights["head.weight"] = mx.full(weights["head.weight"].shape, float("nan"))
    mx.save_safetensors(str(copy / "decision_head.safetensors"), weights,
                        metadata={"format": "mlx"})
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["decision_head.safetensors"] = sha256(copy / "decision_head.safetensors")
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    assert main(["verify", str(copy)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"max \|Δlogit\| inf \(tolerance [0-9.e+-]+\); outputs differ from ", out)
    assert "outputs.npz" in out and "verdicts changed: " in out and "finite-outputs" in out

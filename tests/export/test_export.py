"""variants export / verify / load: a judged variant written as an MLX folder, loaded packed
(nothing re-quantized), verified against the judged outputs, and loaded by plain MLX
(``nn.quantize`` with the config's quantization block, ``load_weights(strict=True)``) to the
same logits; bad input exits 2 with nothing written."""

import json
import shutil

import numpy as np
import pytest

TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none",
        "--timing-batch-sizes", "1", "--no-progress", "--contract", "lenient"]
MAP = r"value=8,word_embeddings=8"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny judged runs of minilm-sentiment: a mixed quant variant with quantized
    embeddings (4 bits, value projections and the word table at 8), and a low-rank one."""
    from variants.cli import main

    root = tmp_path_factory.mktemp("export")
    assert main(["sweep", *TINY, "--results-dir", str(root), "--run", "q", "--bits", "4",
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
    quant = cfg["quantization"]
    assert quant["group_size"] == 64 and quant["bits"] == 4
    assert quant["encoder.embeddings.word_embeddings"] == {"group_size": 64, "bits": 8}
    assert quant["encoder.layers.0.attention.value"] == {"group_size": 64, "bits": 8}
    assert quant["head"] is False  # the decision head by role, full precision
    import mlx.core as mx

    w = mx.load(str(q / "model.safetensors"))
    assert w["encoder.layers.0.attention.query.weight"].dtype == mx.uint32
    assert w["encoder.layers.0.attention.query.weight"].shape == (384, 384 * 4 // 32)
    assert w["encoder.layers.0.attention.value.weight"].shape == (384, 384 * 8 // 32)
    assert w["encoder.layers.0.attention.query.scales"].shape == (384, 384 // 64)
    assert w["encoder.embeddings.position_embeddings.weight"].shape == (512, 384 * 4 // 32)
    assert w["head.weight"].dtype == mx.float32 and w["head.weight"].shape == (3, 384)
    manifest = json.loads((q / "manifest.json").read_text())
    files = sorted(p.relative_to(q).as_posix() for p in q.rglob("*") if p.is_file()
                   and p.name != "manifest.json")
    assert sorted(manifest["files"]) == files
    assert all(sha256(q / f) == h for f, h in manifest["files"].items())
    for f in ("tokenizer.json", "model.toml", "contract.toml", "verdict.json", "README.md",
              "outputs.npz", "eval_rows.npz"):
        assert f in manifest["files"], f
    assert set(manifest["versions"]) == {"mlx-variants", "mlx", "numpy"}
    card = (q / "README.md").read_text()
    assert "## Contract clauses" in card and "What was not tested" in card
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
    """load_variant keeps the file's packed arrays (no re-quantization); plain MLX (the network
    skeleton, nn.quantize with mlx-lm's predicate over config.json's block, load_weights
    strict) gives the same logits as the packed load, bit for bit."""
    import mlx.core as mx
    import mlx.nn as nn

    from runs.outputs import DecisionOutputs
    from variants.checkpoints.load import load_checkpoint
    from variants.arch.encoder import BertEncoder, ModelArgs
    from variants.export.load import load_variant
    from variants.export.write import load_taskset
    from variants.models.sentiment import SentimentNet

    q = exported["q"]
    model, ck = load_variant(q)
    file = mx.load(str(q / "model.safetensors"))
    qv = model.module.encoder.layers[0].attention.value
    assert isinstance(qv, nn.QuantizedLinear) and qv.bits == 8
    assert mx.array_equal(qv.weight, file["encoder.layers.0.attention.value.weight"])
    assert isinstance(model.module.encoder.embeddings.word_embeddings, nn.QuantizedEmbedding)
    assert type(model.module.head) is nn.Linear
    assert isinstance(load_checkpoint(q).encoder.layers[3].intermediate, nn.QuantizedLinear)
    ts = load_taskset(q / "eval_rows.npz")
    batches, _ = model.prepare(ts, 32)
    ours = np.asarray(model.raw_logits(ts, batches))
    # plain MLX: the same network from config.json, quantized by the block, weights strict
    cfg = json.loads((q / "config.json").read_text())
    net = SentimentNet(BertEncoder(ModelArgs.from_dict(cfg)))
    block = cfg["quantization"]

    def predicate(p, m):  # mlx_lm.utils.load_model's rule
        if p in block:
            return block[p]
        return hasattr(m, "to_quantized") and f"{p}.scales" in file
    nn.quantize(net, group_size=block["group_size"], bits=block["bits"],
                class_predicate=predicate)
    net.load_weights(str(q / "model.safetensors"), strict=True)
    plain = np.concatenate([np.asarray(net(b.input_ids, b.attention_mask, b.token_type_ids))
                            for b in batches])
    order = np.concatenate([b.index for b in batches])
    judged = DecisionOutputs.load(q / "outputs.npz", "judged")
    np.testing.assert_allclose(plain[np.argsort(order)], ours, rtol=0, atol=1e-5)
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


@pytest.mark.parametrize("case, message", [
    ("not-empty", "is not empty; pass a new folder"),
    ("unknown", "--variant 'nope' is not a variant of"),
    ("failed", "FAILED its contract"),
    ("no-outputs", "has no outputs.npz"),
    ("prune", "the prune family does not export"),
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
    elif case == "prune":
        src = tmp_path / "run"
        shutil.copytree(root / "q", src)
        b = json.loads((src / variant / "build.json").read_text())
        (src / variant / "build.json").write_text(json.dumps(dict(b, family="prune")))
    assert main(["export", str(src), "--variant", variant, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    if case != "not-empty":
        assert not out.exists()
    else:
        assert [p.name for p in out.iterdir()] == ["x"]
    assert not list(tmp_path.glob(".*export-tmp"))

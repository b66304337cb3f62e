"""``variants export --format onnx`` on the tiny random-init BERT and ModernBERT classifiers
(tests/fixtures/hf/, each with its own head)
swept by the CLI as a user would: the reference and quant variants as ONNX graphs reproduce the
judged MLX logits (<= 1e-4) and get the MLX verdict clause for clause; a W8A8 variant's graph
(per-token uint8 codes, MatMulInteger u8 x u8) gets the same verdict as its MLX form; each
folder's verdict.json is the graph's own, judged from ONNX Runtime's logits as ``variants judge
--outputs`` judges a file (the run gains ``<variant>-onnx``), and re-judging model.onnx with
``--family onnx`` gives the same verdict; ``variants verify`` recomputes the judged logits and
refuses a changed graph; a family the graph builders cannot take is refused in one line with
nothing written."""

import json
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from variants.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"
TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none",
        "--timing-batch-sizes", "1", "--no-progress"]
DATA = ROOT / "examples" / "vader_raters.jsonl"


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def runs(request, tmp_path_factory):
    arch = request.param
    root = tmp_path_factory.mktemp(f"onnx-export-{arch}")
    toml = root / "model.toml"
    cap = "max_length = 128\n" if arch == "modernbert" else ""  # its 512 tokens: a 6x dearer run
    toml.write_text(f'name = "tiny-{arch}"\nlogits = "classifier"\ncheckpoint = "{HF / arch}"\n'
                    f'{cap}options = ["negative", "neutral", "positive"]\n'
                    'scores = [-1.0, 0.0, 1.0]\nactions = ["escalate", "review", "none"]\n')
    base = ["sweep", "--model-config", str(toml), "--data", str(DATA), "--results-dir",
            str(root / "r"), *TINY]
    assert main([*base, "--run", "q", "--bits", "4", "8"]) == 0
    assert main([*base, "--run", "w", "--family", "w8a8", "--smooth", "off"]) == 0
    return root, toml


def _export(run, variant, out):
    assert main(["export", str(run), "--variant", variant, "--format", "onnx", "--out", str(out),
                 "--allow-fail"]) == 0
    return json.loads((out / "onnx.json").read_text())


@pytest.mark.parametrize("run, variant", [("q", "reference"), ("q", "q8-g64"), ("q", "q4-g64")])
def test_fp32_and_quant_graphs_are_the_judged_model(runs, tmp_path, run, variant):
    root, _ = runs
    facts = _export(root / "r" / run, variant, tmp_path / "o")
    if variant != "reference":  # the reference's outputs.npz holds the same logits
        assert facts["max_abs_dlogit_vs_mlx"] <= 1e-4
    else:
        ref = np.load(root / "r" / run / "reference" / "outputs.npz")["logits"]
        onnx = json.loads((root / "r" / run / "reference-onnx" / "verdict.json").read_text())
        assert onnx["passed"]
        got = np.load(root / "r" / run / "reference-onnx" / "outputs.npz")["logits"]
        assert np.abs(got - ref).max() <= 1e-4
    assert facts["onnx_verdict"] == facts["mlx_verdict"]
    v = json.loads((tmp_path / "o" / "verdict.json").read_text())
    assert v == json.loads((root / "r" / run / f"{variant}-onnx" / "verdict.json").read_text())
    assert main(["verify", str(tmp_path / "o")]) == 0  # recomputed here: the judged logits
    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert {"model.onnx", "verdict.json", "judged/onnx_logits.npz", "README.md",
            "tokenizer.json"} <= set(man["files"])


def test_w8a8_graph_gets_its_mlx_verdict(runs, tmp_path):
    root, _ = runs
    facts = _export(root / "r" / "w", "w8a8", tmp_path / "o")
    assert facts["onnx_verdict"] == facts["mlx_verdict"]
    assert main(["verify", str(tmp_path / "o")]) == 0
    # code steps, not round-off: the same per-token codes up to float32 ties (tests/onnx)
    assert facts["max_abs_dlogit_vs_mlx"] < 0.05


def test_the_exported_graph_rejudged_as_a_variant_gets_its_verdict(runs, tmp_path):
    root, toml = runs
    _export(root / "r" / "q", "q4-g64", tmp_path / "o")
    assert main(["sweep", "--model-config", str(toml), "--data", str(DATA), "--results-dir",
                 str(tmp_path / "r"), "--run", "x", "--family", "onnx", "--onnx",
                 str(tmp_path / "o" / "model.onnx"), *TINY]) == 0
    (var,) = [p for p in (tmp_path / "r" / "x").iterdir() if p.name.startswith("onnx-model-")]
    got = json.loads((var / "verdict.json").read_text())
    exported = json.loads((tmp_path / "o" / "verdict.json").read_text())
    assert got["passed"] == exported["passed"] and got["failed"] == exported["failed"]


def test_verify_refuses_a_changed_graph(runs, tmp_path, capsys):
    root, _ = runs
    _export(root / "r" / "q", "q8-g64", tmp_path / "o")
    with open(tmp_path / "o" / "model.onnx", "ab") as f:
        f.write(b"\0")
    assert main(["verify", str(tmp_path / "o")]) == 2
    assert "model.onnx" in capsys.readouterr().err


def test_a_family_without_a_graph_is_refused(tmp_path, capsys):
    """A pruning variant (its build record is all the refusal reads) is refused for its family
    in one line, before its verdict is looked at (no --allow-fail), nothing written."""
    run = tmp_path / "run"
    (run / "prune-l2-r0.5").mkdir(parents=True)
    (run / "prune-l2-r0.5" / "build.json").write_text(json.dumps({"family": "prune"}))
    assert main(["export", str(run), "--variant", "prune-l2-r0.5", "--format", "onnx", "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--format onnx exports the reference and quant" in err[0]
    assert "not the prune family; export it as an MLX folder" in err[0]
    assert not (tmp_path / "o").exists()

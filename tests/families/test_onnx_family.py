"""The onnx family end to end through the CLI, as a user runs it, on the tiny random-init BERT
classifier of tests/fixtures/hf/ (its own head, the example rater rows): the suite's fp32 graph
of the whole decision module reproduces the reference's logits (<= 1e-4) and passes; ONNX
Runtime's dynamic quantizers (per tensor and per channel) get verdicts and store about a
quarter of the bytes; a user's encoder-only graph goes through the model's own head in MLX
and gives the same logits; the runtime's version and settings are in build.json, run.json and
the report; graphs that do not fit the model are refused in one line before anything is
written."""

import json
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from runs.outputs import DecisionOutputs  # noqa: E402
from variants.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"
TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none",
        "--timing-batch-sizes", "1", "--no-progress"]


@pytest.fixture(scope="module")
def toml(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx-model")
    path = root / "model.toml"
    path.write_text(f'name = "tiny-bert"\nlogits = "classifier"\ncheckpoint = "{HF / "bert"}"\n'
                    'options = ["negative", "neutral", "positive"]\n'
                    'scores = [-1.0, 0.0, 1.0]\nactions = ["escalate", "review", "none"]\n')
    return path


def _sweep(toml, results, run, *extra):
    return main(["sweep", "--model-config", str(toml), "--data",
                 str(ROOT / "examples" / "vader_raters.jsonl"), "--results-dir", str(results),
                 "--run", run, "--family", "onnx", *extra, *TINY])


@pytest.fixture(scope="module")
def run(toml, tmp_path_factory):
    results = tmp_path_factory.mktemp("onnx-runs")
    assert _sweep(toml, results, "m", "--ort-quant", "none", "dynamic") == 0
    return results / "m"


def _logits(folder):
    return DecisionOutputs.load(folder / "outputs.npz").logits


def _json(path):
    return json.loads(Path(path).read_text())


def test_the_suites_fp32_graph_is_the_reference(run):
    ref, var = _logits(run / "reference"), _logits(run / "onnx-fp32")
    scale = max(1.0, float(np.abs(ref).max()))
    assert np.abs(var - ref).max() <= 1e-4 * scale
    assert _json(run / "onnx-fp32" / "verdict.json")["outcome"] == "pass"
    b = _json(run / "onnx-fp32" / "build.json")
    assert b["family"] == "onnx" and b["stands_for"] == "module" and b["output"] == "logits"
    assert b["ort"]["onnxruntime"] == ort.__version__
    assert b["ort"]["providers"] == ["CPUExecutionProvider"]
    assert b["ort"]["graph_optimization_level"] == "ORT_ENABLE_ALL"
    assert b["per_row"] == []  # fp32: a row's logits do not depend on its batch-mates


def test_ort_dynamic_quantization_is_judged_and_smaller(run):
    fp32 = _json(run / "onnx-fp32" / "build.json")["model_bytes"]
    for name, pc in (("onnx-dyn", False), ("onnx-dyn-pc", True)):
        b = _json(run / name / "build.json")
        assert b["ort_quant"]["function"] == "quantize_dynamic"
        assert b["ort_quant"]["per_channel"] is pc
        # per-tensor activation ranges at run time: rows run alone (batch-mates would move them)
        assert b["per_row"] == ["DynamicQuantizeLinear"]
        # int8 weights: a quarter of fp32, plus scales and the graph's small tensors
        assert 0.2 < b["model_bytes"] / fp32 < 0.4
        assert _json(run / name / "verdict.json")["outcome"] in ("pass", "fail")
        # quantization changed the logits (else the variant would not be the quantized graph)
        assert np.abs(_logits(run / name) - _logits(run / "reference")).max() > 1e-4


def test_runtime_recorded_in_run_json_and_report(run):
    meta = _json(run / "run.json")
    rec = meta["onnxruntime"]
    assert rec["version"] == ort.__version__ and rec["inter_op_num_threads"] == 1
    assert rec["graph_optimization_level"] == ["ORT_ENABLE_ALL"]
    text = (run / "report.md").read_text()
    assert f"ONNX Runtime {ort.__version__} (CPUExecutionProvider)" in text
    assert "quantize_dynamic (per channel" in text


def test_a_users_encoder_graph_goes_through_the_models_head(run, toml, tmp_path):
    from variants.checkpoints.load import load_checkpoint
    from variants.onnx.graph import encoder_graph
    from variants.onnx.graph_bert import save

    ck = load_checkpoint(HF / "bert")
    path = save(encoder_graph(ck.encoder), tmp_path / "encoder.onnx")
    assert _sweep(toml, tmp_path / "r", "u", "--onnx", str(path)) == 0
    (var,) = [p for p in (tmp_path / "r" / "u").iterdir() if p.name.startswith("onnx-encoder-")]
    b = _json(var / "build.json")
    assert b["stands_for"] == "encoder" and b["output"] == "last_hidden_state"
    ref = _logits(run / "reference")
    assert np.abs(_logits(var) - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


def _graph(path, inputs, out_shape, dtype=TensorProto.FLOAT):
    """A graph of ``inputs`` (names) whose output ``y`` is zeros of ``out_shape`` (ints, or
    "B"/"L" for the batch and sequence axes of input_ids) and ``dtype``."""
    nodes = [helper.make_node("Shape", [inputs[0]], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["l"], axis=0)]
    dims = []
    for i, d in enumerate(out_shape):
        if d in ("B", "L"):
            dims.append({"B": "b", "L": "l"}[d])
        else:
            nodes.append(helper.make_node("Constant", [], [f"d{i}"], value_ints=[d]))
            dims.append(f"d{i}")
    nodes += [helper.make_node("Unsqueeze", [d, "ax"], [f"u{i}"]) if d in ("b", "l") else
              helper.make_node("Identity", [d], [f"u{i}"]) for i, d in enumerate(dims)]
    nodes += [helper.make_node("Concat", [f"u{i}" for i in range(len(dims))], ["shape"], axis=0),
              helper.make_node("ConstantOfShape", ["shape"], ["y"],
                               value=helper.make_tensor("v", dtype, [1], [0]))]
    inits = [helper.make_tensor("i0", TensorProto.INT64, [], [0]),
             helper.make_tensor("i1", TensorProto.INT64, [], [1]),
             helper.make_tensor("ax", TensorProto.INT64, [1], [0])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.INT64,
                                                                     ["B", "L"]) for n in inputs],
                          [helper.make_tensor_value_info("y", dtype, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    path.write_bytes(m.SerializeToString())
    return path


@pytest.mark.parametrize("inputs, shape, words", [
    (["input_ids"], [3, 3], "does not follow the batch: (3, 3) for one row"),
    (["input_ids", "pixel_values"], ["B", "L", 64], "input 'pixel_values' is not one the suite"),
    (["input_ids", "attention_mask"], ["B", "L", 7], "has width 7, the model's encoder 64"),
    (["input_ids", "attention_mask"], ["B", 5], "is (3, 5) on a probe batch where the model's "
                                                "module returns (3, 3)"),
])
def test_a_graph_that_does_not_fit_is_refused_before_any_write(toml, tmp_path, capsys, inputs,
                                                                shape, words):
    path = _graph(tmp_path / "bad.onnx", inputs, shape)
    assert _sweep(toml, tmp_path / "r", "bad", "--onnx", str(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "r" / "bad").exists()


def test_an_integer_output_is_refused(toml, tmp_path, capsys):
    path = _graph(tmp_path / "int.onnx", ["input_ids"], ["B", 3], TensorProto.INT64)
    assert _sweep(toml, tmp_path / "r", "i", "--onnx", str(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is tensor(int64), not float32" in err[0], err


def test_more_calibration_rows_than_the_fit_split_are_refused(toml, tmp_path, capsys):
    assert _sweep(toml, tmp_path / "r", "c", "--ort-quant", "static", "--ort-per-channel", "off",
                  "--ort-calib-rows", "500") == 2
    assert "--ort-calib-rows 500 exceeds the fit split's 40 rows" in capsys.readouterr().err


def test_a_missing_file_is_refused(toml, tmp_path, capsys):
    assert _sweep(toml, tmp_path / "r", "x", "--onnx", str(tmp_path / "nope.onnx")) == 2
    assert "no such file" in capsys.readouterr().err
    assert not (tmp_path / "r" / "x").exists()


def test_a_script_s_ort_logits_judged_from_a_file_get_the_family_s_verdict(run, tmp_path):
    """A user's own script runs ONNX Runtime on the quantized graph (no suite code in the loop
    but the tokenizer: one row per call, as a server would) and writes JSONL logits by row id:
    ``variants judge`` gives the verdict ``--family onnx`` gave that graph."""
    from variants.checkpoints.load import load_checkpoint

    rows = {r["id"]: r for r in map(json.loads, (ROOT / "examples" / "vader_raters.jsonl")
                                    .read_text().splitlines())}
    graph = _json(run / "onnx-dyn-pc" / "build.json")["graph"]
    sess = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    tok = load_checkpoint(HF / "bert").tokenizer
    lines = []
    for split in ("calibration_outputs.npz", "outputs.npz"):
        for rid in np.load(run / "reference" / split)["ids"]:
            (enc,), _ = tok.encode([rows[str(rid)]["text"]])
            ids, mask, types = (np.asarray(a, np.int64) for a in tok.batch([enc]))
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            (logits,) = sess.run(["logits"], {i.name: feed[i.name] for i in sess.get_inputs()})
            lines.append(json.dumps({"id": str(rid), "logits": logits[0].tolist()}))
    path = tmp_path / "served.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["judge", str(run), "--outputs", str(path), "--name", "served"]) == 0
    got, family = _json(run / "served" / "verdict.json"), _json(run / "onnx-dyn-pc" /
                                                               "verdict.json")
    assert (got["passed"], got["failed"]) == (family["passed"], family["failed"])


def test_a_second_family_swept_into_the_run_shares_its_table(toml, tmp_path):
    """W8A8, then ONNX Runtime's dynamic int8 swept into the same run (W8A8 is judged in native
    mode, so the onnx sweep passes --quality-mode native to match the run): the second sweep's
    summary.csv and report.md list both families' variants side by side with their verdicts."""
    import pandas as pd

    assert _sweep(toml, tmp_path, "t", "--family", "w8a8", "--smooth", "off") == 0
    assert _sweep(toml, tmp_path, "t", "--ort-quant", "dynamic", "--ort-per-channel", "on",
                  "--quality-mode", "native") == 0
    table = pd.read_csv(tmp_path / "t" / "summary.csv")
    assert dict(zip(table["variant"], table["family"])) == {"w8a8": "w8a8",
                                                            "onnx-dyn-pc": "onnx"}
    assert set(table["verdict"]) <= {"PASS", "FAIL"}
    report = (tmp_path / "t" / "report.md").read_text()
    assert "| w8a8 " in report and "| onnx-dyn-pc " in report

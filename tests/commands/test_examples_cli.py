"""Each shipped example model TOML sweeps end to end through the CLI at a small size (the marker
example runs on the example JSONL in test_model_config.py): exit 0, a full report, the verdicts
and numbers a sweep of this model must give."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from runs.outputs import DecisionOutputs
from variants.cli import main

ROOT = Path(__file__).parents[2]
TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none", "--bits", "8",
        "--timing-batch-sizes", "1", "--no-progress"]


@pytest.mark.slow
@pytest.mark.parametrize("kind,data", [("linear-head", None), ("cosine", None),
                                       ("classifier", "examples/vader_raters.jsonl")])
def test_example_toml_sweeps_end_to_end(kind, data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    emoji_ids = set()
    if data:  # ten rows whose text is one emoji: the tiny vocabulary reads [CLS] [UNK] [SEP]
        rows = [json.loads(x) for x in (ROOT / data).read_text().splitlines()]
        for r in rows[:10]:
            r["text"] = "\U0001F642"
            emoji_ids.add(r["id"])
        data = tmp_path / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = ["--data", str(data)] if data else []
    assert main(["sweep", "--model-config", f"examples/model-{kind}.toml",
                 "--results-dir", str(tmp_path), *extra, *TINY]) == 0
    run = tmp_path / f"my-{kind}-quant-g64"
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete"
    assert meta["model"]["config"]["logits"] == kind
    for f in ("summary.csv", "report.md", "q8-g64/report.md", "q8-g64/verdict.json",
              "reference/outputs.npz"):
        assert (run / f).is_file(), f
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary["variant"]) == ["q8-g64"]
    ref = DecisionOutputs.load(run / "reference" / "outputs.npz")
    assert ref.logits.shape == (30, 3) and np.isfinite(ref.logits).all()
    # probabilities are the softmax of logits / T at the deployed temperature, rows sum to 1
    assert np.allclose(ref.probs.sum(axis=1), 1.0, atol=1e-5)
    log = capsys.readouterr().err
    if kind == "classifier":  # fixed T = 1 in the TOML, options from id2label order
        assert "using the fixed temperatures {3: 1.0}" in log and "fitting temperatures" not in log
        assert meta["model"]["config"]["temperature_values"] == {"3": 1.0}
        z = ref.logits.astype(np.float64)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        assert np.allclose(ref.probs, p / p.sum(axis=1, keepdims=True), atol=1e-5)
        assert meta["data"]["file"]["path"] == str(data)
        # special-token-only rows are kept and counted per split
        assert meta["data"]["special_only_texts"]["eval"] == len(emoji_ids & set(ref.ids))
        cal = DecisionOutputs.load(run / "reference" / "calibration_outputs.npz")
        assert meta["data"]["special_only_texts"]["calibration"] == len(emoji_ids & set(cal.ids))
        assert meta["data"]["special_only_texts"]["calibration"] > 0
        assert "special tokens only (kept and judged)" in (run / "report.md").read_text()


@pytest.mark.parametrize("family,why", [("prune", "MarkerNet.readout needs marker_pos"),
                                        ("exit", "has no early-exit head kind")])
def test_a_family_that_cannot_apply_is_refused_before_anything_is_written(
        family, why, tmp_path, monkeypatch, capsys):
    """The marker model reads token positions: pruning and early exit refuse it in one line,
    exit 2, and no results folder appears."""
    monkeypatch.chdir(ROOT)
    code = main(["sweep", "--model-config", "examples/model-marker.toml", "--family", family,
                 "--results-dir", str(tmp_path / "r"), *TINY[:-5], "--timing-batch-sizes", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and why in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()

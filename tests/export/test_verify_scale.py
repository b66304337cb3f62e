"""``variants verify`` compares the recomputed logits with the judged ones relative to their
scale: a regression head whose values sit near 25,000 (a price) differs by float32 spacing there
(~0.002), which an absolute 1e-5 would call a different model (exit 1 on a fresh export)."""

import json

import mlx.core as mx
import numpy as np

from tests.models.head_fixtures import make_head_folder, model_toml, rows_jsonl
from variants.cli import main

FAST = ["--timing-rounds", "1", "--timing-warmup", "0", "--timing-budget-s", "0.5",
        "--cold-start", "none", "--timing-batch-sizes", "1", "--no-progress"]


def test_a_fresh_export_of_large_outputs_verifies(tmp_path):
    from runs.outputs import DecisionOutputs
    from variants.export.verify import TOLERANCE, verify

    ck = make_head_folder(tmp_path / "ck", 1, "regression", scale=300.0)
    w = mx.load(str(ck / "model.safetensors"))
    w["classifier.bias"] = mx.array([25000.0])
    mx.save_safetensors(str(ck / "model.safetensors"), w)
    model_toml(tmp_path / "m.toml", ck)
    rows_jsonl(tmp_path / "rows.jsonl", n=80, splits={"fit": 10, "calibration": 30, "eval": 40})
    assert main(["sweep", "--model-config", str(tmp_path / "m.toml"), "--data",
                 str(tmp_path / "rows.jsonl"), "--results-dir", str(tmp_path / "r"), "--run", "p",
                 "--bits", "8", *FAST]) == 0
    out = tmp_path / "exp"
    assert main(["export", str(tmp_path / "r" / "p"), "--variant", "q8-g64", "--out", str(out),
                 "--allow-fail"]) == 0
    judged = DecisionOutputs.load(out / "outputs.npz")
    scale = float(np.abs(judged.logits[judged.option_mask.astype(bool)]).max())
    assert scale > 24000  # the values are where float32 spacing is ~0.002
    res = verify(out, log=lambda m: None)
    assert res["tolerance"] == TOLERANCE * scale
    assert res["ok"] and res["max_abs_dlogit"] <= res["tolerance"]
    assert main(["verify", str(out)]) == 0

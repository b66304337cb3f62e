"""A default sweep on MPNet, DeBERTa-v3 and DeBERTa-v2 classifier folders (the tiny random-init
fixtures of tests/fixtures/hf/, judged with their own heads: ``logits = "classifier"``) reaches
a verdict, and an 8-bit variant exports, loads packed and verifies: the CLI path a user takes
with an ``MPNetForSequenceClassification`` / ``DebertaV2ForSequenceClassification`` folder."""

import json
from pathlib import Path

import mlx.nn as nn
import numpy as np
import pytest

HF = Path(__file__).parents[1] / "fixtures" / "hf"
ARCHS = {"mpnet": "MPNetEncoder", "deberta_v3": "DebertaEncoder", "deberta_v2": "DebertaEncoder"}
SMALL = ["--n-fit", "30", "--n-calibration", "30", "--n-eval", "30", "--timing-rounds", "1",
         "--timing-warmup", "0", "--timing-budget-s", "0.5", "--timing-batch-sizes", "1",
         "--cold-start", "none", "--bits", "8", "--no-progress"]
TOML = """name = "my-{name}-classifier"
logits = "classifier"
checkpoint = "{path}"
options = ["negative", "neutral", "positive"]
scores = [-1.0, 0.0, 1.0]
actions = ["escalate", "review", "none"]

[temperature]
mode = "fit"
"""


@pytest.fixture(scope="module", params=list(ARCHS))
def swept(request, tmp_path_factory):
    """(arch, run folder, exported q8-g64 folder): one sweep and one export per architecture."""
    from variants.cli import main

    name = request.param
    root = tmp_path_factory.mktemp(name)
    toml = root / "model.toml"
    toml.write_text(TOML.format(name=name, path=(HF / name).resolve()))
    assert main(["sweep", "--model-config", str(toml), *SMALL, "--results-dir", str(root),
                 "--run", "m"]) == 0
    out = root / "export"
    assert main(["export", str(root / "m"), "--variant", "q8-g64", "--out", str(out),
                 "--allow-fail"]) == 0
    return name, root / "m", out


def test_the_sweep_reaches_a_verdict(swept):
    name, run, _ = swept
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["failed_variants"] == {}
    assert meta["checkpoint"]["path"] == str((HF / name).resolve())
    verdict = json.loads((run / "q8-g64" / "verdict.json").read_text())
    assert verdict["outcome"] in ("pass", "fail") and verdict["clauses"]
    agreement = [c for c in verdict["clauses"] if c["id"] == "agreement"][0]
    assert agreement["n"] == 30 and 0 <= agreement["value"] <= 1


def test_the_export_loads_packed_and_verifies(swept):
    from variants.checkpoints.load import load_checkpoint
    from variants.export.verify import verify

    name, run, out = swept
    res = verify(out, log=lambda m: None)
    assert res["ok"] and res["changed"] == [] and res["max_abs_dlogit"] <= 1e-5
    ck = load_checkpoint(out)
    assert type(ck.encoder).__name__ == ARCHS[name]
    quantized = [p for p, m in ck.encoder.named_modules() if isinstance(m, nn.QuantizedLinear)]
    # every token Linear of every layer is packed at 8 bits (the position projections of
    # DeBERTa-v2 read a constant table and are not Linears)
    assert len(quantized) == 6 * len(ck.encoder.layers)
    assert all(m.bits == 8 for _, m in ck.encoder.named_modules()
               if isinstance(m, nn.QuantizedLinear))
    # the packed model is not the reference: its logits move, a little
    ref = load_checkpoint(HF / name)
    ids, mask, types = (np.asarray(a) for a in ref.tokenizer.batch(
        ref.tokenizer.encode(["a fine film", "slow and long, but good"])[0]))
    import mlx.core as mx

    args = [mx.array(a) for a in (ids, mask, types)]
    a = np.array(ref.classifier(ref.encoder(*args).last_hidden, args[1]))
    b = np.array(ck.classifier(ck.encoder(*args).last_hidden, args[1]))
    assert 0 < np.abs(a - b).max() < 0.05

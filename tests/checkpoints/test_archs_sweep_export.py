"""DistilBERT, ELECTRA, ALBERT, BERT, RoBERTa, XLM-R and ModernBERT checkpoints (the tiny
random-init folders of tests/fixtures/hf/) judged end to end through the CLI as a user would: a
model TOML with ``logits = "classifier"`` (the checkpoint's own head), a small data file with
one text far past the 128-token tables (truncated to them; ModernBERT's 512 cut to 128 by the
model TOML's ``max_length``: a sweep ~6x cheaper, and 128 tokens still reach past its local
layers' window of +-64), a default sweep (quant, every bit width) to a verdict,
then ``export`` of its 8-bit variant and ``verify`` of the exported folder. The reference
logits the sweep recorded are the checkpoint's own (load_checkpoint's forward on the same
texts), so the architecture the sweep ran is the one the parity tests check."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from runs.outputs import DecisionOutputs
from variants.checkpoints.load import load_checkpoint
from variants.cli import main

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"
ARCHS = ["distilbert", "electra", "albert", "bert", "roberta", "xlm_roberta", "modernbert"]
#: model TOML ``max_length`` (tokens) where the checkpoint's own limit is past 128
MAX_LENGTH = {"modernbert": 128}
TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none",
        "--timing-batch-sizes", "1", "--no-progress"]
LONG = " ".join(["the film was long and slow in places but the cast was great ."] * 25)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The example's rater rows, one eval row's text ~330 tokens long."""
    rows = [json.loads(x) for x in (ROOT / "examples" / "vader_raters.jsonl").read_text()
            .splitlines()]
    first_eval = next(r for r in rows if r.get("split") == "eval")
    first_eval["text"] = LONG
    path = tmp_path_factory.mktemp("data") / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, first_eval["id"]


@pytest.fixture(scope="module", params=ARCHS)
def judged(request, data, tmp_path_factory):
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    toml = root / "model.toml"
    cap = f"max_length = {MAX_LENGTH[arch]}\n" if arch in MAX_LENGTH else ""
    folder = HF / arch
    if arch == "xlm_roberta":  # named by architectures[0] alone: the export must name it
        folder = root / "ck"
        shutil.copytree(HF / arch, folder)
        cfg = json.loads((folder / "config.json").read_text())
        del cfg["model_type"]
        (folder / "config.json").write_text(json.dumps(cfg))
    toml.write_text(f'name = "my-{arch}"\nlogits = "classifier"\ncheckpoint = "{folder}"\n{cap}'
                    'options = ["negative", "neutral", "positive"]\n'
                    'scores = [-1.0, 0.0, 1.0]\nactions = ["escalate", "review", "none"]\n')
    assert main(["sweep", "--model-config", str(toml), "--data", str(data[0]),
                 "--results-dir", str(root / "r"), "--run", "m", *TINY]) == 0
    out = root / "export"
    assert main(["export", str(root / "r" / "m"), "--variant", "q8-g64", "--out", str(out),
                 "--allow-fail"]) == 0
    return arch, root / "r" / "m", out


def test_default_sweep_reaches_a_verdict_for_every_bit_width(judged):
    arch, run, _ = judged
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete"
    names = sorted(p.name for p in run.iterdir() if (p / "verdict.json").is_file())
    assert names == [f"q{b}-g64" for b in (2, 3, 4, 6, 8)]
    for n in names:
        v = json.loads((run / n / "verdict.json").read_text())
        assert v["outcome"] in ("pass", "fail") and v["clauses"], (arch, n, v["outcome"])


def test_the_sweeps_reference_logits_are_the_checkpoints_own(judged, data):
    arch, run, _ = judged
    ref = DecisionOutputs.load(run / "reference" / "outputs.npz")
    assert ref.logits.shape == (30, 3) and np.isfinite(ref.logits).all()
    texts = {r["id"]: r["text"] for r in map(json.loads, data[0].read_text().splitlines())}
    ck = load_checkpoint(HF / arch, max_length=(MAX_LENGTH[arch], "test") if arch in MAX_LENGTH
                         else None)
    encs, n_trunc = ck.tokenizer.encode([texts[i] for i in ref.ids])
    assert data[1] in set(ref.ids) and n_trunc == 1 and ck.tokenizer.max_length == 128
    ids, mask, types = (mx.array(a) for a in ck.tokenizer.batch(encs))
    assert ids.shape[1] == 128  # the long row fills the position table (ModernBERT: max_length)
    meta = json.loads((run / "run.json").read_text())["data"]
    assert meta["max_tokens"] == 128 and meta["truncated_texts"]["eval"] == 1, meta
    want = np.array(ck.classifier(ck.encoder(ids, mask, types).last_hidden, mask))
    assert np.abs(ref.logits - want).max() <= 1e-5


def test_export_and_verify_of_the_8_bit_variant(judged):
    from variants.export.verify import verify

    arch, _, out = judged
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == arch.replace("_", "-") and cfg["quantization"]["bits"] == 8
    assert cfg["mlx_variants"]["hf_head"]  # the head's tensors, pooler / pre_classifier included
    assert "`model_type` None" not in (out / "README.md").read_text()
    res = verify(out, log=lambda m: None)
    assert res["ok"] and res["changed"] == [] and res["max_abs_dlogit"] <= 1e-5
    assert res["n_rows"] == 30
    # the folder loads at the length it was judged at (ModernBERT: the model TOML's 128, not
    # its tokenizer files' 512)
    ck = load_checkpoint(out)
    assert ck.tokenizer.max_length == 128 and "judged at" in ck.tokenizer.decided["max_length"]
    assert cfg["mlx_variants"]["max_length"][0] == 128
    assert main(["verify", str(out)]) == 0

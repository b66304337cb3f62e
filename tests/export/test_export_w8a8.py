"""variants export of a w8a8 variant: its Int8Linears are stored (int8 codes, per-output-channel
scales, their row sums, SmoothQuant's 1/s) under the Linear's transformers name plus ``.wq`` /
``.w_scale`` / ``.colsum`` / ``.inv_smooth``; ``variants verify`` recomputes the judged logits
bit for bit, and ``load_checkpoint`` / ``load_variant`` rebuild the same modules from the file
(nothing quantized again)."""

import json

import numpy as np
import pytest

from tiny_run import TINY
from variants.cli import main



@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny judged w8a8 sweep of minilm-sentiment with SmoothQuant (α searched per input
    site, so some sites keep α = 0: Linears with and without factors), exported."""
    root = tmp_path_factory.mktemp("w8a8x")
    assert main(["sweep", *TINY, "--family", "w8a8", "--smooth", "on", "--results-dir",
                 str(root), "--run", "w"]) == 0
    out = root / "out"
    assert main(["export", str(root / "w"), "--variant", "w8a8-sq", "--out", str(out),
                 "--allow-fail"]) == 0
    return root / "w", out


def test_verify_is_bit_identical(exported, capsys):
    from variants.export.verify import verify

    _, out = exported
    res = verify(out, log=lambda m: None)
    assert res["ok"] and res["changed"] == [] and res["n_rows"] == 30
    assert res["max_abs_dlogit"] == 0.0  # the same int8 codes and kernel: exact
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0


def test_folder_stores_the_int8_state_the_run_built(exported):
    """The stored codes are the judged build's own: the same Int8Linear state as a fresh w8a8
    build of the reference (the family is deterministic), under transformers' names."""
    import mlx.core as mx

    from variants.export.source import locate, rebuild
    from variants.runtime.int8_linear import Int8Linear

    run, out = exported
    cfg = json.loads((out / "config.json").read_text())
    layers = cfg["mlx_variants"]["w8a8"]
    assert "quantization" not in cfg  # nothing for mlx-lm's loader to quantize
    assert len(layers) == 36 and all(e["native"] for e in layers.values())
    smooth = [p for p, e in layers.items() if e["smooth"]]
    assert 0 < len(smooth) < 36  # α searched per site: some keep plain W8A8
    file = mx.load(str(out / "model.safetensors"))
    name = "encoder.layer.0.intermediate.dense"
    assert "encoder.layer.0.intermediate.dense.weight" not in file  # replaced by its codes
    assert file[f"{name}.wq"].dtype == mx.int8 and file[f"{name}.wq"].shape == (1536, 384)
    assert file[f"{name}.w_scale"].shape == (1536,) and file[f"{name}.colsum"].dtype == mx.int32
    *_, built, _ = rebuild(locate(run, "w8a8-sq", allow_fail=True), log=lambda m: None)
    mods = dict(built.module.named_modules())
    for p, e in layers.items():
        m = mods[p]
        assert isinstance(m, Int8Linear) and ("inv_smooth" in m) == e["smooth"]
    m = mods["encoder.layers.0.intermediate"]
    assert mx.array_equal(m["wq"], file[f"{name}.wq"])
    assert mx.array_equal(m["w_scale"], file[f"{name}.w_scale"])
    assert mx.array_equal(m["colsum"], mx.sum(file[f"{name}.wq"].astype(mx.int32), axis=1))
    card = (out / "README.md").read_text()
    assert "`<name>.wq`" in card and "only this package's loaders read this folder" in card
    assert "nn.quantize" not in card and "mlx_embeddings.load" not in card


def test_load_checkpoint_and_load_variant_give_the_judged_logits(exported):
    import mlx.core as mx

    from runs.outputs import DecisionOutputs
    from variants.checkpoints.load import load_checkpoint
    from variants.export.load import load_variant
    from variants.export.write import load_taskset
    from variants.models.sentiment import SentimentNet
    from variants.runtime.int8_linear import Int8Linear

    _, out = exported
    file = mx.load(str(out / "model.safetensors"))
    ck = load_checkpoint(out)
    q = ck.encoder.layers[0].attention.query
    assert isinstance(q, Int8Linear) and q._native
    assert mx.array_equal(q["wq"], file["encoder.layer.0.attention.self.query.wq"])
    n8 = sum(isinstance(m, Int8Linear) for _, m in ck.encoder.named_modules())
    assert n8 == 36
    judged = np.asarray(DecisionOutputs.load(out / "outputs.npz", "judged").logits)
    ts = load_taskset(out / "eval_rows.npz")
    model, _ = load_variant(out)
    batches, _ = model.prepare(ts, 32)
    order = np.argsort(np.concatenate([b.index for b in batches]))
    net = SentimentNet(ck.encoder)
    net.head.load_weights([(k[5:], v) for k, v in
                           mx.load(str(out / "decision_head.safetensors")).items()], strict=True)
    got = np.concatenate([np.asarray(net(b.input_ids, b.attention_mask, b.token_type_ids))
                          for b in batches])[order]
    np.testing.assert_allclose(got, judged, rtol=0, atol=1e-5)


def test_a_w8a8_entry_that_does_not_fit_the_model_is_one_line(exported, tmp_path):
    import shutil

    from variants.checkpoints.files import CheckpointError
    from variants.export.load import load_variant

    _, out = exported
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["mlx_variants"]["w8a8"]["encoder.layers.0.attention.query"]["in"] = 7
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config.json does not match the model \(encoder"
                       r".layers.0.attention.query is not a \(384, 7\) Linear of the model\); "
                       "export the variant again"):
        load_variant(bad)

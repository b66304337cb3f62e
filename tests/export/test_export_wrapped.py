"""variants export of variants whose decision module is wrapped by a run-time rule: token pruning
(PrunedNet) and early exit (ExitNet) on minilm-sentiment and on the tiny random-init ModernBERT
(tests/fixtures/hf/modernbert, a model TOML as a user writes one; with w8a8 beside them). The
folder stores the wrapped module's weights as any variant's (8-bit packed inside the pruning
wrapper), the rule in ``mlx_variants.wrapper`` and the exit heads in
``decision_head.safetensors``; ``load_variant`` wraps the packed module back, so ``variants
verify`` recomputes the judged logits (bit for bit where the variant is not quantized) and the
loaded model's logits and exit layers are the built variant's, bit for bit; a sweep's cold start
loads the folder. A module the format cannot store is refused in one line."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_run import TINY, sweep_and_export

from variants.cli import main

ROOT = Path(__file__).resolve().parents[2]
PRUNE = ["--family", "prune", "--prune-layers", "2", "--keep-ratios", "0.5"]
COMPOSED = ["--family", "composed", "--compose"]
EXIT = ["--family", "exit", "--exit-rules", "entropy", "--exit-layers", "2", "4",
        "--exit-thresholds"]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """minilm-sentiment: an 8-bit pruned variant (its sweep's cold starts measured) and an
    fp32 early-exit variant, each judged and exported."""
    root = tmp_path_factory.mktemp("wrapped")
    cold = [a if a != "none" else "all" for a in TINY]
    return {"prune": sweep_and_export(root, "p", [*PRUNE, "--prune-bits", "8"], tiny=cold),
            "exit": sweep_and_export(root, "x", [*EXIT, "0.5"]),
            "composed": sweep_and_export(root, "c", [*COMPOSED, "+".join(
                ("w8a8", "emb:8", "prune:2:0.7", "exit:entropy:0.9", "exact:dedup"))])}


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    """The ModernBERT fixture judged through a model TOML (its own classifier head, 128
    tokens): a pruned, an early-exit and a w8a8 (SmoothQuant) variant, each exported."""
    root = tmp_path_factory.mktemp("wrapped-mb")
    toml = root / "model.toml"
    toml.write_text(f'name = "my-modernbert"\nlogits = "classifier"\ncheckpoint = '
                    f'"{ROOT / "tests" / "fixtures" / "hf" / "modernbert"}"\nmax_length = 128\n'
                    'options = ["negative", "neutral", "positive"]\n'
                    'scores = [-1.0, 0.0, 1.0]\nactions = ["escalate", "review", "none"]\n')
    base = ["--model-config", str(toml), "--data", str(ROOT / "examples" / "vader_raters.jsonl")]
    return {"prune": sweep_and_export(root, "p", [*base, *PRUNE]),
            # random init: nearly uniform heads, so a threshold that fires near 1
            "exit": sweep_and_export(root, "x", [*base, *EXIT, "0.99"]),
            "w8a8": sweep_and_export(root, "w", [*base, "--family", "w8a8"], "w8a8-sq"),
            "composed": sweep_and_export(root, "c", [*base, *COMPOSED,
                                                     "w8a8:sq+prune:2:0.5+exit:entropy:0.99"]),
            # every exportable family on ModernBERT: the weight-only quant one is
            # tests/checkpoints/test_archs_sweep_export.py's (every architecture)
            "lowrank": sweep_and_export(root, "l", [*base, "--family", "lowrank", "--methods",
                                                    "plain", "--ratios", "0.5"])}


@pytest.mark.parametrize("model, kind", [("minilm", "prune"), ("minilm", "exit"),
                                         ("modernbert", "prune"), ("modernbert", "exit"),
                                         ("modernbert", "w8a8"), ("minilm", "composed"),
                                         ("modernbert", "composed"), ("modernbert", "lowrank")])
def test_verify_recomputes_the_judged_logits(request, model, kind):
    from variants.export.verify import verify

    _, _, out = request.getfixturevalue(model)[kind]
    res = verify(out, log=lambda m: None)
    assert res["ok"] and res["changed"] == [] and res["n_rows"] == 30
    if (model, kind) in (("minilm", "prune"), ("modernbert", "lowrank")):
        # judged dequantized (or on the unfactored fp32 order), run packed: round-off
        assert res["max_abs_dlogit"] <= 1e-5
    else:  # the same fp32 (or int8) arithmetic as judged
        assert res["max_abs_dlogit"] == 0.0 and res["bit_identical"]
    block = json.loads((out / "config.json").read_text())["mlx_variants"]
    want = {"w8a8": None, "lowrank": None, "composed": "exit"}.get(kind, kind)
    assert (block["wrapper"] or {}).get("kind") == want
    if kind == "composed":  # pruning inside the exit loop; the recipe in the block
        assert block["wrapper"]["prune"]["points"] == [[2, 0.7 if model == "minilm" else 0.5]]
        assert block["family"] == "composed" and "w8a8" in block["variant_config"]["recipe"]
        assert block["w8a8"]  # the int8 Linears inside the wrappers


def test_a_composed_folder_loads_with_its_exact_piece(minilm):
    from variants.export.load import load_variant
    from variants.families.exact.build import ExactMixin

    _, _, out = minilm["composed"]
    model, _ = load_variant(out)
    assert isinstance(model, ExactMixin) and model.exact_cache is None  # dedup: no cache


def test_the_folder_stores_the_rule_and_the_heads(minilm):
    import mlx.core as mx

    _, _, out = minilm["prune"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mlx_variants"]["wrapper"] == {"kind": "prune", "points": [[2, 0.5]],
                                              "score": "received", "protected_ids": [101, 102]}
    assert cfg["quantization"]["bits"] == 8  # the wrapped module as any quant variant
    w = mx.load(str(out / "model.safetensors"))
    assert w["encoder.layer.0.attention.self.query.weight"].dtype == mx.uint32
    assert sorted(mx.load(str(out / "decision_head.safetensors"))) == ["head.bias",
                                                                       "head.weight"]
    run, name, out = minilm["exit"]
    block = json.loads((out / "config.json").read_text())["mlx_variants"]
    info = json.loads((run / name / "build.json").read_text())
    wrapper = block["wrapper"]
    assert {k: wrapper[k] for k in ("kind", "layers", "rule", "threshold", "head_kind")} == {
        "kind": "exit", "layers": [2, 4], "rule": "entropy", "threshold": 0.5,
        "head_kind": "linear"}
    assert wrapper["heads"] == [{"in": 384, "out": 3, "bias": True}] * 2
    assert wrapper["temperatures"] == block["temperatures"] and wrapper["prune"] is None
    own = mx.load(str(out / "decision_head.safetensors"))
    assert sorted(own) == ["exit_heads.0.bias", "exit_heads.0.weight", "exit_heads.1.bias",
                           "exit_heads.1.weight", "head.bias", "head.weight"]
    assert own["exit_heads.1.weight"].dtype == mx.float32
    assert info["exit_head_bytes"] == sum(v.nbytes for k, v in own.items()
                                          if k.startswith("exit_heads."))
    card = (out / "README.md").read_text()
    assert "rule `entropy` at threshold 0.5" in card
    assert "only this package's `load_variant` runs it" in card


@pytest.mark.parametrize("kind", ["prune", "exit"])
def test_load_variant_is_the_built_variant_bit_for_bit(minilm, kind):
    """load_variant's model gives the logits and exit layers of the variant export built
    (packed, native), bit for bit, on the eval rows; load_checkpoint reads the weights alone."""
    from runs.outputs import DecisionOutputs
    from variants.checkpoints.load import load_checkpoint
    from variants.export.load import load_variant
    from variants.export.source import locate, rebuild
    from variants.export.write import load_taskset
    from variants.families.exit.net import ExitNet
    from variants.families.prune.build import PrunedNet

    run, name, out = minilm[kind]
    *_, built, _ = rebuild(locate(run, name, allow_fail=True), log=lambda m: None)
    loaded, ck = load_variant(out)
    assert type(loaded.module) is {"prune": PrunedNet, "exit": ExitNet}[kind]
    assert ck.encoder is loaded.module.base.encoder
    ts = load_taskset(out / "eval_rows.npz")
    a = built.outputs(ts, built.prepare(ts, 8)[0])
    b = loaded.outputs(ts, loaded.prepare(ts, 8)[0])
    np.testing.assert_array_equal(a.logits, b.logits)
    judged = DecisionOutputs.load(out / "outputs.npz")
    if kind == "exit":
        np.testing.assert_array_equal(a.exit_layer, b.exit_layer)
        np.testing.assert_array_equal(judged.exit_layer, b.exit_layer)
        assert set(b.exit_layer.tolist()) > {6}  # some rows leave early, some run every layer
    plain = load_checkpoint(out)  # the weights without the rule
    assert type(plain.encoder) is type(ck.encoder)


def test_the_sweeps_cold_start_loads_the_wrapped_folder(minilm):
    run, name, _ = minilm["prune"]
    cold = json.loads((run / name / "timing.json").read_text())["cold_start"]
    assert cold["source"] == "exported artifact" and "artifact_error" not in cold
    assert cold["build_s"] == 0.0 and cold["artifact_bytes"] > 0


def test_a_quant_variant_with_int8_layers_exports_and_verifies(tmp_path):
    """--int8-layers: the matching Linears as W8A8 (mlx_variants.w8a8), the others packed at
    4 bits; verify recomputes the judged logits bit for bit (judged on the int8 model)."""
    from variants.export.verify import verify

    _, name, out = sweep_and_export(tmp_path, "q", ["--bits", "4", "--int8-layers",
                                                    "intermediate"])
    assert name.startswith("q4-g64-int8-")
    cfg = json.loads((out / "config.json").read_text())
    assert sorted(cfg["mlx_variants"]["w8a8"]) == [f"encoder.layers.{i}.intermediate"
                                                   for i in range(6)]
    assert cfg["quantization"]["bits"] == 4 and cfg["mlx_variants"]["wrapper"] is None
    res = verify(out, log=lambda m: None)
    assert res["ok"] and res["max_abs_dlogit"] == 0.0
    assert main(["verify", str(out)]) == 0


def test_a_tampered_rule_or_an_unknown_wrapper_is_refused_in_one_line(minilm, tmp_path, capsys):
    import mlx.nn as nn

    from variants.families.prune.build import PrunedNet
    from variants.families.wrapper_place import wrapper_block

    _, _, out = minilm["exit"]
    copy = tmp_path / "c"
    shutil.copytree(out, copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["mlx_variants"]["wrapper"]["heads"].append({"in": 384, "out": 3, "bias": True})
    cfg["mlx_variants"]["wrapper"]["layers"].append(5)
    (copy / "config.json").write_text(json.dumps(cfg))
    from variants.checkpoints.files import CheckpointError
    from variants.export.load import load_variant

    with pytest.raises(CheckpointError) as e:
        load_variant(copy)
    assert "exit_heads.2.weight is missing (config.json lists exit head 2)" in str(e.value)
    assert len(str(e.value).splitlines()) == 1

    class Other(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base

    inner = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="^the decision module is a Other wrapping a model"):
        wrapper_block(Other(inner))
    with pytest.raises(ValueError, match="^a PrunedNet wraps a PrunedNet; a weights folder"):
        wrapper_block(PrunedNet(PrunedNet(inner, [(1, 0.5)]), [(1, 0.5)]))
    assert wrapper_block(inner) == (inner, None, {})


@pytest.mark.parametrize("edit, says", [
    (lambda w, b: w.update(prune="yes"), "wrapper's prune is not a {points"),
    (lambda w, b: w["prune"].update(score="nope"), "wrapper's prune is not a {points"),
    (lambda w, b: w.update(head_kind="mlp"), "head kind 'mlp' is not one of"),
    (lambda w, b: w["prune"].update(points=[[9, 0.5]]), "prunes after layer 9, outside [1, 6)"),
    (lambda w, b: w["prune"].update(points=[[3, 0.7]]),
     "the recipe prunes at [[2, 0.7]], the wrapper at [[3, 0.7]]"),
    (lambda w, b: b.update(wrapper=None),
     "exit_heads.0.bias is stored but config.json has no wrapper"),
    (lambda w, b: b["variant_config"].update(recipe="garbage"),
     "its recipe is not one --compose reads"),
])
def test_a_composed_folder_whose_rule_was_edited_is_refused(minilm, tmp_path, edit, says):
    """config.json edited (the manifest aside: load_variant alone): one line, naming what
    does not match and to export again; never a model other than the one judged."""
    from variants.checkpoints.files import CheckpointError
    from variants.export.load import load_variant

    _, _, out = minilm["composed"]
    copy = tmp_path / "c"
    shutil.copytree(out, copy)
    cfg = json.loads((copy / "config.json").read_text())
    block = cfg["mlx_variants"]
    edit(block["wrapper"], block)
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        load_variant(copy)
    assert says in str(e.value) and "export the variant again" in str(e.value)
    assert len(str(e.value).splitlines()) == 1

"""Issue #40: an exported folder names its tensors as the original checkpoint does
(transformers' names, so MLX's own loaders read it), keeps every tensor the checkpoint had
(MiniLM's pooler included), and still loads when written in the old layout (module paths).

Every architecture with a folder under tests/fixtures/hf/ (picked up as folders are added), and
the bundled MiniLM: the unchanged reference written as a weights folder is the checkpoint, name
for name and bit for bit; a 4-bit variant (embeddings and head quantized) has exactly the
checkpoint's names plus ``.scales`` / ``.biases`` beside each packed ``.weight``, its
``quantization`` block keyed by transformers module paths, and loads back to the same logits.
A tiny judged BERT classifier run, exported, loads in plain MLX by the model card's own recipe
(exec'd as written) to the judged logits; ``variants verify`` passes on it and on the same
folder rewritten in the old layout."""

import json
import re
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

HF = Path(__file__).parents[1] / "fixtures" / "hf"
FOLDERS = sorted(p.name for p in HF.iterdir() if (p / "config.json").is_file()
                 and (p / "model.safetensors").is_file())
IDS = np.array([[2, 40, 41, 42, 43, 44, 45, 3], [2, 50, 51, 52, 3, 0, 0, 0]], np.int32)
QUANT = dict(bits=4, group_size=32, quantize_embeddings=True, quantize_head=True)


def _source_keys(folder):
    from safetensors import safe_open

    with safe_open(str(Path(folder) / "model.safetensors"), framework="numpy") as st:
        return set(st.keys())


def _forward(model):
    ids = mx.array(IDS)
    mask = mx.array((IDS != 0).astype(np.int32))
    return np.asarray(model.module(ids, mask, mx.zeros(ids.shape, dtype=mx.int32)))


def _reference(name, tmp):
    """(decision model, checkpoint, model source) of fixture ``name`` ("minilm": the bundled
    MiniLM, linear-head): the checkpoint's own head when it has one, else the cosine kind."""
    from variants.checkpoints.load import load_checkpoint
    from variants.models import resolve

    if name == "minilm":
        ck, source = load_checkpoint(), resolve(model="minilm-sentiment")
    else:
        ck = load_checkpoint(HF / name)
        kind = ('logits = "classifier"' if ck.classifier is not None else
                'logits = "cosine"\noptions = ["bad", "so-so", "good"]')
        toml = tmp / f"{name}.toml"
        toml.write_text(f'name = "t-{name}"\n{kind}\ncheckpoint = "{HF / name}"\n')
        source = resolve(model_config=toml)
    source.bind(ck)
    return source.build(ck), ck, source


def _write(model, ck, source, out):
    from variants.families.artifact import write_weights

    out.mkdir()
    return write_weights(model, ck, source, out, family="quant", variant=out.name,
                         variant_config={})


@pytest.fixture(scope="module", params=FOLDERS + ["minilm"])
def written(request, tmp_path_factory):
    """Fixture ``name``'s reference and its 4-bit variant, each written as a weights folder."""
    from variants.families import get_family
    from variants.families.family import BuildInputs
    from variants.families.quant.config import QuantConfig

    tmp = tmp_path_factory.mktemp(request.param)
    model, ck, source = _reference(request.param, tmp)
    variant, _ = get_family("quant").build(model, QuantConfig(**QUANT), BuildInputs(),
                                           mode="native")
    out = {"reference": tmp / "reference", "q4": tmp / "q4"}
    cfg = {"reference": _write(model, ck, source, out["reference"]),
           "q4": _write(variant, ck, source, out["q4"])}
    src = ck.path / "model.safetensors"
    return dict(name=request.param, src=src, out=out, cfg=cfg,
                logits={"reference": _forward(model), "q4": _forward(variant)})


def test_the_unchanged_reference_is_the_checkpoint_name_for_name(written):
    """Every tensor of the checkpoint (a pooler the model does not run, buffers such as
    position_ids included), under its own name, bit for bit; nothing else."""
    source = mx.load(str(written["src"]))
    got = mx.load(str(written["out"]["reference"] / "model.safetensors"))
    assert sorted(got) == sorted(source)
    for k, v in source.items():
        assert got[k].dtype == v.dtype and mx.array_equal(got[k], v), k
    block = written["cfg"]["reference"]["mlx_variants"]
    assert "quantization" not in written["cfg"]["reference"]
    if written["name"] == "minilm":  # BertModel: the pooler and a buffer the model never reads
        assert block["kept"] == ["embeddings.position_ids", "pooler.dense.bias",
                                 "pooler.dense.weight"]
        assert block["decision_head"] == "decision_head.safetensors"
    elif written["name"] in ("bert", "roberta", "modernbert", "modernbert_g2"):
        assert block["kept"] == [] and block["decision_head"] is None  # every tensor is read


def test_a_quantized_variant_has_the_checkpoint_s_names(written):
    """The 4-bit variant's file: the checkpoint's names exactly, plus ``<module>.scales`` /
    ``.biases`` beside each packed uint32 ``<module>.weight``; the quantization block's entries
    are transformers module paths; it loads back (load_variant, load_checkpoint) to the
    variant's logits."""
    from variants.checkpoints.load import load_checkpoint
    from variants.families.artifact import load_variant

    source = _source_keys(written["src"].parent)
    out = written["out"]["q4"]
    got = mx.load(str(out / "model.safetensors"))
    scales = {k[:-len(".scales")] for k in got if k.endswith(".scales")}
    assert scales and {k[:-len(".biases")] for k in got if k.endswith(".biases")} == scales
    assert set(got) - {f"{m}.{s}" for m in scales for s in ("scales", "biases")} == source
    for m in scales:
        assert f"{m}.weight" in source and got[f"{m}.weight"].dtype == mx.uint32
    q = written["cfg"]["q4"]["quantization"]
    assert (q["group_size"], q["bits"], q["mode"]) == (32, 4, "affine")
    assert all(f"{k}.weight" in source for k in q if k not in ("group_size", "bits", "mode"))
    model, _ = load_variant(out)
    np.testing.assert_array_equal(_forward(model), written["logits"]["q4"])
    ck = load_checkpoint(out)
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in ck.encoder.named_modules())


def test_shared_layers_are_one_tensor_unless_the_variant_split_them():
    """ALBERT-style sharing (one stored tensor, several module paths): equal copies are stored
    once and put back at every path; copies the variant changed differently are refused in one
    line, as is a different quantization of them."""
    from variants.checkpoints.hf_names import invert, paths_of, split
    from variants.families.artifact import quantization_blocks

    names = {"encoder.layers.0.q": "albert.shared.q", "encoder.layers.1.q": "albert.shared.q"}
    w = mx.arange(6, dtype=mx.float32).reshape(2, 3)
    named, own = split({"encoder.layers.0.q.weight": w, "encoder.layers.1.q.weight": w + 0,
                        "head.weight": w}, names)
    assert list(named) == ["albert.shared.q.weight"] and list(own) == ["head.weight"]
    assert paths_of("albert.shared.q.scales", invert(names)) == [
        "encoder.layers.0.q.scales", "encoder.layers.1.q.scales"]
    with pytest.raises(ValueError, match="share the checkpoint's tensor albert.shared.q.weight"):
        split({"encoder.layers.0.q.weight": w, "encoder.layers.1.q.weight": w + 1}, names)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(64, 64)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [Layer(), Layer()]

    two = nn.Module()
    two.encoder = Encoder()
    nn.quantize(two, 32, 4, class_predicate=lambda p, m: p.startswith("encoder.layers.0"))
    with pytest.raises(ValueError, match="quantized differently") as e:
        quantization_blocks(two, names)
    assert "\n" not in str(e.value)


TINY = ["--model-config", "examples/model-bert-classifier.toml", "--n-fit", "40",
        "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1", "--timing-warmup",
        "0", "--timing-budget-s", "0.5", "--cold-start", "none", "--timing-batch-sizes", "1",
        "--no-progress", "--contract", "lenient", "--bits", "4", "--group-size", "32"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny judged run of the committed random-init BertForSequenceClassification at 4 bits
    (round to nearest), its variant exported."""
    from variants.cli import main

    root = tmp_path_factory.mktemp("bert")
    assert main(["sweep", *TINY, "--results-dir", str(root), "--run", "b"]) == 0
    out = root / "export"
    assert main(["export", str(root / "b"), "--variant", "q4-g32", "--out", str(out),
                 "--allow-fail"]) == 0
    return out


def test_quantized_bert_loads_in_plain_mlx_by_the_card_s_recipe(bert):
    """The card names the architecture and its loaders; its recipe, run as written with a
    transformers-named BertForSequenceClassification port (tests/export/plain_bert.py), gives
    the judged logits within 1e-5; mx.load gives the checkpoint's names."""
    import plain_bert
    from runs.outputs import DecisionOutputs
    from variants.export.load import load_variant
    from variants.export.write import load_taskset

    card = (bert / "README.md").read_text()
    assert "Architecture: `BertForSequenceClassification` (`model_type` bert)" in card
    assert "- plain MLX, with the recipe below" in card
    assert "not mlx-embeddings 0.1.0: it has no `BertForSequenceClassification` class" in card
    file = mx.load(str(bert / "model.safetensors"))
    names = set(file)
    assert file["bert.encoder.layer.0.attention.self.query.weight"].dtype == mx.uint32
    assert "bert.encoder.layer.0.attention.self.query.scales" in names
    # the pooler is the head's (by role: full precision), under its own name
    assert file["bert.pooler.dense.weight"].dtype == mx.float32
    assert {k for k in names if not k.endswith((".scales", ".biases"))} == \
        _source_keys(HF / "bert")
    recipe = re.search(r"```python\n(import json\n.*?)```", card, re.S).group(1)
    scope = {"MyBertForSequenceClassification": plain_bert.BertForSequenceClassification}
    exec(recipe.replace("THIS_FOLDER", str(bert)), scope)
    net = scope["model"]
    assert isinstance(net.bert.encoder.layer[0].attention.self.query, nn.QuantizedLinear)
    assert type(net.classifier) is nn.Linear  # the head kept full precision (by role)
    model, _ = load_variant(bert)
    ts = load_taskset(bert / "eval_rows.npz")
    batches, _ = model.prepare(ts, 32)
    order = np.argsort(np.concatenate([b.index for b in batches]))
    plain = np.concatenate([np.asarray(net(b.input_ids, b.attention_mask, b.token_type_ids))
                            for b in batches])[order]
    judged = np.asarray(DecisionOutputs.load(bert / "outputs.npz", "judged").logits)
    np.testing.assert_allclose(plain, judged, rtol=0, atol=1e-5)


def _old_layout(folder, dest):
    """``folder`` rewritten as ``variants export`` wrote it before transformers' names: every
    parameter of the decision model under its module path in model.safetensors, the
    quantization block keyed by module paths, format_version 1, no names / kept / decision
    head; the manifest re-signed."""
    from mlx.utils import tree_flatten

    from variants.export.write import sha256
    from variants.families.artifact import load_variant, quantization_blocks

    model, _ = load_variant(folder)
    shutil.copytree(folder, dest)
    (dest / "decision_head.safetensors").unlink(missing_ok=True)
    mx.save_safetensors(str(dest / "model.safetensors"),
                        dict(tree_flatten(model.module.parameters())), metadata={"format": "mlx"})
    cfg = json.loads((dest / "config.json").read_text())
    block, own = quantization_blocks(model.module, {})
    cfg["quantization"] = {**block, **own}
    for k in ("names", "kept", "decision_head", "head_quantization"):
        del cfg["mlx_variants"][k]
    cfg["mlx_variants"].update(format_version=1,
                               weights_sha256=sha256(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    m = json.loads((dest / "manifest.json").read_text())
    m["files"] = {f: sha256(dest / f) for f in m["files"] if (dest / f).exists()}
    (dest / "manifest.json").write_text(json.dumps(m, indent=2))
    return dest


def test_both_layouts_load_and_verify(bert, tmp_path):
    """``variants verify`` passes on the new folder and on the same variant in the old layout
    (module paths: ``encoder.layers.0.attention.query.weight``); load_checkpoint reads both
    to the same encoder and head; the old folder as a reference names its tensors as itself."""
    from variants.checkpoints.hf_names import checkpoint_names
    from variants.checkpoints.load import load_checkpoint
    from variants.export.verify import verify

    old = _old_layout(bert, tmp_path / "old")
    assert "encoder.layers.0.attention.query.scales" in mx.load(str(old / "model.safetensors"))
    for folder in (bert, old):
        res = verify(folder, log=lambda m: None)
        assert res["ok"] and res["changed"] == [] and res["max_abs_dlogit"] <= 1e-5, folder
    a, b = load_checkpoint(bert), load_checkpoint(old)
    for (pa, va), (pb, vb) in zip(sorted(_flat(a)), sorted(_flat(b))):
        assert pa == pb and mx.array_equal(va, vb), pa
    names, _, kept, head = checkpoint_names(b, with_head=True)
    assert names == {"classifier": "classifier", "encoder": "encoder"} and kept == []
    assert head == json.loads((bert / "config.json").read_text())["mlx_variants"]["hf_head"]
    names, _, kept, _ = checkpoint_names(a, with_head=True)
    assert names == json.loads((bert / "config.json").read_text())["mlx_variants"]["names"]


def _flat(ck):
    from mlx.utils import tree_flatten

    return ([("encoder." + p, v) for p, v in tree_flatten(ck.encoder.parameters())]
            + [("classifier." + p, v) for p, v in tree_flatten(ck.classifier.parameters())])


@pytest.mark.parametrize("edit, says", [
    (lambda b: b.update(names=["encoder"]), "mlx_variants.names, .kept or .head_quantization "
                                            "is not what export writes"),
    (lambda b: b.update(kept="pooler"), "is not what export writes"),
    (lambda b: b["names"].pop("encoder.layers.0.attention.query"),
     "holds 'bert.encoder.layer.0.attention.self.query.bias', which config.json's "
     "mlx_variants.names places nowhere"),
])
def test_a_bad_names_map_is_refused_in_one_line_by_both_loaders(bert, tmp_path, edit, says):
    from variants.checkpoints.files import CheckpointError
    from variants.checkpoints.load import load_checkpoint
    from variants.export.load import load_variant

    folder = tmp_path / "x"
    shutil.copytree(bert, folder)
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg["mlx_variants"])
    (folder / "config.json").write_text(json.dumps(cfg))
    for load in (load_checkpoint, load_variant):
        with pytest.raises(CheckpointError) as e:
            load(folder)
        msg = str(e.value)
        assert says in msg and "\n" not in msg and msg.endswith("export the variant again")


@pytest.mark.parametrize("kind", ["minilm-choice", "examples/model-marker.toml",
                                  "examples.own_model:build"])
def test_every_model_kind_round_trips_under_the_checkpoint_s_names(kind, tmp_path):
    """The cosine kind (no head of its own), the marker kind (a fitted ``scorer``) and a
    factory network (its own ``proto``): model.safetensors has MiniLM's names (plus
    ``.scales`` / ``.biases``), what the decision model adds is in decision_head.safetensors by
    module path, and load_variant puts back every parameter, path for path, bit for bit."""
    from mlx.utils import tree_flatten

    from variants.checkpoints.load import load_checkpoint, minilm_path
    from variants.families import get_family
    from variants.families.artifact import load_variant
    from variants.families.family import BuildInputs
    from variants.families.quant.config import QuantConfig
    from variants.models import resolve

    source = resolve(model_config=kind) if kind.endswith(".toml") else resolve(model=kind)
    ck = load_checkpoint()
    source.bind(ck)
    variant, _ = get_family("quant").build(source.build(ck), QuantConfig(bits=8),
                                           BuildInputs(), mode="native")
    cfg = _write(variant, ck, source, tmp_path / "v")
    got = mx.load(str(tmp_path / "v" / "model.safetensors"))
    assert {k for k in got if not k.endswith((".scales", ".biases"))} == \
        _source_keys(minilm_path())
    own = {"minilm-choice": None, "examples/model-marker.toml": ["scorer.bias", "scorer.weight"],
           "examples.own_model:build": ["proto.bias", "proto.weight"]}[kind]
    assert cfg["mlx_variants"]["decision_head"] == (own and "decision_head.safetensors")
    if own:
        assert sorted(mx.load(str(tmp_path / "v" / "decision_head.safetensors"))) == own
    model, _ = load_variant(tmp_path / "v")
    a = dict(tree_flatten(variant.module.parameters()))
    b = dict(tree_flatten(model.module.parameters()))
    assert sorted(a) == sorted(b)
    for p in a:
        assert a[p].dtype == b[p].dtype and mx.array_equal(a[p], b[p]), p

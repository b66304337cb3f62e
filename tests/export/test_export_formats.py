"""Issue 42: the new storage formats written by ``write_weights`` (what ``variants export``
writes) and read back by both loaders (``load_variant``, ``load_checkpoint``) as they were
judged: half-precision scales and biases (float16 / bfloat16 in the file, read through the
float32 round trip of formats.dequantize), the microscaling modes (mlx-lm's ``mode`` key in
the ``quantization`` block, one per module that differs), and a word-embedding table stored by
use (:class:`variants.runtime.row_embedding.RowWidthEmbedding`, the
``mlx_variants.row_embedding`` block). Each variant is built by hand from the fixture BERT
(tests/fixtures/hf/bert, hidden 64, 4 layers); its logits are checked against the simulated
model (every stored weight replaced by ``formats.round_trip`` of the fp32 one)."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from test_export_names import _forward, _reference, _write

from variants.layer_maps import formats as F

F16 = F.Format(4, 32, "affine", "float16")
BF16 = F.Format(8, 32, "affine", "bfloat16")
MXFP4, NVFP4, MXFP8 = F.of("mxfp4", 32), F.of("nvfp4", 32), F.of("mxfp8", 32)
ROWS = [F.Format(8, 32, "affine", "float16"), F.Format(4, 32, "affine", "float16"),
        F.Format(2, 32, "affine", "float16"), MXFP4]


def _plan(kind, module):
    """{path: Format} of variant ``kind``: every encoder Linear and embedding table."""
    out = {}
    for p, m in module.named_modules():
        if not p.startswith("encoder.") or type(m) not in (nn.Linear, nn.Embedding):
            continue
        if kind == "half":  # fp16 scales, the word table bf16 at 8 bits
            out[p] = BF16 if p.endswith("word_embeddings") else F16
        elif kind == "mx":  # mxfp4, layer 0's query nvfp4, the word table mxfp8
            out[p] = (NVFP4 if p == "encoder.layers.0.attention.query" else
                      MXFP8 if p.endswith("word_embeddings") else MXFP4)
    return out


def _simulated(kind, tmp):
    """The reference with every planned weight replaced by its round trip (fp32 layers), and
    the row map for ``rows``."""
    model, _, _ = _reference("bert", tmp)
    plan = _plan(kind, model.module)
    mods = dict(model.module.named_modules())
    for p, fmt in plan.items():
        mods[p].weight = F.round_trip(mods[p].weight, fmt)
    if kind == "rows":
        w = mods["encoder.embeddings.word_embeddings"]
        rf = np.arange(w.weight.shape[0]) % len(ROWS)
        rf[:100] = 0  # the first ids (specials, frequent words) widest
        w.weight = mx.concatenate([F.round_trip(w.weight[i:i + 1], ROWS[rf[i]])
                                   for i in range(w.weight.shape[0])])
    return model


def _variant(kind, tmp):
    """The packed variant: ``nn.quantize`` with per-module settings, scales then cast to the
    plan's dtype, or the word table replaced by a RowWidthEmbedding; on the CPU path."""
    from variants.runtime.row_embedding import RowWidthEmbedding
    from variants.runtime import qlinear

    model, ck, source = _reference("bert", tmp)
    plan = _plan(kind, model.module)

    def setting(p, m):
        f = plan.get(p)
        return False if f is None else {"group_size": f.group_size, "bits": f.bits,
                                        "mode": f.mode}
    nn.quantize(model.module, class_predicate=setting)
    mods = dict(model.module.named_modules())
    for p, f in plan.items():
        if f.mode == "affine" and f.scale_dtype != "float32":
            dt = getattr(mx, f.scale_dtype)
            mods[p].scales, mods[p].biases = mods[p].scales.astype(dt), mods[p].biases.astype(dt)
    if kind == "rows":
        w = mods["encoder.embeddings.word_embeddings"]
        rf = np.arange(w.weight.shape[0]) % len(ROWS)
        rf[:100] = 0
        model.module.encoder.embeddings.word_embeddings = RowWidthEmbedding.from_embedding(
            w, rf, ROWS)
    qlinear.use_cpu_path(model.module)
    return model, ck, source


@pytest.fixture(scope="module", params=["half", "mx", "rows"])
def written(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    model, ck, source = _variant(request.param, tmp)
    cfg = _write(model, ck, source, tmp / "v")
    return dict(kind=request.param, out=tmp / "v", cfg=cfg, model=model, source=source,
                logits=_forward(model), simulated=_forward(_simulated(request.param, tmp)),
                reference=_forward(_reference("bert", tmp)[0]))


def test_the_variant_is_its_simulated_form(written):
    """Half-precision scales and rows stored by use: the float32 round trip, to GEMM round-off
    (bit for bit here); the microscaling modes: MLX's quantized_matmul, to its round-off."""
    atol = 1e-4 if written["kind"] == "mx" else 1e-6
    np.testing.assert_allclose(written["logits"], written["simulated"], rtol=0, atol=atol)
    assert np.abs(written["logits"] - written["reference"]).max() > 1e-4  # a real change


def test_the_file_stores_what_was_judged(written):
    got = mx.load(str(written["out"] / "model.safetensors"))
    q = written["cfg"].get("quantization")
    if written["kind"] == "half":
        assert got["bert.encoder.layer.0.attention.self.query.scales"].dtype == mx.float16
        assert got["bert.encoder.layer.0.attention.self.query.biases"].dtype == mx.float16
        assert got["bert.embeddings.word_embeddings.scales"].dtype == mx.bfloat16
        assert (q["group_size"], q["bits"], q["mode"]) == (32, 4, "affine")
        assert q["bert.embeddings.word_embeddings"] == {"group_size": 32, "bits": 8}
    elif written["kind"] == "mx":
        assert (q["group_size"], q["bits"], q["mode"]) == (32, 4, "mxfp4")
        assert q["bert.encoder.layer.0.attention.self.query"] == {
            "group_size": 16, "bits": 4, "mode": "nvfp4"}
        assert q["bert.embeddings.word_embeddings"] == {"group_size": 32, "bits": 8,
                                                        "mode": "mxfp8"}
        assert got["bert.encoder.layer.1.output.dense.scales"].dtype == mx.uint8
        assert "bert.encoder.layer.1.output.dense.biases" not in got
    else:
        block = written["cfg"]["mlx_variants"]["row_embedding"]
        spec = block["encoder.embeddings.word_embeddings"]
        assert [(t["bits"], t["mode"], t["scale_dtype"]) for t in spec["tables"]] == [
            (8, "affine", "float16"), (4, "affine", "float16"), (2, "affine", "float16"),
            (4, "mxfp4", "float32")]
        assert sum(t["rows"] for t in spec["tables"]) == spec["vocab"] == 2968
        name = "bert.embeddings.word_embeddings"
        assert got[f"{name}.row_table"].dtype == mx.uint8
        assert got[f"{name}.row_index"].dtype == mx.int32
        assert got[f"{name}.tables.0.scales"].dtype == mx.float16
        assert f"{name}.weight" not in got and f"{name}.tables.3.biases" not in got
        stored = sum(v.nbytes for k, v in got.items() if k.startswith(name + "."))
        assert stored == written["model"].module.encoder.embeddings.word_embeddings.nbytes
        assert q is None  # nothing else quantized
        # the card's recipe in plain MLX: t, r = row_table[ids], row_index[ids], row r of
        # table t through mx.dequantize with float32 scales
        ids = [0, 5, 101, 102, 103, 2967]
        table = written["model"].module.encoder.embeddings.word_embeddings
        for i in ids:
            t, r = int(got[f"{name}.row_table"][i]), int(got[f"{name}.row_index"][i])
            e = spec["tables"][t]
            pre = f"{name}.tables.{t}."
            b = got.get(pre + "biases")
            row = mx.dequantize(got[pre + "weight"][r:r + 1],
                                got[pre + "scales"][r:r + 1].astype(mx.float32)
                                if e["mode"] == "affine" else got[pre + "scales"][r:r + 1],
                                None if b is None else b[r:r + 1].astype(mx.float32),
                                group_size=e["group_size"], bits=e["bits"], mode=e["mode"],
                                dtype=mx.float32)
            assert mx.array_equal(row[0], table(mx.array([i]))[0]), i
        assert {int(got[f"{name}.row_table"][i]) for i in ids} == {0, 1, 2, 3}


def test_both_loaders_give_the_judged_logits(written):
    from mlx.utils import tree_flatten

    from variants.checkpoints.load import load_checkpoint
    from variants.families.artifact import load_variant
    from variants.runtime.row_embedding import RowWidthEmbedding
    from variants.runtime.qembedding import Fp32QuantizedEmbedding
    from variants.runtime.qlinear import CpuQuantizedLinear, refuse_packed

    model, _ = load_variant(written["out"])
    np.testing.assert_array_equal(_forward(model), written["logits"])
    a = dict(tree_flatten(written["model"].module.parameters()))
    b = dict(tree_flatten(model.module.parameters()))
    assert sorted(a) == sorted(b)
    for p in a:
        assert a[p].dtype == b[p].dtype and mx.array_equal(a[p], b[p]), p
    ck = load_checkpoint(written["out"])
    again = written["source"].build(ck)
    np.testing.assert_array_equal(_forward(again), written["logits"])
    emb = ck.encoder.embeddings.word_embeddings
    want = {"half": Fp32QuantizedEmbedding, "mx": Fp32QuantizedEmbedding,
            "rows": RowWidthEmbedding}[written["kind"]]
    assert type(emb) is want
    with pytest.raises(ValueError, match="^the checkpoint's layer .* is already quantized"):
        refuse_packed(ck.encoder, "quant")  # a family that builds from fp32 weights
    assert type(ck.encoder.layers[0].attention.query) is (
        nn.Linear if written["kind"] == "rows" else CpuQuantizedLinear)


def test_half_precision_rows_read_back_in_float32():
    """nn.QuantizedEmbedding on fp16 scales computes its rows in half precision (and bfloat16
    for mxfp4); the loaders' table gives formats.dequantize's float32 rows."""
    from variants.runtime.qembedding import use_fp32_rows

    mx.random.seed(3)
    w = mx.random.normal((50, 64))
    ids = mx.array([[0, 7, 49], [3, 3, 1]])
    for fmt in (F16, MXFP4):
        q, s, b = F.quantize(w, fmt)
        e = nn.QuantizedEmbedding(50, 64, group_size=fmt.group_size, bits=fmt.bits,
                                  mode=fmt.mode)
        e.weight, e.scales = q, s
        if b is not None:
            e.biases = b
        plain = e(ids)
        assert plain.dtype == (mx.float16 if fmt.mode == "affine" else mx.bfloat16)
        use_fp32_rows(e)
        got = e(ids)
        assert got.dtype == mx.float32
        assert mx.array_equal(got, F.dequantize(q, s, b, fmt)[ids])
        if fmt.mode == "affine":  # half precision is ~1e-3 away at 4 bits
            assert 1e-5 < float(mx.abs(plain.astype(mx.float32) - got).max()) < 1e-2


def test_the_card_says_how_plain_mlx_reads_it(written):
    from variants.export.card_load import section
    from variants.export.write import half_scales

    cfg = written["cfg"]
    facts = {"architecture": "BertForSequenceClassification", "model_type": "bert",
             "names": cfg["mlx_variants"]["names"], "quantization": cfg.get("quantization"),
             "row_embedding": cfg["mlx_variants"]["row_embedding"],
             "half_scales": half_scales(written["out"] / "model.safetensors")}
    text = "\n".join(section(facts))
    if written["kind"] == "rows":
        assert "Stored by use: `bert.embeddings.word_embeddings`" in text
        assert "row_table[ids], row_index[ids]" in text
        assert "Cast half-precision `scales`" in text
    elif written["kind"] == "half":
        assert facts["half_scales"] == ["bfloat16", "float16"]
        assert "stored in bfloat16 and float16" in text and ".astype(mx.float32)" in text
    else:
        assert facts["half_scales"] == [] and "astype" not in text


@pytest.mark.parametrize("written", ["rows"], indirect=True)
def test_a_bad_row_embedding_block_is_one_line(written, tmp_path):
    import shutil

    from variants.checkpoints.files import CheckpointError
    from variants.checkpoints.load import load_checkpoint
    from variants.families.artifact import load_variant

    folder = tmp_path / "bad"
    shutil.copytree(written["out"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    spec = cfg["mlx_variants"]["row_embedding"]["encoder.embeddings.word_embeddings"]
    spec["tables"][0]["rows"] += 1
    (folder / "config.json").write_text(json.dumps(cfg))
    for load in (load_checkpoint, load_variant):
        with pytest.raises(CheckpointError) as e:
            load(Path(folder))
        msg = str(e.value)
        assert "\n" not in msg and msg.endswith("export the variant again"), msg

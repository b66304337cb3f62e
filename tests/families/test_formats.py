"""Issue #42's storage formats: half-precision scales, the microscaling modes, a word table's
unseen rows stored apart. Bits per weight and bytes against a hand count; the native build
against the simulated one; the search's price of a map against the builder's own bytes."""

import mlx.core as mx
import numpy as np
import pytest

from variants.layer_maps import formats as F
from variants.families.quant.build import quantize_module
from variants.families.quant.config import QuantConfig
from variants.layer_maps import bits_map


@pytest.mark.parametrize("token,scale,bpw", [
    (4, "float32", 5.0), (4, "float16", 4.5), (4, "bfloat16", 4.5), (8, "float16", 8.5),
    (6, "float16", 6.5), (2, "float16", 2.5), (3, "float16", 3.5),
    ("mxfp4", "float16", 4.25), ("nvfp4", "float16", 4.5), ("mxfp8", "float16", 8.25)])
def test_bits_per_weight_and_bytes_match_a_hand_count_and_mlx_arrays(token, scale, bpw):
    """4-bit g64: 4 bits + (scale + bias) x 16 bits / 64 = 4.5 at fp16 (32 at fp32: 5.0);
    mxfp4: 4 + 8 / 32; nvfp4: 4 + 8 / 16; mxfp8: 8 + 8 / 32. The arrays mx.quantize writes
    (codes, scales cast to the dtype, biases) hold exactly those bytes."""
    fmt = F.of(token, 64, scale)
    assert F.bits_per_weight(fmt) == bpw
    w = mx.random.normal((48, 384), key=mx.random.key(0))
    q, s, b = F.quantize(w, fmt)
    nbytes = q.nbytes + s.nbytes + (0 if b is None else b.nbytes)
    assert nbytes == F.stored_bytes(w.shape, fmt) == 48 * 384 * bpw / 8
    if fmt.mode == "affine":
        assert s.dtype == getattr(mx, scale) and b.dtype == getattr(mx, scale)
    else:
        assert b is None and s.dtype == mx.uint8


def test_half_precision_round_trip_is_float32_arithmetic_on_the_stored_scales():
    """The dequantized weight is float32(scale) * q + float32(bias), computed in float32 (not
    MLX's half-precision dequantize); within half an fp16 step of the fp32-scale weight."""
    w = mx.random.normal((16, 128), key=mx.random.key(1))
    fmt = F.Format(4, 64, "affine", "float16")
    q, s, b = F.quantize(w, fmt)
    codes = np.asarray(mx.dequantize(q, mx.ones_like(s.astype(mx.float32)),
                                     mx.zeros_like(b.astype(mx.float32)), group_size=64,
                                     bits=4))
    s32 = np.repeat(np.asarray(s.astype(mx.float32)), 64, axis=1)
    b32 = np.repeat(np.asarray(b.astype(mx.float32)), 64, axis=1)
    want = (s32 * codes + b32).astype(np.float32)
    assert np.array_equal(np.asarray(F.round_trip(w, fmt)), want)
    q32, s_, b_ = mx.quantize(w, group_size=64, bits=4)
    fp32 = np.asarray(mx.dequantize(q32, s_, b_, group_size=64, bits=4))
    assert np.abs(want - fp32).max() < 2e-3 * np.abs(fp32).max()


def test_bits_map_values_name_modes_scales_and_unseen_rows():
    _, rules = bits_map.parse("value=6:32:f16,output=mxfp4,word_embeddings@unseen=2")
    assert [(r.bits, r.group_size, r.mode, r.scale_dtype) for r in rules] == [
        (6, 32, "affine", "float16"), (4, 32, "mxfp4", None), (2, None, "affine", None)]
    assert bits_map.canonical("value=6:32:f16,output=mxfp4") == "value=6:32:f16,output=mxfp4"
    paths = ["e.word_embeddings", "e.word_embeddings@unseen", "l.value", "l.output"]
    got = bits_map.resolve_formats("word_embeddings=8,output=nvfp4", paths, 6, 64, "float16")
    assert got["e.word_embeddings@unseen"] == got["e.word_embeddings"] == (8, 64, "affine",
                                                                             "float16")
    assert got["l.output"] == (4, 16, "nvfp4", "float32")
    with pytest.raises(ValueError, match="--bits-map entry 'x=mxfp4:32'"):
        bits_map.parse("x=mxfp4:32")
    with pytest.raises(ValueError, match="quant-mode mxfp4 stores 4-bit values in groups of 32"):
        QuantConfig(4, 64, quant_mode="mxfp4")
    with pytest.raises(ValueError, match="quant-method gptq learns affine"):
        QuantConfig(4, 32, quant_mode="mxfp4", method="gptq")


@pytest.fixture(scope="module")
def sentiment_model():
    from variants.checkpoints.load import load_checkpoint
    from variants.models import sentiment

    return sentiment.build(load_checkpoint())


@pytest.mark.parametrize("cfg", [
    QuantConfig(4, 64, scale_dtype="float16"), QuantConfig(4, 32, quant_mode="mxfp4"),
    QuantConfig(4, 16, quant_mode="nvfp4"), QuantConfig(8, 32, quant_mode="mxfp8"),
    QuantConfig(6, 64, quantize_embeddings=True, scale_dtype="bfloat16",
                bits_map="word_embeddings=8:f16,intermediate=mxfp4")],
    ids=lambda c: c.name)
def test_native_equals_simulated_for_each_format(sentiment_model, cfg):
    """Every format's native build (packed layers on the CPU path, quantized tables) gives the
    simulated build's logits to float round-off on real text, and reports the stored bits."""
    module = sentiment_model.module
    sim, info = quantize_module(module, cfg, "simulated", model=sentiment_model)
    nat, ninfo = quantize_module(module, cfg, "native", model=sentiment_model)
    assert info["model_bytes"] == ninfo["model_bytes"]
    if not cfg.bits_map:
        assert info["bits_per_weight"] == F.bits_per_weight(
            F.of(cfg.bits if cfg.quant_mode == "affine" else cfg.quant_mode, cfg.group_size,
                 cfg.scale_dtype))
    enc = sentiment_model.tokenizer.encode(["the movie was not good at all",
                                            "a quiet, moving and gorgeous film"])[0]
    ids, mask, types = sentiment_model.tokenizer.batch(enc)
    a = sim.encoder(mx.array(ids), mx.array(mask), mx.array(types))
    b = nat.encoder(mx.array(ids), mx.array(mask), mx.array(types))
    a, b = a.last_hidden, b.last_hidden
    assert b.dtype == mx.float32
    keep = mx.array(mask)[..., None] > 0
    assert float(mx.max(mx.where(keep, mx.abs(a - b), 0))) < 1e-4


def test_search_prices_formats_and_unseen_rows_as_the_builder_stores_them(sentiment_model):
    """The cost table's bytes of a map with fp16 scales, modes and the word table's unseen rows
    at their own width equal quantize_module's native bytes (row index included)."""
    from variants.families.quant.row_use import used_rows
    from variants.search.costs import CostTable
    from variants.search.driver import spec_of
    from variants.search.units import search_units

    model = sentiment_model
    texts = ["the movie was not good at all", "a quiet, moving and gorgeous film"]
    used = np.zeros(model.module.encoder.embeddings.word_embeddings.weight.shape[0], bool)
    from variants.families.quant.row_use import row_counts

    used[row_counts(model, texts) > 0] = True
    u = search_units(model.module, model, unseen_rows=True)
    word = "encoder.embeddings.word_embeddings"
    assert u.paths[u.paths.index(word) + 1] == word + bits_map.UNSEEN
    table = CostTable(model.module, u.paths, (4, 6, 8, "mxfp4", "nvfp4"), 64, "float16", used)
    lb = {p: ("mxfp4" if "intermediate" in p else 8 if "value" in p else 6) for p in u.paths}
    lb[word + bits_map.UNSEEN] = 4
    spec = spec_of(lb)
    cfg = QuantConfig(bits=spec["default_bits"], group_size=64, bits_map=spec["bits_map"],
                      quantize_embeddings=True, scale_dtype="float16")
    _, info = quantize_module(model.module, cfg, "native", model=model, row_use=used)
    assert table.model_bytes(lb) == info["model_bytes"]
    rows = info["row_map"][word]["rows"]
    assert rows == [int(used.sum()), int((~used).sum())]
    assert used_rows  # the build's helper the sweep uses (fit texts + --embedding-texts)


def test_used_rows_are_the_fit_texts_and_the_users_own(sentiment_model, tmp_path):
    """A row is used when a fit-split text or a line of --embedding-texts looks it up: the
    union of the two counts (row_use.row_counts on each), None without any text; a sweep
    build stores exactly the others at the @unseen width."""
    from tests.sentiment_fit import sentiment_splits
    from variants.families.family import BuildInputs
    from variants.families.quant.row_use import used_rows
    from variants.families.quant.family import build
    from variants.families.quant.row_use import row_counts

    fit = sentiment_splits(40, 2, 2)["fit"]
    own = tmp_path / "own.txt"
    own.write_text("zygote quixotic\n\nxylophone\n", encoding="utf-8")
    cfg = QuantConfig(6, 64, quantize_embeddings=True, scale_dtype="float16",
                      bits_map="word_embeddings@unseen=2", embedding_texts=str(own))
    a = row_counts(sentiment_model, fit) > 0
    b = row_counts(sentiment_model, ["zygote quixotic", "xylophone"]) > 0
    got = used_rows(sentiment_model, fit, cfg)
    assert np.array_equal(got, a | b) and (b & ~a).any()
    assert used_rows(sentiment_model, None, QuantConfig(6, 64)) is None
    _, info = build(sentiment_model, cfg, BuildInputs(fit=fit))
    rows = info["row_map"]["encoder.embeddings.word_embeddings"]
    assert rows["rows"] == [int(got.sum()), int((~got).sum())]
    assert rows["formats"][1] == [2, 64, "affine", "float16"]


def test_eval_rows_apart_are_those_reading_an_unseen_row(sentiment_model):
    """rows_holding_unseen flags a row exactly when its own encoding looks up a row the fit
    texts never use (row_counts on that text alone); eval_ids_apart gives their ids for a
    variant with a row map, None without."""
    from tests.sentiment_fit import sentiment_splits
    from variants.families.quant.row_use import (eval_ids_apart, row_counts,
                                                 rows_holding_unseen, used_rows)

    splits = sentiment_splits(40, 2, 12)
    cfg = QuantConfig(6, 64, quantize_embeddings=True, bits_map="word_embeddings@unseen=2")
    used = used_rows(sentiment_model, splits["fit"], cfg)
    got = rows_holding_unseen(sentiment_model, splits["eval"], used)
    want = [bool(((row_counts(sentiment_model, [t]) > 0) & ~used).any())
            for t in sentiment_model.model_inputs(splits["eval"])[0]]
    assert got.tolist() == want and 0 < sum(want) < len(want) + 1
    ids = eval_ids_apart(sentiment_model, splits, cfg, {"row_map": {"x": {}}})
    assert ids == [str(i) for i, w in zip(splits["eval"].ids, want) if w]
    assert eval_ids_apart(sentiment_model, splits, cfg, {}) is None

"""ModernBERT's fast CPU path (variants/arch/modernbert_fast.py) computes what the plain layer-by-layer
path computes, to float32 round-off: padded and unpadded batches, B = 1 (head split) and B >= 2
(sequence split), lengths on both sides of the window (every key inside it, the dense window
bias, the windowed blocks), global and local layers, with and without biases (the two fixture
checkpoints: window 128 without biases, window 64 with every bias); and it stands aside for a
replaced Linear, and follows replaced weights. The compiled layer op (variants/arch/modernbert_fused.py)
is switched off here (VARIANTS_FUSED_LAYER=off) so these tests hold the MLX fast path, which runs
where the kernel is not built; tests/arch/test_modernbert_fused.py holds the op."""

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.arch import modernbert_fast as fast
from variants.runtime import parallel
from variants.checkpoints.load import load_checkpoint

HF = Path(__file__).parents[1] / "fixtures" / "hf"


@pytest.fixture(autouse=True)
def _mlx_fast_path(monkeypatch):
    monkeypatch.setenv("VARIANTS_FUSED_LAYER", "off")


@pytest.fixture(scope="module")
def loaded():
    return {n: load_checkpoint(HF / n).encoder for n in ("modernbert", "modernbert_g2")}


def _batch(B, L, pad, seed=0):
    rng = np.random.default_rng(seed + 31 * L + B)
    ids = rng.integers(5, 2900, (B, L)).astype(np.int32)
    mask = np.ones((B, L), np.int32)
    if pad:
        for b in range(B):  # every other row shorter, the last one down to a third
            n = L if b % 2 == 0 and b != B - 1 else max(1, L // 3 + b)
            mask[b, n:] = 0
    return mx.array(ids), mx.array(mask), mask.astype(bool)


def _both(enc, ids, mask):
    enc.fast = False
    try:
        plain = np.array(enc(ids, mask).last_hidden)
    finally:
        enc.fast = True
    return plain, np.array(enc(ids, mask).last_hidden)


# modernbert_g2: half window 32 -> L=20 and 33 every key inside, L=35 and 50 the dense window
# bias, L=140 windowed blocks (>= 2 * 64); modernbert: half 64 -> L=100 the dense window bias,
# L=300 windowed blocks
CASES = ([("modernbert_g2", B, L, pad) for B in (1, 3) for L in (20, 50, 140)
          for pad in (False, True)] + [("modernbert_g2", B, L, False) for B in (1, 3)
                                       for L in (33, 35)]
         + [("modernbert", B, L, True) for B in (1, 2) for L in (100, 300)])


@pytest.mark.parametrize("name,B,L,pad", CASES)
def test_fast_path_equals_the_plain_path(name, B, L, pad, loaded):
    enc = loaded[name]
    ids, mask, real = _batch(B, L, pad)
    plain, quick = _both(enc, ids, mask)
    assert quick.shape == plain.shape == (B, L, enc.args.hidden_size)
    assert np.abs(quick[real] - plain[real]).max() <= 1e-5
    assert np.abs(plain[real]).std() > 0.1  # not trivially small


def test_which_local_attention_each_length_takes(loaded):
    args = loaded["modernbert_g2"].args  # window 64: half 32, windowed from L = 128
    full = fast.FastContext(args, np.ones((2, 20), np.int32), "auto")
    assert full.bias(True) is None and full.bias(False) is None and full.plan is None
    dense = fast.FastContext(args, np.ones((1, 50), np.int32), "auto")
    t = np.array(dense.bias(False))[0, 0]  # keys on axis 0: t[k, q]
    assert t.shape == (50, 50) and t[0, 32] == 0 and t[0, 33] < -1e8 and t[40, 5] < -1e8
    blocks = fast.FastContext(args, np.ones((1, 140), np.int32), "auto")
    assert blocks.plan is not None
    masked = fast.FastContext(args, np.ones((1, 140), np.int32), "masked")
    assert masked.plan is None and masked.bias(False).shape == (1, 1, 140, 140)
    padded = np.ones((2, 20), np.int32)
    padded[1, 15:] = 0
    pctx = fast.FastContext(args, padded, "auto")
    assert np.array(pctx.bias(True))[1, 0, 15:, 0].max() < -1e8
    assert np.array(pctx.bias(True))[:, 0, :15, 0].max() == 0


def test_global_and_local_layers_differ_on_the_long_row(loaded):
    """The global layers see every key, the local ones only their window: a wrong rotary θ or
    a window on a global layer would change the output beyond round-off."""
    enc = loaded["modernbert_g2"]
    ids, mask, real = _batch(1, 140, False)
    plain, quick = _both(enc, ids, mask)
    enc.local_attention_impl = "masked"
    try:
        masked = np.array(enc(ids, mask).last_hidden)
    finally:
        enc.local_attention_impl = None
    assert np.abs(masked - plain).max() <= 1e-5 and np.abs(quick - plain).max() <= 1e-5
    layer = enc.layers[0]
    assert layer.is_global and not enc.layers[1].is_global
    w = fast.layer_weights(layer)
    x = enc.embed(ids)
    ctx = fast.FastContext(enc.args, np.ones((1, 140), np.int32), "auto")
    as_local = fast.layer_forward(enc.layers[1], x, ctx, fast.layer_weights(enc.layers[1]))
    layer.is_global = False  # the same weights with the local window and θ
    try:
        wrong = np.array(fast.layer_forward(layer, x, ctx, w))
    finally:
        layer.is_global = True
    right = np.array(fast.layer_forward(layer, x, ctx, w))
    assert np.abs(wrong - right).max() > 1e-3 and np.array(as_local).shape == right.shape


def test_one_stream_and_head_split_agree(loaded, monkeypatch):
    enc = loaded["modernbert"]
    ids, mask, real = _batch(1, 64, False)
    split = np.array(enc(ids, mask).last_hidden)

    class One:
        MIN_ROWS, bounds = parallel.MIN_ROWS, staticmethod(parallel.bounds)

        @staticmethod
        def streams():
            return parallel.streams()[:1]
    monkeypatch.setattr(fast, "parallel", One)
    one = np.array(enc(ids, mask).last_hidden)
    assert np.abs(split - one).max() <= 1e-5
    shards = fast.head_shards(enc.layers[0], 2)
    assert len(shards) == 2 and shards[0][0].shape == (64, 3 * 32)  # 2 of 4 heads of 16


def test_a_replaced_linear_takes_the_plain_path_and_new_weights_are_seen(loaded):
    enc = loaded["modernbert_g2"]
    ids, mask, _ = _batch(2, 20, True)
    before = np.array(enc(ids, mask).last_hidden)
    layer = enc.layers[1]
    old = layer.mlp.Wo
    assert fast.layer_weights(layer) is not None
    try:
        layer.mlp.Wo = nn.QuantizedLinear.from_linear(old, group_size=32, bits=8)
        assert fast.layer_weights(layer) is None
        x = enc.embed(ids)
        assert fast.forward(enc, x, np.array(mask), "auto") is None
        q = np.array(enc(ids, mask).last_hidden)  # plain path, quantized layer
        assert 0 < np.abs(q - before).max() < 0.5
        layer.mlp.Wo = old
        layer.attn.Wo.weight = layer.attn.Wo.weight * 2.0  # a new array: rebuilt
        doubled = _both(enc, ids, mask)
        assert np.abs(doubled[1] - doubled[0]).max() <= 1e-5
        assert np.abs(doubled[1] - before).max() > 1e-2
    finally:
        layer.mlp.Wo = old
        layer.attn.Wo.weight = layer.attn.Wo.weight / 2.0


def test_the_compiled_rotary_equals_apply_rope():
    from variants.arch.modernbert_layers import apply_rope
    B, L, H, d = 2, 7, 3, 8
    qkv = mx.array(np.random.default_rng(3).normal(size=(B, L, 3 * H * d)).astype(np.float32))
    tables = fast.rope_for_length(L, 10000.0, d)
    q, k = fast.rope_qk(qkv, H, d, tables)
    heads = qkv.reshape(B, L, 3, H, d).transpose(2, 0, 3, 1, 4)
    for got, t in ((q, heads[0]), (k, heads[1])):
        want = np.array(apply_rope(t, tables[0], tables[1]))
        assert got.shape == (B, H, L, d)
        np.testing.assert_allclose(np.array(got), want, rtol=0, atol=1e-6)
    # position 0 is unrotated; position 1 is not
    np.testing.assert_array_equal(np.array(q)[:, :, 0], np.array(heads[0])[:, :, 0])
    assert np.abs(np.array(q)[:, :, 1] - np.array(heads[0])[:, :, 1]).max() > 1e-2


def test_the_fast_path_stands_aside_off_the_cpu(loaded, monkeypatch):
    enc = loaded["modernbert_g2"]
    ids, mask, _ = _batch(1, 20, False)
    x = enc.embed(ids)
    assert fast.forward(enc, x, np.array(mask), "auto") is not None
    monkeypatch.setattr(fast.device, "is_cpu", lambda: False)
    assert fast.forward(enc, x, np.array(mask), "auto") is None

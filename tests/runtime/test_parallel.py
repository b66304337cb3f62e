"""The two-stream layer split: same numbers as one stream, halves really evaluated apart."""

import mlx.core as mx
import numpy as np
import pytest

from variants.runtime import parallel
from variants.arch.encoder import BertEncoder, ModelArgs, TransformerLayer



def _inputs(B, L, seed=0, pad_from=None):
    rng = np.random.default_rng(seed)
    ids = mx.array(rng.integers(1, 50, (B, L)).astype(np.int32))
    mask = np.ones((B, L), np.int32)
    if pad_from is not None:
        mask[0, pad_from:] = 0
    return ids, mx.array(mask)


def test_bounds_cover_range_in_order():
    assert parallel.bounds(5, 2) == [(0, 2), (2, 5)]
    assert parallel.bounds(1, 2) == [(0, 1)]
    for n in (2, 7, 32, 33):
        parts = parallel.bounds(n, 2)
        assert parts[0][0] == 0 and parts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_two_streams_by_default_on_multicore():
    import os
    if (os.cpu_count() or 1) < 2 or "VARIANTS_STREAMS" in os.environ:
        pytest.skip("needs >= 2 cores and the default stream count")
    assert len(parallel.streams()) == 2
    with parallel.single_stream():
        assert len(parallel.streams()) == 1
    assert len(parallel.streams()) == 2
    assert parallel.info()["streams"] == 2


@pytest.mark.parametrize("B,L,pad_from", [(3, 16, 5), (2, 17, None), (1, 33, 20), (1, 40, None)])
def test_split_equals_single_stream(enc, B, L, pad_from):
    if len(parallel.streams()) < 2:
        pytest.skip("single stream configured")
    ids, mask = _inputs(B, L, seed=B * 100 + L, pad_from=pad_from)
    split = enc(ids, mask, output_hidden_states=True, output_attentions=True)
    with parallel.single_stream():
        one = enc(ids, mask, output_hidden_states=True, output_attentions=True)
    for a, b in zip(split.hidden_states, one.hidden_states):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=2e-6)
    for a, b in zip(split.attentions, one.attentions):
        assert a.shape == b.shape == (B, enc.args.num_attention_heads, L, L)
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)


def test_halves_are_what_each_stream_sees(enc, monkeypatch):
    if len(parallel.streams()) < 2:
        pytest.skip("single stream configured")
    seen = []
    orig = TransformerLayer._forward

    def spy(self, x, bias, return_attention=False, kv=None):
        seen.append((tuple(x.shape), None if kv is None else tuple(kv.shape), mx.default_stream(mx.cpu)))
        return orig(self, x, bias, return_attention, kv)

    monkeypatch.setattr(TransformerLayer, "_forward", spy)
    ids, mask = _inputs(5, 12)
    mx.eval(enc(ids, mask).last_hidden)
    # batch split: 2 layers x 2 halves, sizes 2+3, each half's layer stack on its own stream
    assert sorted(s[0][0] for s in seen) == sorted([2, 3, 2, 3])
    assert {s[0][1] for s in seen} == {12} and all(s[1] is None for s in seen)
    by_size = {n: {str(s[2]) for s in seen if s[0][0] == n} for n in (2, 3)}
    assert all(len(v) == 1 for v in by_size.values()) and by_size[2] != by_size[3]
    seen.clear()
    monkeypatch.setenv("VARIANTS_FUSED_LAYER", "off")  # the compiled layer runs B = 1 whole
    ids, mask = _inputs(1, 40)
    x = enc.embed(ids)
    mx.eval(enc.layers[0](x, None)[0], enc.layers[1](x, None)[0])
    # B=1 through a layer call: the query positions are split, each part sees every key
    assert sorted(s[0][1] for s in seen) == [20, 20, 20, 20]
    assert all(s[1] == (1, 40, enc.args.hidden_size) for s in seen)
    assert str(seen[0][2]) != str(seen[1][2])
    seen.clear()
    with parallel.single_stream():
        mx.eval(enc(ids, mask).last_hidden)
    assert [s[0] for s in seen] == [(1, 40, enc.args.hidden_size)] * 2


@pytest.mark.parametrize("L,pad_from", [(40, None), (48, 40)])
def test_b1_heads_and_features_split_over_streams(enc, monkeypatch, L, pad_from):
    """B = 1 through the encoder: tensor parallelism (heads and MLP features per stream), the
    same numbers as one stream, and no layer's work done twice. (The MLX path: the compiled
    layer, tests/runtime/test_fused_layer.py, runs B = 1 whole on one stream.)"""
    if len(parallel.streams()) < 2:
        pytest.skip("single stream configured")
    monkeypatch.setenv("VARIANTS_FUSED_LAYER", "off")
    calls = []
    orig = TransformerLayer.forward_sharded

    def spy(self, x, bias, shards):
        calls.append([(tuple(p[0].shape), tuple(p[3].shape)) for p in shards])
        return orig(self, x, bias, shards)

    monkeypatch.setattr(TransformerLayer, "forward_sharded", spy)
    ids, mask = _inputs(1, L, seed=L, pad_from=pad_from)
    sharded = np.array(enc(ids, mask).last_hidden)
    with parallel.single_stream():
        one = np.array(enc(ids, mask).last_hidden)
    real = np.array(mask).astype(bool)
    np.testing.assert_allclose(sharded[real], one[real], rtol=0, atol=2e-6)
    D, F = enc.args.hidden_size, enc.args.intermediate_size
    # 4 heads of 8 -> 2 per stream: q, k, v columns (D, 3 x 16); MLP features 32 per stream
    # (weights stored transposed, input features first)
    assert calls == [[((D, 3 * D // 2), (D, F // 2))] * 2] * enc.args.num_hidden_layers


def test_b1_falls_back_to_the_query_split_for_replaced_linears(enc, monkeypatch):
    if len(parallel.streams()) < 2:
        pytest.skip("single stream configured")
    import copy

    import mlx.nn as nn

    class Wrapped(nn.Module):  # any non-plain Linear (as quantised or low-rank variants are)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def __call__(self, x):
            return self.inner(x)

    e = copy.deepcopy(enc)
    e.layers[1].intermediate = Wrapped(e.layers[1].intermediate)
    assert e.layers[0].shards(2) is not None and e.layers[1].shards(2) is None
    ids, mask = _inputs(1, 40, seed=5)
    got = np.array(e(ids, mask).last_hidden)
    with parallel.single_stream():
        want = np.array(enc(ids, mask).last_hidden)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("raw", ["two", "0", "-1"])
def test_bad_stream_count_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("VARIANTS_STREAMS", raw)
    with pytest.raises(ValueError, match="VARIANTS_STREAMS"):
        parallel._requested()


def test_shards_cover_every_head_and_feature(enc):
    """Never fewer parts for heads than for MLP features (zip would drop the rest)."""
    one_head = BertEncoder(ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=1, intermediate_size=64))
    assert one_head.layers[0].shards(2) is None  # 1 head: nothing to split, query split instead
    tiny_ffn = BertEncoder(ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=1))
    assert tiny_ffn.layers[0].shards(2) is None
    ARGS = enc.args
    wide = enc.layers[0].shards(16)  # 4 heads: 4 parts, all heads, all features
    assert len(wide) == ARGS.num_attention_heads
    assert sum(p[1].shape[0] for p in wide) == ARGS.hidden_size
    assert sum(p[3].shape[1] for p in wide) == ARGS.intermediate_size


def test_one_head_b1_matches_one_stream():
    mx.random.seed(11)
    e = BertEncoder(ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=1, intermediate_size=64,
                              max_position_embeddings=64))
    mx.eval(e.parameters())
    ids, mask = _inputs(1, 40, seed=9)
    got = np.array(e(ids, mask).last_hidden)
    with parallel.single_stream():
        want = np.array(e(ids, mask).last_hidden)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)

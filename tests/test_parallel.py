"""The two-stream layer split: same numbers as one stream, halves really evaluated apart."""

import mlx.core as mx
import numpy as np
import pytest

from variants import parallel
from variants.encoder import BertEncoder, ModelArgs, TransformerLayer

ARGS = ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64)


@pytest.fixture(scope="module")
def enc():
    mx.random.seed(3)
    e = BertEncoder(ARGS)
    mx.eval(e.parameters())
    return e


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
        assert a.shape == b.shape == (B, ARGS.num_attention_heads, L, L)
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
    ids, mask = _inputs(1, 40)
    mx.eval(enc(ids, mask).last_hidden)
    # B=1: the query positions are split, each part sees every key
    assert sorted(s[0][1] for s in seen) == [20, 20, 20, 20]
    assert all(s[1] == (1, 40, ARGS.hidden_size) for s in seen)
    assert str(seen[0][2]) != str(seen[1][2])
    seen.clear()
    with parallel.single_stream():
        mx.eval(enc(ids, mask).last_hidden)
    assert [s[0] for s in seen] == [(1, 40, ARGS.hidden_size)] * 2


@pytest.mark.parametrize("raw", ["two", "0", "-1"])
def test_bad_stream_count_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("VARIANTS_STREAMS", raw)
    with pytest.raises(ValueError, match="VARIANTS_STREAMS"):
        parallel._requested()

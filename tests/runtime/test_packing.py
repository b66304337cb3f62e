"""Packed (padding-free) encoder batches: same numbers on real tokens, zeros at padding."""

import mlx.core as mx
import numpy as np
import pytest

from variants.runtime import packing, parallel
from variants.arch.encoder import TransformerLayer, attention_bias, mean_pool



def _batch(lengths, L, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 50, (len(lengths), L)).astype(np.int32)
    mask = (np.arange(L)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    return mx.array(ids), mx.array(mask)


def test_plan_indices_by_hand():
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    bias = attention_bias(mx.array(mask))
    p = packing.plan(mask, bias, [(0, 1), (1, 3)])
    assert np.array(p.real_index).tolist() == [0, 1, 4, 5, 6, 8]
    assert np.array(p.unpack_index).tolist() == [0, 1, 6, 6, 2, 3, 4, 6, 5, 6, 6, 6]
    first, second = p.parts
    assert first.seqs == (0, 1) and first.rows == (0, 2) and second.rows == (2, 6)
    # each part is padded to its own longest sequence: 2 and 3 columns, not the batch's 4
    assert (first.L, second.L) == (2, 3)
    assert np.array(first.pad_index).tolist() == [0, 1]
    assert np.array(first.real_index).tolist() == [0, 1]
    assert np.array(second.pad_index).tolist() == [0, 1, 2, 3, 0, 0]
    assert np.array(second.real_index).tolist() == [0, 1, 2, 3]
    assert first.bias.shape == (1, 1, 1, 2) and second.bias.shape == (2, 1, 1, 3)
    np.testing.assert_array_equal(np.array(second.bias).reshape(2, 3) == 0,
                                  [[True, True, True], [True, False, False]])
    x = mx.arange(12 * 2, dtype=mx.float32).reshape(3, 4, 2)
    back = np.array(p.unpack(p.pack(x)))
    np.testing.assert_array_equal(back[mask.astype(bool)], np.array(x)[mask.astype(bool)])
    assert np.all(back[~mask.astype(bool)] == 0)


@pytest.mark.parametrize("lengths,k,want", [
    ([10, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2, [(0, 1), (1, 10)]),   # 10 | 9 tokens, not 14 | 5
    ([5, 5, 5, 5], 2, [(0, 2), (2, 4)]),
    ([9, 8, 7, 3, 3, 2], 2, [(0, 2), (2, 6)]),                # 17 | 15 (24.5 would be 24 | 8)
    ([4, 4, 4, 4, 4, 4], 3, [(0, 2), (2, 4), (4, 6)]),
    ([100, 1, 1], 3, [(0, 1), (1, 2), (2, 3)]),                # every part keeps a sequence
    ([3, 2], 4, [(0, 1), (1, 2)]),                             # fewer sequences than parts
    ([7], 2, [(0, 1)]),
])
def test_balanced_bounds_by_hand(lengths, k, want):
    assert packing.balanced_bounds(lengths, k) == want


@pytest.fixture
def packed_calls(monkeypatch):
    """Every packed layer call as (part, its token rows, the MLX stream it ran on); needs the
    two-stream split."""
    if len(parallel.streams()) < 2:
        pytest.skip("single stream configured")
    seen = []
    orig = TransformerLayer._forward_packed

    def spy(self, x, part):
        seen.append((part, x.shape[0], str(mx.default_stream(mx.cpu))))
        return orig(self, x, part)

    monkeypatch.setattr(TransformerLayer, "_forward_packed", spy)
    return seen


def test_encoder_splits_a_sorted_batch_by_tokens(enc, packed_calls):
    ids, mask = _batch([16, 12, 4, 4, 3, 3, 3, 2], 16)  # 47 tokens; by count 36 | 11
    mx.eval(enc(ids, mask).last_hidden)
    seen = {(p.seqs, n, p.L) for p, n, _ in packed_calls}
    assert sorted(seen) == [((0, 2), 28, 16), ((2, 8), 19, 4)]


def test_plan_in_longest_first_order_by_hand():
    """Sequences packed longest first: part layouts, gathers and the unpack back to the batch's
    own order, by hand."""
    mask = np.array([[1, 0, 0, 0],   # 1 token
                     [1, 1, 1, 1],   # 4
                     [1, 1, 0, 0]])  # 2
    order = packing.longest_first(mask)
    assert order.tolist() == [1, 2, 0]
    bias = attention_bias(mx.array(mask))
    p = packing.plan(mask, bias, [(0, 1), (1, 3)], order=order)
    # real tokens, in packed order: sequence 1 (flat 4..7), then 2 (8, 9), then 0 (0)
    assert np.array(p.real_index).tolist() == [4, 5, 6, 7, 8, 9, 0]
    assert np.array(p.unpack_index).tolist() == [6, 7, 7, 7, 0, 1, 2, 3, 4, 5, 7, 7]
    first, second = p.parts
    assert (first.seqs, first.rows, first.L) == ((0, 1), (0, 4), 4)
    assert (second.seqs, second.rows, second.L) == ((1, 3), (4, 7), 2)  # lengths 2 and 1
    assert np.array(second.real_index).tolist() == [0, 1, 2]  # (2, L=2) layout: 1 1 | 1 0
    # the part's bias follows the permutation: sequence 2 (no padding in L=2), then 0
    np.testing.assert_array_equal(np.array(second.bias)[:, 0, 0] < -1, [[False, False],
                                                                         [False, True]])
    x = mx.array(np.arange(12, dtype=np.float32).reshape(3, 4, 1))
    xp = p.pack(x)
    assert np.array(xp).ravel().tolist() == [4, 5, 6, 7, 8, 9, 0]
    back = np.array(p.unpack(xp))[..., 0]
    np.testing.assert_array_equal(back, np.where(mask, np.arange(12).reshape(3, 4), 0))
    with pytest.raises(ValueError, match="permutation of range"):
        packing.plan(mask, bias, [(0, 3)], order=[0, 0, 1])


def test_longest_first_shrinks_the_attention_layout_of_a_mixed_batch():
    """sum over parts of B_p * L_p^2 (the attention core's positions) for a batch of mixed
    lengths, cut in two by tokens: in the batch's own order vs longest first."""
    lengths = np.array([5, 40, 9, 33, 12, 3, 28, 7, 21, 16, 2, 38])
    mask = (np.arange(40)[None] < lengths[:, None]).astype(np.int32)
    bias = attention_bias(mx.array(mask))

    def work(order):
        p = packing.plan(mask, bias, packing.balanced_bounds(lengths[order], 2), order=order)
        return sum((q.seqs[1] - q.seqs[0]) * q.L ** 2 for q in p.parts)
    own, longest = work(np.arange(12)), work(packing.longest_first(mask))
    # own order, 214 tokens cut nearest 107 (after 102): 5 40 9 33 12 3 | 28 7 21 16 2 38
    assert own == 6 * 40 ** 2 + 6 * 38 ** 2
    # longest first, cut nearest 107 (after 111): 40 38 33 | 28 21 16 12 9 7 5 3 2
    assert longest == 3 * 40 ** 2 + 9 * 28 ** 2
    assert longest < 0.65 * own


def test_plan_declines_when_packing_does_not_pay():
    full = np.ones((4, 8), np.int32)
    assert packing.plan(full, attention_bias(mx.array(full)), [(0, 4)]) is None
    little = full.copy()
    little[0, -1] = 0  # 1 of 32 positions padded: under MIN_PADDING
    assert packing.plan(little, attention_bias(mx.array(little)), [(0, 4)]) is None
    empty_part = np.array([[1, 1, 1, 1], [0, 0, 0, 0]])  # the second stream would get no token
    assert packing.plan(empty_part, attention_bias(mx.array(empty_part)), [(0, 1), (1, 2)]) is None


@pytest.mark.parametrize("lengths,L", [([3, 16, 9, 5], 16), ([7, 2, 12], 12), ([20, 4], 24)])
def test_packed_equals_padded_on_real_tokens(enc, lengths, L):
    ids, mask = _batch(lengths, L, seed=L)
    packed = enc(ids, mask).last_hidden
    with parallel.single_stream():  # whole padded batches, one stream
        padded = enc(ids, mask).last_hidden
    m = np.array(mask).astype(bool)
    np.testing.assert_allclose(np.array(packed)[m], np.array(padded)[m], rtol=0, atol=2e-6)
    assert np.all(np.array(packed)[~m] == 0)
    np.testing.assert_allclose(np.array(mean_pool(packed, mask)),
                               np.array(mean_pool(padded, mask)), rtol=0, atol=1e-6)


def test_packed_parts_run_on_their_own_streams(enc, packed_calls):
    ids, mask = _batch([16, 3, 10, 4, 8], 16)
    mx.eval(enc(ids, mask).last_hidden)
    # packed longest first (16, 10, 8, 4, 3): 2 parts x 2 layers, sequences (0, 1) -> 16
    # tokens and (1, 5) -> 25 tokens (cut nearest 20.5), each part's whole layer stack on one
    # stream, the two parts on different streams
    seen = [(n, p.seqs, st) for p, n, st in packed_calls]
    assert sorted((n, seqs) for n, seqs, _ in seen) == [(16, (0, 1))] * 2 + [(25, (1, 5))] * 2
    streams = {seqs: {st for _, q, st in seen if q == seqs} for _, seqs, _ in seen}
    assert all(len(v) == 1 for v in streams.values()) and streams[(0, 1)] != streams[(1, 5)]
    packed_calls.clear()
    with parallel.single_stream():
        mx.eval(enc(ids, mask).last_hidden)
    assert packed_calls == []  # whole padded batches: no packing at all


def test_run_layer_packs_like_the_encoder(enc):
    """Layer-by-layer forwards (prune, exit) skip padding too, with the same real-token numbers."""
    ids, mask = _batch([16, 3, 10, 4, 8], 16, seed=4)
    x = enc.embed(ids)
    bias = attention_bias(mask)
    m = np.array(mask).astype(bool)
    got, want = x, x
    for layer in enc.layers:
        got = enc.run_layer(layer, got, bias, mask)
        with parallel.single_stream():
            want = layer(want, bias)[0]
    np.testing.assert_allclose(np.array(got)[m], np.array(want)[m], rtol=0, atol=2e-6)
    assert np.all(np.array(got)[~m] == 0)  # packed: padded positions are zeros
    np.testing.assert_allclose(np.array(got), np.array(enc(ids, mask).last_hidden), atol=2e-6)


@pytest.mark.parametrize("kind", ["per_query", "shared_batch_1"])
def test_run_layer_takes_other_bias_layouts(enc, kind):
    """A per-query (B, 1, L, L) bias is cut on both axes per part, a batch-1 (1, 1, 1, L) bias is
    shared by every part (both crashed on the packed path; break-test findings)."""
    ids, mask = _batch([16, 3, 10, 4, 8], 16, seed=5)
    if kind == "shared_batch_1":
        ids, mask = _batch([10] * 4, 16, seed=5)
    x = enc.embed(ids)
    bias = attention_bias(mask)
    if kind == "per_query":
        bias = mx.broadcast_to(bias, (bias.shape[0], 1, 16, 16))
    else:
        bias = bias[:1]
    m = np.array(mask).astype(bool)
    got = enc.run_layer(enc.layers[0], x, bias, mask)
    with parallel.single_stream():
        want = enc.layers[0](x, bias)[0]
    np.testing.assert_allclose(np.array(got)[m], np.array(want)[m], rtol=0, atol=2e-6)


@pytest.mark.parametrize("bias_shape", [(7,), ()])
def test_attention_core_takes_a_key_vector_or_scalar_bias(enc, bias_shape):
    att = enc.layers[0].attention
    x = mx.random.normal((2, 7, 32))
    q, k, v = att.project(x)
    bias = mx.array(np.where(np.arange(7) < 5, 0.0, -1e9).astype(np.float32)) \
        if bias_shape else mx.array(0.5)
    got, _ = att.core(q, k, v, bias)
    want, _ = att.core(q, k, v, bias, return_attention=True)  # the untransposed softmax
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=2e-6)

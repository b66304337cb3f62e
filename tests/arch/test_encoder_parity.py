"""The MLX encoder matches an independent implementation (HF transformers on PyTorch, fp32)."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from variants.arch.encoder import ModelArgs, mean_pool, sanitize

FIXTURE = Path(__file__).parents[1] / "fixtures" / "minilm_reference.npz"


@pytest.fixture(scope="module")
def ref():
    with np.load(FIXTURE) as z:
        return {k: z[k] for k in z.files}


def test_tokenizer_matches_fixture_and_pads_to_batch_longest(checkpoint, ref):
    encs, n_truncated = checkpoint.tokenizer.encode(list(ref["sentences"]))
    ids, mask, types = checkpoint.tokenizer.batch(encs)
    # one fixture sentence is longer than 128 tokens: it is truncated to exactly 128
    assert n_truncated == 1
    assert ids.shape == (40, 128)
    L = ids.shape[1]
    np.testing.assert_array_equal(ids, ref["input_ids"][:, :L])
    np.testing.assert_array_equal(mask, ref["attention_mask"][:, :L])
    np.testing.assert_array_equal(types, ref["token_type_ids"][:, :L])
    # a batch of short texts is padded to its own longest, not to the tokenizer.json's fixed 128
    encs, _ = checkpoint.tokenizer.encode(["", "Honestly the best pasta I have had in years."])
    ids, mask, _ = checkpoint.tokenizer.batch(encs)
    assert ids.shape == (2, 12)
    np.testing.assert_array_equal(mask.sum(axis=1), [2, 12])  # "" is [CLS] [SEP]


def test_every_layer_and_pooled_embeddings_match_reference(checkpoint, ref):
    encs, _ = checkpoint.tokenizer.encode(list(ref["sentences"]))
    ids, mask, types = checkpoint.tokenizer.batch(encs)
    out = checkpoint.encoder(mx.array(ids), mx.array(mask), mx.array(types),
                             output_hidden_states=True)
    assert len(out.hidden_states) == 7
    hs = ref["hidden_states_first"]  # (6 sentences, 7 states, 17 positions, 384)
    real = ref["attention_mask"][:6, :17].astype(bool)
    for layer in range(7):
        ours = np.array(out.hidden_states[layer])[:6, :17]
        err = np.abs(ours - hs[:, layer])[real].max()
        assert err < 1e-4, f"layer {layer}: max abs error {err}"
    emb = np.array(mean_pool(out.last_hidden, mx.array(mask)))
    assert np.abs(emb - ref["embeddings"]).max() < 1e-4
    cos = (emb * ref["embeddings"]).sum(axis=1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(
        ref["embeddings"], axis=1)
    assert cos.min() >= 0.99999
    # the empty string and the > 128-token sentence are among the 40
    lengths = mask.sum(axis=1)
    assert lengths.min() == 2 and lengths.max() == 128


def test_padding_does_not_change_real_positions(checkpoint):
    """Padding a text inside a longer batch must leave its outputs unchanged (mask bias works)."""
    texts = ["short one", "a much longer sentence that forces padding on the first one here"]
    enc, _ = checkpoint.tokenizer.encode(texts)
    ids, mask, types = checkpoint.tokenizer.batch(enc)
    both = np.array(checkpoint.encoder(mx.array(ids), mx.array(mask), mx.array(types)).last_hidden)
    ids1, mask1, types1 = checkpoint.tokenizer.batch(enc[:1])
    alone = np.array(checkpoint.encoder(mx.array(ids1), mx.array(mask1), mx.array(types1)).last_hidden)
    n = mask1.sum()
    np.testing.assert_allclose(both[0, :n], alone[0], rtol=1e-4, atol=1e-5)


def test_attention_probabilities_path_matches_fused_path(checkpoint):
    enc, _ = checkpoint.tokenizer.encode(["attention check", "the movie was not good at all"])
    ids, mask, types = (mx.array(a) for a in checkpoint.tokenizer.batch(enc))
    fused = checkpoint.encoder(ids, mask, types)  # packed: the short text is padded
    explicit = checkpoint.encoder(ids, mask, types, output_attentions=True)
    real = np.array(mask).astype(bool)
    np.testing.assert_allclose(np.array(fused.last_hidden)[real],
                               np.array(explicit.last_hidden)[real], rtol=1e-4, atol=1e-5)
    attn = np.array(explicit.attentions[0])  # (B, heads, L, L)
    assert attn.shape == (2, 12, ids.shape[1], ids.shape[1])
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
    # padded keys of the short example receive no attention
    assert attn[0, :, :, int(np.array(mask)[0].sum()):].max() < 1e-6


def test_folded_projections_equal_the_plain_linears(checkpoint, monkeypatch):
    """The fused QKV GEMM (scale folded into W_q, key bias dropped, value bias moved into the
    output bias) gives the plain per-Linear attention to float32 round-off, and is rebuilt when
    a weight array is replaced."""
    from variants.arch.encoder import Attention
    enc, _ = checkpoint.tokenizer.encode(["folded weights", "the plot was thin but the cast shone"])
    ids, mask, types = (mx.array(a) for a in checkpoint.tokenizer.batch(enc))
    att = checkpoint.encoder.layers[0].attention
    assert att.folded() is not None  # the reference takes the fused path
    fused = np.array(checkpoint.encoder(ids, mask, types).last_hidden)
    with monkeypatch.context() as m:
        m.setattr(Attention, "folded", lambda self: None)
        plain = np.array(checkpoint.encoder(ids, mask, types).last_hidden)
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=2e-5)
    old_bias = att.value.bias
    try:
        att.value.bias = old_bias + 0.5  # a new array: the folded output bias must follow
        fused = np.array(checkpoint.encoder(ids, mask, types).last_hidden)
        with monkeypatch.context() as m:
            m.setattr(Attention, "folded", lambda self: None)
            plain = np.array(checkpoint.encoder(ids, mask, types).last_hidden)
        np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=2e-5)
    finally:
        att.value.bias = old_bias


def test_transposed_mlp_weights_equal_the_linears_and_follow_replacement(checkpoint):
    """The MLP's cached transposed weights (TransformerLayer.mlp_weights) give the Linears'
    numbers, are rebuilt when a weight is replaced by another array, and give way to a
    replaced (non-plain) Linear."""
    import mlx.nn as nn
    layer = checkpoint.encoder.layers[1]
    x = mx.array(np.random.default_rng(3).standard_normal((5, 384)).astype(np.float32))
    w = layer.mlp_weights()
    assert w[0].shape == (384, 1536) and w[2].shape == (1536, 384)
    np.testing.assert_allclose(np.array(layer.mlp_in(x)), np.array(layer.intermediate(x)),
                               rtol=1e-5, atol=1e-5)
    g = mx.array(np.random.default_rng(4).standard_normal((5, 1536)).astype(np.float32))
    np.testing.assert_allclose(np.array(layer.mlp_out(g)), np.array(layer.output(g)),
                               rtol=1e-5, atol=1e-5)
    old_w, old_lin = layer.intermediate.weight, layer.output
    try:
        layer.intermediate.weight = old_w * 2.0  # a new array: the cache must follow
        assert layer.mlp_weights() is not w
        np.testing.assert_allclose(np.array(layer.mlp_in(x)), np.array(layer.intermediate(x)),
                                   rtol=1e-5, atol=1e-5)
        layer.output = nn.Linear(1536, 384, bias=False)  # not plain: the module itself runs
        assert layer.mlp_weights() is None
        np.testing.assert_array_equal(np.array(layer.mlp_out(g)), np.array(layer.output(g)))
    finally:
        layer.intermediate.weight, layer.output = old_w, old_lin


def test_derived_weight_caches_start_empty_in_deep_copies_and_go_when_unused(checkpoint,
                                                                             monkeypatch):
    """A variant deep-copied from a warmed reference does not carry the reference's folded /
    transposed / shard arrays (they were ~85 MB of dead weight in a quantised copy), and a
    layer whose Linear is replaced drops its caches. (The MLX path's caches: the compiled layer,
    tests/runtime/test_fused_layer.py, runs B = 1 without shards.)"""
    import copy
    monkeypatch.setenv("VARIANTS_FUSED_LAYER", "off")

    import mlx.nn as nn

    from variants.runtime import parallel
    enc = checkpoint.encoder
    tok = checkpoint.tokenizer
    encs, _ = tok.encode(["warm the caches", "a second, longer text to pad the first one"])
    ids, mask, types = (mx.array(a) for a in tok.batch(encs))
    mx.eval(enc(ids, mask, types).last_hidden, enc(ids[:1], mask[:1], types[:1]).last_hidden)
    layer = enc.layers[0]
    assert layer.attention._folded.arrays is not None and layer._mlp.arrays is not None
    two_streams = len(parallel.streams()) > 1
    if two_streams:
        long_ids = mx.array(np.arange(1000, 1040, dtype=np.int32)[None])
        mx.eval(enc(long_ids, mx.ones_like(long_ids)).last_hidden)  # B=1, 40 tokens: shards
        assert layer._shards.arrays is not None
    q = copy.deepcopy(enc)
    for c in q.layers:
        assert c.attention._folded.arrays is None and c._mlp.arrays is None
        assert c._shards.arrays is None
    want = np.array(q(ids, mask, types).last_hidden)  # the copy builds its own, same numbers
    np.testing.assert_array_equal(want, np.array(enc(ids, mask, types).last_hidden))
    q.layers[0].output = nn.QuantizedLinear.from_linear(q.layers[0].output, 64, 8)
    mx.eval(q(ids, mask, types).last_hidden)
    assert q.layers[0]._mlp.arrays is None and q.layers[0]._mlp.sources is None
    assert q.layers[1]._mlp.arrays is not None
    if two_streams:
        mx.eval(q(long_ids, mx.ones_like(long_ids)).last_hidden)
        assert q.layers[0]._shards.arrays is None and q.layers[1]._shards.arrays is not None


def test_sanitize_and_config_errors():
    w = {"bert.encoder.layer.0.attention.self.query.weight": 1, "pooler.dense.weight": 2,
         "embeddings.position_ids": 3, "encoder.layer.1.output.LayerNorm.bias": 4}
    assert sanitize(w) == {"layers.0.attention.query.weight": 1, "layers.1.output_norm.bias": 4}
    with pytest.raises(ValueError, match="divisible by num_attention_heads"):
        ModelArgs.from_dict(dict(vocab_size=10, hidden_size=10, num_hidden_layers=1,
                                 num_attention_heads=3, intermediate_size=8))

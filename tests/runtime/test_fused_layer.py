"""The compiled BERT layer (variants.runtime.fused_layer, qkernel/fused_layer.cpp): equal to the MLX path
and to an independent float64 NumPy layer to float32 round-off, padded and packed, B = 1 and
B >= 2, L from 1 to 512; the switch, the missing-kernel fallback and the layers it must leave to
the MLX path (quantized, attention probabilities, per-query bias)."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from scipy.special import erf

from variants.runtime import fused_layer, qkernel
from variants.arch.encoder import (BertEncoder, ModelArgs, TransformerLayer, attention_bias,
                                   compiled_paths, mean_pool)


@pytest.fixture
def calls(monkeypatch):
    """How many times the compiled layer ran (unpacked, packed)."""
    seen = {"padded": 0, "packed": 0}
    fwd, packed = fused_layer.forward, fused_layer.forward_packed

    def spy(*a, **k):
        y = fwd(*a, **k)
        seen["padded"] += y is not None
        return y

    def spy_packed(*a, **k):
        y = packed(*a, **k)
        seen["packed"] += y is not None
        return y

    monkeypatch.setattr(fused_layer, "forward", spy)
    monkeypatch.setattr(fused_layer, "forward_packed", spy_packed)
    return seen


def _numpy_layer(layer, x, key_bias=None):
    """One post-norm BERT layer in float64 from the layer's own (unfolded) weights: x (B, L, D),
    key_bias (B, L) additive or None (Devlin et al. 2019; GELU with scipy's erf)."""
    p = {k: np.array(v, np.float64) for k, v in
         [("wq", layer.attention.query.weight), ("bq", layer.attention.query.bias),
          ("wk", layer.attention.key.weight), ("bk", layer.attention.key.bias),
          ("wv", layer.attention.value.weight), ("bv", layer.attention.value.bias),
          ("wo", layer.attention.out.weight), ("bo", layer.attention.out.bias),
          ("wi", layer.intermediate.weight), ("bi", layer.intermediate.bias),
          ("wu", layer.output.weight), ("bu", layer.output.bias),
          ("g1", layer.attention_norm.weight), ("b1", layer.attention_norm.bias),
          ("g2", layer.output_norm.weight), ("b2", layer.output_norm.bias)]}
    x = np.asarray(x, np.float64)
    B, L, D = x.shape
    h = layer.attention.n_heads
    d = D // h

    def split(t):
        return t.reshape(B, L, h, d).transpose(0, 2, 1, 3)

    q, k, v = (split(x @ p["w" + n].T + p["b" + n]) for n in "qkv")
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    if key_bias is not None:
        s = s + np.asarray(key_bias, np.float64)[:, None, None, :]
    e = np.exp(s - s.max(-1, keepdims=True))
    ctx = (e / e.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(B, L, D)

    def norm(t, g, b, eps):
        mu = t.mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b

    a = norm(x + ctx @ p["wo"].T + p["bo"], p["g1"], p["b1"], layer.attention_norm.eps)
    f = a @ p["wi"].T + p["bi"]
    f = np.maximum(f, 0) if layer.hidden_act == "relu" else 0.5 * f * (1 + erf(f / np.sqrt(2)))
    return norm(a + f @ p["wu"].T + p["bu"], p["g2"], p["b2"], layer.output_norm.eps)


def _small(act="gelu", seed=3):
    mx.random.seed(seed)
    e = BertEncoder(ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64, hidden_act=act,
                              max_position_embeddings=600, layer_norm_eps=1e-6))
    mx.eval(e.parameters())
    return e


@pytest.mark.parametrize("threads", [1, 2], ids=["one-part", "two-parts"])
@pytest.mark.parametrize("act", ["gelu", "relu"])
@pytest.mark.parametrize("B,L,padded", [(1, 1, False), (1, 24, False), (2, 7, True),
                                        (3, 40, True), (1, 512, False)])
def test_layer_equals_float64_numpy(qk, act, B, L, padded, threads):
    """Real positions within 2e-5 of the float64 layer (padded query rows are not compared),
    run in one part or split in two (heads, columns, rows) over the kernel's helper thread."""
    layer = _small(act).layers[0]
    rng = np.random.default_rng(B * 1000 + L)
    x = rng.standard_normal((B, L, 32)).astype(np.float32)
    mask = np.ones((B, L), np.int32)
    if padded:
        for b, n in enumerate(rng.integers(1, L + 1, B)):
            mask[b, n:] = 0
    bias = None if mask.all() else attention_bias(mx.array(mask))
    y = fused_layer.forward(layer, mx.array(x), bias, threads=threads)
    assert y is not None
    kb = None if bias is None else np.array(bias).reshape(B, L)
    want = _numpy_layer(layer, x, kb)
    real = mask.astype(bool)
    assert np.abs(np.array(y)[real] - want[real]).max() < 2e-5
    # few rows: the kernel's own GEMM on 16-column panels; more: OpenBLAS
    assert hasattr(layer, "_fused_panels") == (B * L <= fused_layer.PANEL_ROWS)


@pytest.mark.parametrize("B,L", [(2, 19), (1, 20)], ids=["openblas", "panels"])
def test_portable_loops_equal_the_avx2_ones(qk, B, L):
    layer = _small().layers[1]
    x = mx.array(np.random.default_rng(1).standard_normal((B, L, 32)).astype(np.float32))
    before = qk.fused_allow_avx2(False)
    try:
        slow = np.array(fused_layer.forward(layer, x, None))
    finally:
        qk.fused_allow_avx2(before)
    fast = np.array(fused_layer.forward(layer, x, None))
    assert np.abs(slow - fast).max() < 1e-5 and np.abs(slow).max() > 0.5


@pytest.mark.parametrize("lengths,L", [([24], 24), ([1], 1), ([5, 5], 5), ([30, 3, 17], 30),
                                       ([40, 40, 39, 2, 1, 1, 1, 1], 40)])
def test_encoder_equals_the_mlx_path(qk, monkeypatch, calls, lengths, L):
    """Whole forwards (head split / one stream / split by sequences / packed, as the batch
    decides) with and without the compiled layer: real positions and mean-pooled embeddings."""
    enc = _small()
    rng = np.random.default_rng(len(lengths) * 100 + L)
    ids = mx.array(rng.integers(1, 50, (len(lengths), L)).astype(np.int32))
    mask = mx.array((np.arange(L)[None, :] < np.array(lengths)[:, None]).astype(np.int32))
    fast = enc(ids, mask).last_hidden
    fast_pool = np.array(mean_pool(fast, mask))
    ran = calls["padded"] + calls["packed"]
    monkeypatch.setenv(fused_layer.ENV_SWITCH, "off")
    slow = enc(ids, mask).last_hidden
    assert ran >= len(enc.layers) and calls["padded"] + calls["packed"] == ran  # off: none
    real = np.array(mask).astype(bool)
    assert np.abs(np.array(fast)[real] - np.array(slow)[real]).max() < 1e-5
    assert np.abs(fast_pool - np.array(mean_pool(slow, mask))).max() < 1e-5


def test_minilm_pooled_embeddings_equal_the_mlx_path(qk, checkpoint, monkeypatch, calls):
    """The bundled MiniLM, a padded batch (packed parts) and one long text, fused vs MLX."""
    enc = checkpoint.encoder
    rng = np.random.default_rng(7)
    for lengths, L in (([128, 90, 12, 60, 3, 128], 128), ([512], 512)):
        ids = mx.array(rng.integers(1000, 20000, (len(lengths), L)).astype(np.int32))
        mask = mx.array((np.arange(L)[None, :] < np.array(lengths)[:, None]).astype(np.int32))
        monkeypatch.setenv(fused_layer.ENV_SWITCH, "on")
        fast = np.array(mean_pool(enc(ids, mask).last_hidden, mask))
        monkeypatch.setenv(fused_layer.ENV_SWITCH, "off")
        slow = np.array(mean_pool(enc(ids, mask).last_hidden, mask))
        assert np.abs(fast - slow).max() < 1e-5
    assert calls["packed"] >= 6 and calls["padded"] >= 6


def test_switch_off_and_missing_kernel_fall_back(monkeypatch):
    layer = _small().layers[0]
    x = mx.zeros((1, 4, 32))
    monkeypatch.setenv(fused_layer.ENV_SWITCH, "off")
    assert fused_layer.forward(layer, x, None) is None
    assert fused_layer.path_name([layer]) is None
    monkeypatch.setenv(fused_layer.ENV_SWITCH, "on")
    monkeypatch.setattr(qkernel, "load", lambda: None)  # not built / VARIANTS_QKERNEL=off
    assert fused_layer.forward(layer, x, None) is None
    y, _ = layer(x, None)  # the MLX path still runs
    assert y.shape == (1, 4, 32)


def test_non_reference_layers_take_the_mlx_path(qk):
    enc = _small()
    layer = enc.layers[0]
    assert fused_layer.path_name(enc.layers) == compiled_paths(enc) == fused_layer.NAME
    x = mx.array(np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32))
    per_query = mx.zeros((2, 1, 5, 5))
    assert fused_layer.forward(layer, x, per_query) is None
    layer.attention.query = nn.QuantizedLinear.from_linear(layer.attention.query, 32, 8)
    assert fused_layer.weights(layer) is None and fused_layer.forward(layer, x, None) is None
    assert fused_layer.path_name(enc.layers) is None
    assert compiled_paths(enc) == fused_layer.NAME  # layer 1 still runs compiled
    for lyr in enc.layers:
        lyr.intermediate = nn.QuantizedLinear.from_linear(lyr.intermediate, 32, 8)
    assert compiled_paths(enc) is None
    other = _small("gelu_new").layers[0]
    assert fused_layer.weights(other) is None


def test_attention_probabilities_keep_the_mlx_path(qk, calls):
    layer = _small().layers[0]
    x = mx.array(np.random.default_rng(2).standard_normal((1, 6, 32)).astype(np.float32))
    y, probs = layer(x, None, True)
    assert probs.shape == (1, 4, 6, 6) and calls["padded"] == 0
    y2, none = layer(x, None)
    assert none is None and calls["padded"] == 1
    assert np.abs(np.array(y) - np.array(y2)).max() < 1e-5


def test_bad_arguments_are_refused(qk):
    layer = _small().layers[0]
    w = list(fused_layer.weights(layer))
    with pytest.raises(ValueError, match="lens"):
        qk.fused_bert_layer(mx.zeros((5, 32)), [2, 2], None, w, heads=4, eps1=1e-6, eps2=1e-6)
    with pytest.raises(ValueError, match="heads"):
        qk.fused_bert_layer(mx.zeros((4, 32)), [4], None, w, heads=5, eps1=1e-6, eps2=1e-6)
    with pytest.raises(ValueError, match="w_qkv_t"):
        qk.fused_bert_layer(mx.zeros((4, 32)), [4], None, [w[2]] + w[1:], heads=4, eps1=1e-6,
                            eps2=1e-6)


def test_panel_cache_starts_empty_in_deep_copies(qk):
    import copy

    layer = _small().layers[0]
    x = mx.array(np.random.default_rng(4).standard_normal((1, 9, 32)).astype(np.float32))
    y = np.array(fused_layer.forward(layer, x, None))
    assert layer._fused_panels.arrays is not None
    twin = copy.deepcopy(layer)
    assert twin._fused_panels.arrays is None
    np.testing.assert_array_equal(np.array(fused_layer.forward(twin, x, None)), y)


def test_b1_splits_in_two_parts_from_min_rows_unless_forced(monkeypatch):
    """The B = 1 default: two parts (both cores on one sequence) from parallel.MIN_ROWS rows, one
    below it and whenever the stream split is off; VARIANTS_FUSED_THREADS=1/2 forces it."""
    from variants.runtime import parallel

    monkeypatch.delenv("VARIANTS_FUSED_THREADS", raising=False)
    monkeypatch.setattr(parallel, "streams", lambda: ["s0", "s1"])
    n = parallel.MIN_ROWS
    assert [fused_layer.one_stream_threads(r) for r in (1, n - 1, n, 512)] == [1, 1, 2, 2]
    assert fused_layer.one_stream_threads() == 2
    monkeypatch.setenv("VARIANTS_FUSED_THREADS", "1")
    assert fused_layer.one_stream_threads(512) == 1
    monkeypatch.setenv("VARIANTS_FUSED_THREADS", "2")
    assert fused_layer.one_stream_threads(1) == 2
    monkeypatch.setattr(parallel, "streams", lambda: ["s0"])
    assert fused_layer.one_stream_threads(512) == 1

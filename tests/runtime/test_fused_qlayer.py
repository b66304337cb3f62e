"""The compiled BERT layer on quantized projections (variants.runtime.fused_layer.qweights,
qkernel/fused_qlayer.cpp): equal to the quantized layer's MLX path (VARIANTS_FUSED_LAYER=off)
and to a float64 NumPy layer on the mx.dequantize'd weights to float32 round-off, padded and
packed, B = 1 and B >= 2, 2 / 4 / 8 bits and a mixed-bits layer; the layers it must leave to
the MLX path; the names timing records give."""

from types import SimpleNamespace as NS

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from test_fused_layer import _numpy_layer, calls  # noqa: F401  (fixtures)

from variants.runtime import fused_layer, qlinear
from variants.sweep import timing as sweep_timing
from variants.arch.encoder import BertEncoder, ModelArgs, attention_bias, compiled_paths, mean_pool

PROJ = (("attention", "query"), ("attention", "key"), ("attention", "value"),
        ("attention", "out"), (None, "intermediate"), (None, "output"))
#: (group_size, bits) per projection, in PROJ's order
CONFIGS = {"2bit": [(32, 2)] * 6, "4bit": [(64, 4)] * 6, "8bit": [(32, 8)] * 6,
           "mixed": [(32, 2), (64, 8), (32, 4), (64, 3), (32, 6), (64, 4)]}


def _owner(layer, where):
    return layer if where is None else getattr(layer, where)


def _quantized(config, act="gelu", seed=5):
    """A 2-layer encoder (D 64, 4 heads, F 128) with every projection quantized per ``config``
    (None: left fp32) and the CPU path on (:func:`variants.runtime.qlinear.use_cpu_path`)."""
    mx.random.seed(seed)
    enc = BertEncoder(ModelArgs(vocab_size=50, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=128, hidden_act=act,
                                max_position_embeddings=600, layer_norm_eps=1e-6))
    mx.eval(enc.parameters())
    for layer in enc.layers if config else ():  # None: the fp32 layers
        for (where, name), (gs, bits) in zip(PROJ, CONFIGS[config]):
            o = _owner(layer, where)
            setattr(o, name, nn.QuantizedLinear.from_linear(getattr(o, name), gs, bits))
    qlinear.use_cpu_path(enc)
    mx.eval(enc.parameters())
    return enc


def _dequantized(layer):
    """The layer's attributes ``_numpy_layer`` reads, with each projection's weight
    ``mx.dequantize``'d (what the quantized model computes with)."""
    def lin(m):
        return NS(weight=mx.dequantize(m["weight"], m["scales"], m["biases"], m.group_size,
                                       m.bits), bias=m["bias"])
    att = layer.attention
    return NS(attention=NS(n_heads=att.n_heads, **{n: lin(getattr(att, n))
                                                   for n in ("query", "key", "value", "out")}),
              intermediate=lin(layer.intermediate), output=lin(layer.output),
              attention_norm=layer.attention_norm, output_norm=layer.output_norm,
              hidden_act=layer.hidden_act)


def _mlx_path(monkeypatch, fn):
    monkeypatch.setenv(fused_layer.ENV_SWITCH, "off")
    try:
        return fn()
    finally:
        monkeypatch.setenv(fused_layer.ENV_SWITCH, "on")


@pytest.mark.parametrize("threads", [1, 2], ids=["one-part", "two-parts"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("B,L,padded", [(1, 1, False), (1, 24, False), (3, 21, True)])
def test_qlayer_equals_mlx_path_and_float64(qk, monkeypatch, config, B, L, padded, threads):
    layer = _quantized(config).layers[1]
    q = fused_layer.qweights(layer)
    assert q is not None and list(zip(q[1], q[2])) == CONFIGS[config]
    rng = np.random.default_rng(B * 100 + L)
    x = rng.standard_normal((B, L, 64)).astype(np.float32)
    mask = np.ones((B, L), np.int32)
    if padded:
        mask[1, 9:] = 0
        mask[2, 1:] = 0
    bias = None if mask.all() else attention_bias(mx.array(mask))
    y = fused_layer.forward(layer, mx.array(x), bias, threads=threads)
    assert y is not None
    mlx_y = _mlx_path(monkeypatch, lambda: layer(mx.array(x), bias)[0])
    kb = None if bias is None else np.array(bias).reshape(B, L)
    want = _numpy_layer(_dequantized(layer), x, kb)
    real = mask.astype(bool)
    y, mlx_y = np.array(y)[real], np.array(mlx_y)[real]
    assert np.abs(y - mlx_y).max() < 1e-5
    assert np.abs(y - want[real]).max() < 2e-5
    assert np.abs(y).max() > 0.5  # a real output, not zeros
    # the quantization is seen: the unquantized fp32 layer's outputs differ by far more
    fp32 = _numpy_layer(_quantized(None).layers[1], x, kb)
    assert np.abs(fp32[real] - want[real]).max() > 1e-3


@pytest.mark.parametrize("lengths,L", [([24], 24), ([5, 5], 5), ([30, 3, 17], 30),
                                       ([40, 40, 39, 2, 1, 1, 1, 1], 40)])
def test_encoder_equals_the_mlx_path(qk, monkeypatch, calls, lengths, L):  # noqa: F811
    """Whole forwards (one stream, split by sequences, packed: as the batch decides) with the
    compiled quantized layer and with the MLX path, mixed bit widths."""
    enc = _quantized("mixed")
    rng = np.random.default_rng(len(lengths) * 10 + L)
    ids = mx.array(rng.integers(1, 50, (len(lengths), L)).astype(np.int32))
    mask = mx.array((np.arange(L)[None, :] < np.array(lengths)[:, None]).astype(np.int32))
    fast = enc(ids, mask).last_hidden
    assert calls["padded"] + calls["packed"] >= 2  # both layers ran compiled
    slow = _mlx_path(monkeypatch, lambda: enc(ids, mask).last_hidden)
    real = np.array(mask).astype(bool)
    assert np.abs(np.array(fast)[real] - np.array(slow)[real]).max() < 2e-5
    assert np.abs(np.array(mean_pool(fast, mask)) - np.array(mean_pool(slow, mask))).max() < 1e-5


def test_packed_parts_run_the_qlayer(qk, monkeypatch, calls):  # noqa: F811
    """A batch with much padding over two streams runs packed: forward_packed takes the
    quantized layer too."""
    from variants.runtime import parallel

    if len(parallel.streams()) < 2:
        pytest.skip("one CPU stream here: batches do not run packed")
    enc = _quantized("4bit")
    lengths, L = [40, 40, 39, 2, 1, 1, 1, 1], 40
    ids = mx.array(np.random.default_rng(0).integers(1, 50, (8, L)).astype(np.int32))
    mask = mx.array((np.arange(L)[None, :] < np.array(lengths)[:, None]).astype(np.int32))
    mx.eval(enc(ids, mask).last_hidden)
    assert calls["packed"] >= 2


def test_layers_it_leaves_to_the_mlx_path_and_the_names(qk, monkeypatch):
    enc = _quantized("mixed")
    layer = enc.layers[0]
    assert fused_layer.path_name(enc.layers) == compiled_paths(enc) == fused_layer.QNAME
    assert fused_layer.weights(layer) is None  # not the fp32 op
    monkeypatch.setitem(qlinear.KERNELS, 8, "unpack")  # the key projection: not the cpp kernel
    assert fused_layer.qweights(layer) is None and compiled_paths(enc) is None
    monkeypatch.undo()
    plain = nn.QuantizedLinear.from_linear(nn.Linear(64, 64), 32, 4)  # not the CPU class
    layer.attention.value = plain
    assert fused_layer.qweights(layer) is None
    assert fused_layer.forward(layer, mx.zeros((1, 3, 64)), None) is None
    assert fused_layer.path_name(enc.layers) is None
    assert compiled_paths(enc) == fused_layer.QNAME  # layer 1 still runs compiled
    layer.attention.value = nn.Linear(64, 64)  # an fp32 projection in a quantized layer
    assert fused_layer.qweights(layer) is None
    # an fp32 reference layer next to a quantized one: both names
    fp32 = BertEncoder(enc.args).layers[0]
    mx.eval(fp32.parameters())
    enc.layers[0] = fp32
    assert compiled_paths(enc) == f"{fused_layer.NAME}, {fused_layer.QNAME}"


def test_timing_record_names_the_qlayer(qk):
    model = NS(module=_quantized("4bit"))
    assert sweep_timing.kernel(model) == "dequant-cpp+gemm, fused-qlayer-cpp"


def test_bad_arguments_raise_before_running(qk):
    layer = _quantized("4bit").layers[0]
    proj, gs, bits, norms = fused_layer.qweights(layer)
    x = mx.zeros((3, 64))
    with pytest.raises(ValueError, match="group_size"):
        qk.fused_bert_qlayer(x, [3], None, proj, [16] + gs[1:], bits, norms, heads=4,
                             q_scale=0.25, eps1=1e-6, eps2=1e-6)
    with pytest.raises(ValueError, match="lens"):
        qk.fused_bert_qlayer(x, [2], None, proj, gs, bits, norms, heads=4, q_scale=0.25,
                             eps1=1e-6, eps2=1e-6)
    with pytest.raises(ValueError, match="projection shapes"):
        qk.fused_bert_qlayer(x, [3], None, proj[16:20] + proj[4:], gs, bits, norms, heads=4,
                             q_scale=0.25, eps1=1e-6, eps2=1e-6)


@pytest.mark.parametrize("heads,threads", [(4, 1), (4, 2), (8, 2)])
def test_panels_equal_the_openblas_rows(qk, heads, threads):
    """Few rows: the weights dequantized into 16-column panels for the kernel's own GEMM
    (head_dim 16; with head_dim 8 split in two parts, or without AVX2, it keeps OpenBLAS on
    the (N, K) rows): the same outputs to float32 round-off."""
    layer = _quantized("mixed").layers[0]
    layer.attention.n_heads, layer.attention.head_dim = heads, 64 // heads
    layer.attention.scale = layer.attention.head_dim ** -0.5
    proj, gs, bits, norms = fused_layer.qweights(layer)
    x = mx.array(np.random.default_rng(heads).standard_normal((20, 64)).astype(np.float32))

    def run(panels):
        return np.array(qk.fused_bert_qlayer(x, [12, 8], None, proj, gs, bits, norms,
                                             heads=heads, q_scale=layer.attention.scale,
                                             eps1=1e-6, eps2=1e-6, threads=threads,
                                             panels=panels))
    want = _numpy_layer(_dequantized(layer), np.array(x)[None, :12])[0]
    for panels in (True, False):
        y = run(panels)
        assert np.abs(y[:12] - want).max() < 2e-5
    assert np.abs(run(True) - run(False)).max() < 1e-5
    # head_dim 8 in two parts: the panels do not apply, the very same OpenBLAS path runs
    assert np.array_equal(run(True), run(False)) == (heads == 8)
    before = qk.fused_allow_avx2(False)
    try:
        portable = run(True)
    finally:
        qk.fused_allow_avx2(before)
    assert np.abs(portable - run(True)).max() < 1e-5

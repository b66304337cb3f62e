"""Half-precision scales and biases, and MLX's microscaling modes, on the compiled CPU kernels
(variants.runtime.qkernel, variants.runtime.qlinear): float16 / bfloat16 scales give exactly
float32(scale) * q + float32(bias) (what mx.quantized_matmul computes for float32 x) in the
dequantizer (AVX2 and portable loops), the Linear and the fused BERT layer; mxfp4 / mxfp8 /
nvfp4 dequantize bit for bit as mx.dequantize(dtype=float32) and the CPU Linear equals
dequantize + nn.Linear."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.runtime import fused_layer, qlinear

HALF = {"float16": mx.float16, "bfloat16": mx.bfloat16}


def _weights(out=96, inp=384, seed=0):
    rng = np.random.default_rng(seed)
    # rows of very different magnitudes: tiny scales reach float16's subnormals
    mag = np.exp(rng.uniform(-12, 1, (out, 1)))
    return mx.array((rng.standard_normal((out, inp)) * mag).astype(np.float32))


def _reference(q, s, b, gs, bits):
    """float32(scale) * q + float32(bias) in float32: mx.dequantize on widened copies."""
    return np.array(mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32),
                                  group_size=gs, bits=bits))


@pytest.mark.parametrize("avx2", [True, False], ids=["avx2", "portable"])
@pytest.mark.parametrize("dtype", sorted(HALF))
@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_dequantize_and_qlinear_with_half_scales(qk, dtype, bits, group_size, avx2):
    if avx2 and not qk.has_avx2():
        pytest.skip("no AVX2 on this CPU")
    q, s, b = mx.quantize(_weights(), group_size=group_size, bits=bits)
    s, b = s.astype(HALF[dtype]), b.astype(HALF[dtype])
    want = _reference(q, s, b, group_size, bits)
    # the widening is real: the half-precision scales differ from the float32 ones
    assert not np.array_equal(want, _reference(q, *mx.quantize(_weights(), group_size=group_size,
                                                                  bits=bits)[1:], group_size,
                                               bits))
    x = mx.random.normal((5, 384), key=mx.random.key(bits))
    bias = mx.arange(96, dtype=mx.float32) / 10
    before = qk.allow_avx2(avx2)
    try:
        got = np.array(qk.dequantize(q, s, b, group_size, bits))
        y = np.array(qk.qlinear(x, q, s, b, bias, group_size, bits, 0))
        y32 = np.array(qk.qlinear(x, q, s.astype(mx.float32), b.astype(mx.float32), bias,
                                  group_size, bits, 0))
    finally:
        qk.allow_avx2(before)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(y, y32)  # the same weight, the same GEMM
    # to float32 round-off of the sum (rows of very different magnitudes: bound by |x| |W|^T)
    xs = np.array(x).astype(np.float64)
    tol = 1e-6 * (np.abs(xs) @ np.abs(want.T).astype(np.float64)) + 1e-6
    assert (np.abs(y - (xs @ want.T.astype(np.float64) + np.array(bias))) <= tol).all()
    # what mx.quantized_matmul computes with these scales (float32 x)
    native = mx.quantized_matmul(x, q, s, b, transpose=True, group_size=group_size, bits=bits)
    assert (np.abs(y - (np.array(native) + np.array(bias))) <= 2 * tol).all()


@pytest.mark.parametrize("dtype", sorted(HALF))
@pytest.mark.parametrize("kernel", ["cpp", "unpack", "dequantize"])
def test_every_python_dequantizer_widens(qk, dtype, kernel):
    """mx.dequantize alone would round the weight to the scales' dtype: the "dequantize"
    kernel must not."""
    q, s, b = mx.quantize(_weights(seed=3), group_size=64, bits=4)
    s, b = s.astype(HALF[dtype]), b.astype(HALF[dtype])
    got = qlinear.dequantize(q, s, b, 64, 4, kernel)
    assert got.dtype == mx.float32
    np.testing.assert_array_equal(np.array(got), _reference(q, s, b, 64, 4))


def test_mixed_scale_and_bias_dtypes_refused(qk):
    q, s, b = mx.quantize(_weights(), group_size=64, bits=4)
    with pytest.raises(ValueError, match="same dtype"):
        qk.dequantize(q, s.astype(mx.float16), b, 64, 4)
    with pytest.raises(ValueError, match="float16"):
        qk.dequantize(q, s.astype(mx.int32), b.astype(mx.int32), 64, 4)


def test_fused_qlayer_with_half_scales_equals_the_unfused_path(qk, monkeypatch):
    """The fused quantized BERT layer with float16 scales: equal bit for bit to itself on
    float32 copies of them, and to the unfused CpuQuantizedLinear path to round-off."""
    from test_fused_qlayer import _mlx_path, _quantized

    enc = _quantized("mixed")
    layer = enc.layers[1]
    mods = [layer.attention.query, layer.attention.key, layer.attention.value,
            layer.attention.out, layer.intermediate, layer.output]
    for m in mods:
        m.scales, m.biases = m.scales.astype(mx.float16), m.biases.astype(mx.float16)
    q = fused_layer.qweights(layer)
    assert q is not None and q[0][1].dtype == mx.float16
    x = mx.array(np.random.default_rng(1).standard_normal((2, 17, 64)).astype(np.float32))
    y = np.array(fused_layer.forward(layer, x, None, threads=1))
    unfused = np.array(_mlx_path(monkeypatch, lambda: layer(x, None)[0]))
    assert np.abs(y - unfused).max() < 1e-5
    for m in mods:
        m.scales, m.biases = m.scales.astype(mx.float32), m.biases.astype(mx.float32)
    np.testing.assert_array_equal(y, np.array(fused_layer.forward(layer, x, None, threads=1)))


@pytest.mark.parametrize("avx2", [True, False], ids=["avx2", "portable"])
@pytest.mark.parametrize("mode", sorted(qlinear.MODES))
def test_mode_dequantize_bit_for_bit_every_scale_code(qk, mode, avx2):
    gs, bits = qlinear.MODES[mode]
    q, s = mx.quantize(_weights(seed=7), group_size=gs, bits=bits, mode=mode)
    codes = mx.array((np.arange(s.size) * 37 % 256).astype(np.uint8).reshape(s.shape))
    before = qk.allow_avx2(avx2)
    try:
        for sc in (s, codes):  # the real scales, then all 256 codes (NaN / inf ones included)
            got = np.array(qk.dequantize_mode(q, sc, mode))
            want = np.array(mx.dequantize(q, sc, group_size=gs, bits=bits, mode=mode,
                                          dtype=mx.float32))
            np.testing.assert_array_equal(got, want)
    finally:
        qk.allow_avx2(before)
    with pytest.raises(ValueError, match="mode must be"):
        qk.dequantize_mode(q, s, "fp3")


@pytest.mark.parametrize("mode", sorted(qlinear.MODES))
def test_mode_linear_equals_dequantize_then_linear(qk, mode):
    lin = nn.Linear(384, 160)
    q = nn.QuantizedLinear.from_linear(lin, mode=mode)
    native = nn.QuantizedLinear.__call__
    qlinear.use_cpu_path(q)
    assert q.kernel == "dequant-mode-cpp+gemm"
    x = mx.random.normal((3, 7, 384), key=mx.random.key(0))
    sim = nn.Linear(384, 160)
    sim.weight = mx.dequantize(q.weight, q.scales, group_size=q.group_size, bits=q.bits,
                               mode=mode, dtype=mx.float32)
    sim.bias = lin.bias
    y = np.array(q(x))
    np.testing.assert_array_equal(y, np.array(sim(x)))  # the same weight, the same GEMM
    np.testing.assert_allclose(y, np.array(native(q, x)), rtol=1e-5, atol=1e-5)
    assert np.abs(y - np.array(lin(x))).max() > 1e-3  # the quantization is seen
    # without the extension: mx.dequantize, the same numbers
    np.testing.assert_array_equal(
        np.array(qlinear.dequantize_mode(q.weight, q.scales, mode, "dequantize")),
        np.array(sim.weight))

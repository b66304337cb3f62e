"""The compiled CPU kernel for quantized Linears (variants.runtime.qkernel): equal to mx.dequantize bit for
bit, the Linear equal to the dense NumPy product to round-off at every tile size, its temporary
buffer counted in MLX's peak memory, bad arguments refused; and the fallback: disabled, missing
tools or a failed build give one line and the MLX unpacking path with the same numbers."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.runtime import qkernel, qlinear
from variants.families.quant.build import BITS


@pytest.fixture(scope="module")
def qk():
    mod = qkernel.load()
    if mod is None:
        pytest.skip(f"compiled kernel unavailable here: {qkernel.why_unavailable()}")
    return mod


def _weights(out=160, inp=384, seed=0):
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal((out, inp)).astype(np.float32) * 0.05)


@pytest.mark.parametrize("avx2", [True, False], ids=["avx2", "portable"])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_dequantize_equals_mx_dequantize_bit_for_bit(qk, bits, group_size, avx2):
    """Both loops: AVX2 (where the CPU has it) and the portable one; the last rows end the
    packed buffer (the AVX2 loop must not read past it)."""
    if avx2 and not qk.has_avx2():
        pytest.skip("no AVX2 on this CPU")
    q, s, b = mx.quantize(_weights(), group_size=group_size, bits=bits)
    before = qk.allow_avx2(avx2)
    try:
        mine = np.array(qk.dequantize(q, s, b, group_size, bits))
    finally:
        qk.allow_avx2(before)
    theirs = np.array(mx.dequantize(q, s, b, group_size=group_size, bits=bits))
    assert mine.shape == (160, 384) and mine.dtype == np.float32
    np.testing.assert_array_equal(mine, theirs)
    assert len(np.unique(mine[7, :group_size])) <= 2 ** bits  # a real quantization


@pytest.mark.parametrize("bits", [3, 4, 8])
@pytest.mark.parametrize("tile", [0, 1, 48, 1000])
def test_qlinear_equals_dense_product_at_every_tile(qk, bits, tile):
    """tile 48 leaves a 16-row last tile (160 = 3 * 48 + 16); 1 and 1000: the extremes."""
    q, s, b = mx.quantize(_weights(), group_size=64, bits=bits)
    w = np.array(mx.dequantize(q, s, b, group_size=64, bits=bits)).astype(np.float64)
    x = mx.random.normal((2, 5, 384), key=mx.random.key(bits))
    bias = mx.arange(160, dtype=mx.float32) / 10
    want = np.array(x).astype(np.float64) @ w.T
    got = np.array(qk.qlinear(x, q, s, b, bias, 64, bits, tile))
    assert got.shape == (2, 5, 160) and got.dtype == np.float32
    np.testing.assert_allclose(got, want + np.array(bias), rtol=1e-5, atol=1e-5)
    got_nb = np.array(qk.qlinear(x, q, s, b, None, 64, bits, tile))
    np.testing.assert_allclose(got_nb, want, rtol=1e-5, atol=1e-5)


def test_temporary_buffer_counts_in_peak_memory(qk):
    q, s, b = mx.quantize(_weights(1536, 384), group_size=64, bits=4)
    x = mx.ones((4, 384))
    mx.eval(q, s, b, x)
    dense_bytes = 1536 * 384 * 4

    def own_peak(tile):
        mx.synchronize()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        mx.eval(qk.qlinear(x, q, s, b, None, 64, 4, tile))
        return mx.get_peak_memory() - before

    assert own_peak(0) >= dense_bytes  # the whole fp32 weight, for the duration of the call
    assert own_peak(96) < dense_bytes / 4  # 96 rows at a time: 1/16 of it


def test_bad_arguments_are_refused(qk):
    q, s, b = mx.quantize(_weights(), group_size=64, bits=4)
    with pytest.raises(ValueError, match="bits must be 2, 3, 4, 6 or 8"):
        qk.dequantize(q, s, b, 64, 5)
    with pytest.raises(ValueError, match="group_size does not match"):
        qk.dequantize(q, s, b, 32, 4)
    with pytest.raises(ValueError, match="x must be float32"):
        qk.qlinear(mx.ones((3, 100)), q, s, b, None, 64, 4, 0)
    with pytest.raises(ValueError, match="bias must be float32"):
        qk.qlinear(mx.ones((3, 384)), q, s, b, mx.ones((7,)), 64, 4, 0)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state where the kernel was never tried, with an empty cache folder."""
    monkeypatch.setattr(qkernel, "_state", {"module": None, "tried": False, "why": None})
    monkeypatch.setenv(qkernel.ENV_CACHE, str(tmp_path / "kcache"))
    return tmp_path


def test_switched_off_the_layer_falls_back_with_the_same_numbers(monkeypatch):
    """A layer made while the kernel is loaded (the process's own state and cache, so nothing
    is built here: with ``fresh`` use_cpu_path compiled the kernel again, ~35 s) switches to
    the unpacking path when the kernel is switched off."""
    lin = nn.Linear(384, 160)
    lin.weight = _weights()
    fast = qlinear.use_cpu_path(nn.QuantizedLinear.from_linear(lin, 64, 4))
    x = mx.random.normal((6, 384), key=mx.random.key(3))
    if qkernel.load() is not None:
        assert fast.kernel == "dequant-cpp+gemm"  # the compiled kernel, before the switch
    monkeypatch.setenv(qkernel.ENV_SWITCH, "off")
    assert qkernel.load() is None and qlinear.resolve("cpp") == "unpack"
    assert fast.kernel == "unpack+gemm"
    w = np.array(mx.dequantize(fast.weight, fast.scales, fast.biases, group_size=64, bits=4))
    want = np.array(x) @ w.T + np.array(lin.bias)
    np.testing.assert_allclose(np.array(fast(x)), want, rtol=1e-5, atol=1e-5)


def test_missing_tools_give_one_line_and_no_kernel(monkeypatch, fresh, capsys):
    monkeypatch.setattr(qkernel.shutil, "which", lambda name: None)
    path, why = qkernel.build()
    assert path is None and why.startswith("missing cmake, a C++ compiler")
    assert qkernel.load() is None and qkernel.load() is None  # tried once
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "quantized CPU kernel unavailable (missing cmake" in err
    assert "using the MLX unpacking path" in err


def test_a_failed_build_is_remembered_and_named(monkeypatch, fresh):
    src = fresh / "src"
    src.mkdir()
    for name in qkernel.SOURCES[:-1]:  # the sources, CMakeLists.txt last
        (src / name).write_text("// empty\n")
    (src / "CMakeLists.txt").write_text('cmake_minimum_required(VERSION 3.20)\n'
                                        'project(x NONE)\nmessage(FATAL_ERROR "broken on purpose")\n')
    monkeypatch.setattr(qkernel, "HERE", src)
    if qkernel.missing_tools():
        pytest.skip(f"no build tools: {qkernel.missing_tools()}")
    path, why = qkernel.build()
    folder = fresh / "kcache" / qkernel.key()
    assert path is None and why.startswith("build failed (cmake -S exit") and "build.log" in why
    assert "broken on purpose" in (folder / "build.log").read_text()
    assert (folder / "FAILED").read_text().strip() == why
    assert qkernel.build() == (None, why)  # remembered: no second attempt for this digest
    assert not list(folder.glob("_qkernel*"))

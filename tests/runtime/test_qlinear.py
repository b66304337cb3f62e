"""The CPU path of native quantized Linears (variants.runtime.qlinear): the unpacking dequantizer equals
mx.dequantize bit for bit, the layer equals mx.quantized_matmul to round-off (split over the
streams or not), model bytes are unchanged and nothing fp32 is kept, timing records name the
kernel."""

import copy

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from variants.arch import encoder
from variants.runtime import fused_layer, qlinear
from variants.sweep import timing as sweep_timing
from variants.families.quant import build as quantize
from variants.families.quant.build import BITS, QuantConfig, quantize_module
from variants.models import sentiment
from variants.runtime.qlinear import CpuQuantizedLinear


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)


def _real_weight(model):
    return dict(model.module.named_modules())["encoder.layers.0.intermediate"].weight  # (1536, 384)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_unpack_equals_mx_dequantize_bit_for_bit(model, bits, group_size):
    w = _real_weight(model)[:256]
    q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    mine = np.array(qlinear.unpack(q, s, b, group_size, bits))
    theirs = np.array(mx.dequantize(q, s, b, group_size=group_size, bits=bits))
    assert mine.shape == (256, 384) and mine.dtype == np.float32
    np.testing.assert_array_equal(mine, theirs)
    # a real quantization: the levels per group are at most 2**bits
    assert len(np.unique(mine[0, :group_size])) <= 2 ** bits


@pytest.mark.parametrize("bits, rows, kernel",
                         [(b, r, k) for k in ("unpack", "cpp") for b in BITS for r in (3, 200)]
                         + [(4, 3, "dequantize"), (3, 200, "dequantize")])
def test_cpu_linear_equals_quantized_matmul(model, monkeypatch, bits, rows, kernel):
    """3 rows: the output features split over the streams (SPLIT_ROWS 128); 200: one GEMM.
    "cpp": the compiled kernel (variants.runtime.qkernel), skipped where it could not be built."""
    if kernel == "cpp" and qlinear.qkernel.load() is None:
        pytest.skip(f"compiled kernel unavailable: {qlinear.qkernel.why_unavailable()}")
    monkeypatch.setitem(qlinear.KERNELS, bits, kernel)
    monkeypatch.setattr(qlinear, "SPLIT_ROWS", 128)
    lin = nn.Linear(384, 1536)
    lin.weight = _real_weight(model)
    plain = nn.QuantizedLinear.from_linear(lin, 64, bits)
    fast = qlinear.use_cpu_path(nn.QuantizedLinear.from_linear(lin, 64, bits))
    assert type(fast) is CpuQuantizedLinear
    x = mx.random.normal((rows, 384), key=mx.random.key(rows))
    want = np.array(plain(x))  # mx.quantized_matmul: an independent implementation
    got = np.array(fast(x))
    assert got.shape == (rows, 1536)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    # and against the dense dequantized weight by NumPy
    w = np.array(mx.dequantize(plain.weight, plain.scales, plain.biases, group_size=64, bits=bits))
    np.testing.assert_allclose(got, np.array(x) @ w.T + np.array(lin.bias), rtol=1e-4, atol=2e-5)
    assert fast.kernel == qlinear.NAMES[kernel]


def test_off_cpu_the_layer_is_quantized_matmul(model, monkeypatch):
    lin = nn.Linear(384, 1536)
    lin.weight = _real_weight(model)
    fast = qlinear.use_cpu_path(nn.QuantizedLinear.from_linear(lin, 64, 4))
    x = mx.random.normal((5, 384), key=mx.random.key(1))
    monkeypatch.setattr(qlinear, "on_cpu", lambda: False)
    assert fast.kernel == "quantized_matmul" and qlinear.kernels(fast) == ["quantized_matmul"]
    want = mx.quantized_matmul(x, fast.weight, fast.scales, fast.biases, transpose=True,
                               group_size=64, bits=4) + fast.bias
    np.testing.assert_array_equal(np.array(fast(x)), np.array(want))


@pytest.mark.parametrize("bits", [3, 4])
def test_native_model_bytes_unchanged_and_nothing_fp32_kept(model, bits):
    cfg = QuantConfig(bits=bits)
    native, info = quantize_module(model.module, cfg, mode="native")
    plain = copy.deepcopy(model.module)
    nn.quantize(plain, group_size=64, bits=bits,
                class_predicate=quantize.make_predicate(cfg, []))

    def layout(m):
        return [(k, v.shape, v.dtype, v.nbytes) for k, v in tree_flatten(m.parameters())]

    before = layout(native)
    assert before == layout(plain)  # same parameters as MLX's own QuantizedLinear model
    assert info["model_bytes"] == sum(n for *_, n in before)
    ids = mx.array([[101, 2023, 2003, 1037, 2204, 2154, 102]])
    mx.eval(native(ids, mx.ones_like(ids), mx.zeros_like(ids)))
    assert layout(native) == before  # no dequantized weight cached as a parameter ...
    fp32_full = [k for k, v in vars(dict(native.named_modules())["encoder.layers.0.intermediate"])
                 .items() if isinstance(v, mx.array) and v.size == 1536 * 384]
    assert fp32_full == []  # ... nor as an attribute


def test_timing_records_name_the_kernel(model, monkeypatch):
    native = quantize.build(model, QuantConfig(bits=4), mode="native")[0]
    sim = quantize.build(model, QuantConfig(bits=4), mode="simulated")[0]
    # built: every encoder layer runs as one compiled op on its quantized weights too
    default = ("dequant-cpp+gemm, fused-qlayer-cpp" if qlinear.qkernel.load() is not None
               else "unpack+gemm")
    assert sweep_timing.kernel(native) == default
    monkeypatch.setitem(qlinear.KERNELS, 4, "unpack")
    assert sweep_timing.kernel(native) == "unpack+gemm"
    fp32 = encoder.compiled_paths(model.module) or "fp32 gemm"  # fused-layer-cpp when built
    assert sweep_timing.kernel(sim) == sweep_timing.kernel(model) == fp32
    monkeypatch.setitem(qlinear.KERNELS, 4, "dequantize")
    assert sweep_timing.kernel(native) == "dequant+gemm"

    entry = {"ref": {}, "var": {}}
    monkeypatch.setattr(sweep_timing, "end_to_end_call", lambda m, ts: None)
    monkeypatch.setattr(sweep_timing, "time_alternating", lambda *a, **k: None)
    monkeypatch.setattr(sweep_timing, "split_regions", lambda r: (dict(entry), dict(entry)))
    monkeypatch.setattr(sweep_timing, "add_plausibility", lambda *a, **k: None)  # no real times

    class Cfg:
        speed_mode, timing_warmup, timing_rounds, timing_min_rounds, timing_budget_s = \
            "native", 1, 2, 2, 1.0

    out = sweep_timing.time_pair(model, native, {1: (["a text"], 5), 32: (["x"] * 32, 9)}, Cfg)
    assert out["kernel"] == {"reference": fp32, "variant": "dequant+gemm"}
    for region in ("batches", "end_to_end"):
        assert [e["kernel"] for e in out[region].values()] == ["dequant+gemm"] * 2

"""A quantized ModernBERT layer as one compiled op (variants/arch/modernbert_fused_q.py,
qkernel/fused_mbert_qlayer.cpp): one layer equal to an independent float64 NumPy layer on the
mx.dequantize'd weights (global and local, a small window so the windowed blocks run, padded and
not, one part or two, panels or OpenBLAS); whole forwards equal to the plain quantized MLX path
(each Linear a dequant-cpp+gemm call) for 2 / 4 / 8 bits and a mixed layer, B = 1 and 3, lengths
across the local window; a stack with an fp32 layer; the layers it must leave to the plain path;
the names timing records give. Fixtures: the two ModernBERT checkpoints of
tests/arch/test_modernbert_fused.py (D 64, F 96, 4 heads; window 128 and no bias anywhere, erf GELU;
window 64 with every bias, tanh GELU)."""

import copy
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from test_modernbert_fused import _mask, _numpy_layer

from variants.arch import modernbert, modernbert_fast, modernbert_fused_q
from variants.runtime import qlinear
from variants.sweep import timing as sweep_timing
from variants.families.lowrank.build import LowRankLinear
from variants.checkpoints.load import load_checkpoint
from variants.arch.encoder import MASK_BIAS

HF = Path(__file__).parents[1] / "fixtures" / "hf"
PROJ = (("attn", "Wqkv"), ("attn", "Wo"), ("mlp", "Wi"), ("mlp", "Wo"))
#: (group_size, bits) per projection in PROJ's order (F = 96: group size 32 for the MLP's Wo)
CONFIGS = {"2bit": [(32, 2)] * 4, "4bit": [(64, 4)] * 3 + [(32, 4)], "8bit": [(32, 8)] * 4,
           "mixed": [(32, 3), (64, 8), (32, 6), (32, 2)]}


@pytest.fixture(scope="module")
def mk(qk):
    assert hasattr(qk, "fused_mbert_qlayer")  # the kernel builds every source in SOURCES
    return qk


@pytest.fixture(scope="module")
def fp32():
    return {n: load_checkpoint(HF / n).encoder for n in ("modernbert", "modernbert_g2")}


def _quantized(enc, config, layers=None):
    """A copy of ``enc`` with the projections of ``layers`` (default all) quantized per
    ``config`` and the CPU path on (:func:`variants.runtime.qlinear.use_cpu_path`)."""
    enc = copy.deepcopy(enc)
    for i, layer in enumerate(enc.layers):
        if layers is not None and i not in layers:
            continue
        for (where, name), (gs, bits) in zip(PROJ, CONFIGS[config]):
            o = getattr(layer, where)
            setattr(o, name, nn.QuantizedLinear.from_linear(getattr(o, name), gs, bits))
    qlinear.use_cpu_path(enc)
    mx.eval(enc.parameters())
    return enc


@pytest.fixture(scope="module")
def quant(fp32):
    cache = {}

    def get(name, config):
        if (name, config) not in cache:
            cache[name, config] = _quantized(fp32[name], config)
        return cache[name, config]
    return get


@pytest.fixture
def runs(monkeypatch):
    """How many layer stacks ran through modernbert_fused_q."""
    seen = [0]
    stack = modernbert_fused_q._stack

    def spy(*a, **k):
        seen[0] += 1
        return stack(*a, **k)

    monkeypatch.setattr(modernbert_fused_q, "_stack", spy)
    return seen


def _dequantized(qlayer, like):
    """A copy of the fp32 layer ``like`` whose projections hold ``qlayer``'s mx.dequantize'd
    weights (what the quantized model computes with), for ``_numpy_layer``."""
    layer = copy.deepcopy(like)
    for where, name in PROJ:
        m = getattr(getattr(qlayer, where), name)
        getattr(getattr(layer, where), name).weight = mx.dequantize(
            m["weight"], m["scales"], m["biases"], m.group_size, m.bits)
    return layer


def _op(mk, enc, i, x, mask, half=None, threads=1, panels=False, q_scale=None):
    """Layer i of the quantized ``enc`` through the op on x (B, L, D)."""
    layer = enc.layers[i]
    proj, gs, bits, norms, eps1, eps2, act = modernbert_fused_q.qlayer_args(layer)
    B, L, D = x.shape
    if half is None:
        half = -1 if layer.is_global else enc.args.local_attention // 2
    theta = enc.args.global_rope_theta if layer.is_global else enc.args.local_rope_theta
    hd = D // layer.attn.n_heads
    cos, sin = (t.reshape(L, hd) for t in modernbert_fast.rope_for_length(L, theta, hd)[:2])
    kb = None if mask.all() else mx.array(((1 - mask) * MASK_BIAS).astype(np.float32).ravel())
    y = mk.fused_mbert_qlayer(
        mx.array(x.reshape(B * L, D)), [L] * B, kb, cos, sin, proj, gs, bits, norms,
        heads=layer.attn.n_heads, q_scale=layer.attn.scale if q_scale is None else q_scale,
        eps1=eps1, eps2=eps2, act=act, half=half, threads=threads, panels=panels)
    return np.array(y).reshape(B, L, D), np.array(cos), np.array(sin), half


@pytest.mark.parametrize("name", ["modernbert", "modernbert_g2"], ids=["no-bias", "biases"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("i,half", [(0, None), (1, None), (1, 3)], ids=["global0", "local",
                                                                        "local-w3"])
@pytest.mark.parametrize("B,L,pad", [(1, 1, False), (1, 24, True), (3, 70, True)])
@pytest.mark.parametrize("threads,panels", [(1, False), (2, True)], ids=["one-part-blas",
                                                                        "two-parts-panels"])
def test_layer_equals_float64_numpy(mk, fp32, quant, name, config, i, half, B, L, pad, threads,
                                    panels):
    """Real rows within 1e-5 of the float64 layer on the dequantized weights."""
    enc = quant(name, config)
    rng = np.random.default_rng(B * 1000 + L + i)
    x = rng.standard_normal((B, L, 64)).astype(np.float32)
    mask = _mask(B, L, pad)
    y, cos, sin, h = _op(mk, enc, i, x, mask, half, threads, panels)
    want = _numpy_layer(_dequantized(enc.layers[i], fp32[name].layers[i]), x, mask, h, cos, sin)
    real = mask.astype(bool)
    assert np.abs(y[real] - want[real]).max() <= 1e-5
    assert np.abs(want[real]).std() > 0.5


def test_the_query_scale_and_the_gate_rows_matter(mk, fp32, quant):
    """The comparisons here can fail: without the 1/sqrt(head_dim) query scale the rows move far
    beyond round-off. (Checked once by hand: reading GeGLU's gate from Wi's rows [0, F) instead
    of [F, 2F) in fused_mbert_layer.cpp's proj_gemm made 197 of this file's then 202 tests fail.)"""
    enc = quant("modernbert_g2", "4bit")
    x = np.random.default_rng(5).standard_normal((3, 70, 64)).astype(np.float32)
    mask = _mask(3, 70, True)
    y, *_ = _op(mk, enc, 1, x, mask, 3)
    unscaled, *_ = _op(mk, enc, 1, x, mask, 3, q_scale=1.0)
    real = mask.astype(bool)
    assert np.abs(unscaled[real] - y[real]).max() > 1e-2


def _plain_and_fused(enc, B, L, pad):
    mask = _mask(B, L, pad)
    ids = mx.array(np.random.default_rng(L + B).integers(5, 2900, (B, L)).astype(np.int32))
    enc.fast = False
    try:
        plain = np.array(enc(ids, mx.array(mask)).last_hidden)
    finally:
        enc.fast = True
    return plain, np.array(enc(ids, mx.array(mask)).last_hidden), mask.astype(bool)


@pytest.mark.parametrize("name", ["modernbert", "modernbert_g2"], ids=["no-bias", "biases"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("B,L,pad", [(1, 1, False), (1, 24, True), (3, 24, False),
                                     (3, 70, True), (1, 200, False), (3, 200, True)])
def test_encoder_equals_the_plain_quantized_path(mk, quant, runs, name, config, B, L, pad):
    """Whole forwards (6 layers, global and local; L = 200 beyond both windows, 70 beyond the
    64 one only) equal the plain path, whose Linears are dequant-cpp+gemm calls."""
    enc = quant(name, config)
    plain, fused, real = _plain_and_fused(enc, B, L, pad)
    assert runs[0] >= 1  # the op ran (once, or once per stream)
    assert np.abs(fused[real] - plain[real]).max() <= 1e-5
    assert np.abs(plain[real]).std() > 0.1


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("panel_rows", [0, 10 ** 6], ids=["openblas", "panels"])
def test_parts_and_gemms_agree(mk, quant, runs, monkeypatch, threads, panel_rows):
    monkeypatch.setenv("VARIANTS_FUSED_THREADS", threads)
    monkeypatch.setattr(modernbert_fused_q, "QPANEL_ROWS", panel_rows)
    plain, fused, real = _plain_and_fused(quant("modernbert_g2", "mixed"), 1, 90, False)
    assert runs[0] == 1 and np.abs(fused[real] - plain[real]).max() <= 1e-5


def test_a_stack_with_an_fp32_layer(mk, fp32, runs):
    """Layer 0 left fp32 runs the fp32 op inside the same stack; records name both ops."""
    enc = _quantized(fp32["modernbert"], "4bit", layers={1, 2, 3, 4, 5})
    plain, fused, real = _plain_and_fused(enc, 3, 70, True)
    assert runs[0] >= 1 and np.abs(fused[real] - plain[real]).max() <= 1e-5
    assert modernbert.compiled_paths(enc) == "fused-mbert-layer-cpp, fused-mbert-qlayer-cpp"


def _other_kernel(enc):
    enc.layers[2].mlp.Wi.__class__ = nn.QuantizedLinear  # quantized_matmul, not the cpp kernel


def _low_rank(enc):
    w = np.array(mx.dequantize(*(enc.layers[3].attn.Wo[k] for k in ("weight", "scales",
                                                                    "biases")), 64, 4))
    u, s, vt = np.linalg.svd(w)
    enc.layers[3].attn.Wo = LowRankLinear(u[:, :8] * s[:8], vt[:8])


@pytest.mark.parametrize("change", [_other_kernel, _low_rank], ids=["quantized_matmul",
                                                                    "low-rank"])
def test_layers_it_must_leave_to_the_plain_path(mk, quant, runs, change):
    enc = copy.deepcopy(quant("modernbert", "4bit"))
    assert modernbert_fused_q.applies(enc)
    change(enc)
    assert not modernbert_fused_q.applies(enc) and modernbert.compiled_paths(enc) is None
    plain, fused, real = _plain_and_fused(enc, 1, 24, False)
    assert runs[0] == 0 and np.abs(fused - plain).max() == 0.0


def test_switch_masked_mode_and_timing_names(mk, quant, runs, monkeypatch):
    enc = quant("modernbert_g2", "8bit")
    ids, mask = mx.array([[5, 6, 7, 8, 9]]), mx.ones((1, 5), mx.int32)

    class Model:
        module = enc
    assert sweep_timing.kernel(Model) == "dequant-cpp+gemm, fused-mbert-qlayer-cpp"
    monkeypatch.setenv("VARIANTS_FUSED_LAYER", "off")
    enc(ids, mask)
    assert runs[0] == 0 and sweep_timing.kernel(Model) == "dequant-cpp+gemm"
    monkeypatch.delenv("VARIANTS_FUSED_LAYER")
    enc.local_attention_impl = "masked"
    try:
        enc(ids, mask)
        assert runs[0] == 0 and modernbert.compiled_paths(enc) is None
    finally:
        enc.local_attention_impl = None
    enc(ids, mask)
    assert runs[0] == 1


@pytest.mark.parametrize("panels", [False, True], ids=["openblas", "panels"])
def test_the_scratch_buffer_counts_in_peak_memory(mk, quant, panels):
    """Peak memory of one call: x and y (n, D), the activations (fused_mbert_run: n (5D + 2F)
    + n D + 64 L floats, one part) and the dequantization buffer max(3D, 2F) D floats (+ 16 F
    staging floats with panels), up to 16 KB more (alone it was exact; after other tests MLX's
    small arrays added 2.5-6 KB). A buffer outside MLX's allocator (48 KB here) would make the
    difference negative: it is not hidden from the report."""
    enc = quant("modernbert_g2", "4bit")
    n, D, F = 200, 64, 96
    x = np.random.default_rng(0).standard_normal((1, n, D)).astype(np.float32)
    mask = _mask(1, n, False)
    _op(mk, enc, 1, x, mask, panels=panels)  # rotary tables and the like built once
    mx.synchronize()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    _op(mk, enc, 1, x, mask, panels=panels)
    floats = 2 * n * D + n * (5 * D + 2 * F) + n * D + 64 * n + max(3 * D, 2 * F) * D
    extra = mx.get_peak_memory() - base - 4 * (floats + (16 * F if panels else 0))
    assert 0 <= extra < 16384


def test_bad_arguments_name_the_problem(mk, quant):
    proj, gs, bits, norms, eps1, eps2, act = modernbert_fused_q.qlayer_args(
        quant("modernbert", "4bit").layers[1])
    x, cos = mx.zeros((4, 64)), mx.zeros((4, 16))
    kw = dict(heads=4, q_scale=0.25, eps1=eps1, eps2=eps2)
    with pytest.raises(ValueError, match="lens must sum"):
        mk.fused_mbert_qlayer(x, [3], None, cos, cos, proj, gs, bits, norms, **kw)
    with pytest.raises(ValueError, match="projection shapes"):
        mk.fused_mbert_qlayer(x, [4], None, cos, cos, proj[4:8] + proj[4:], gs, bits, norms,
                              **kw)
    with pytest.raises(ValueError, match="g2 required"):
        mk.fused_mbert_qlayer(x, [4], None, cos, cos, proj, gs, bits, [None] * 4, **kw)

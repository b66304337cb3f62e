"""A W8A8 ModernBERT layer as one compiled op (variants/arch/modernbert_fused_i8.py,
qkernel/fused_mbert_int8layer.cpp): one layer against the same layer on the plain MLX path (each
projection an int8_linear call) and against the simulated (fake-quantized fp32) layer, global and
local (a window shorter than the sequence), padded and not, L = 1 and L not a multiple of 8, one
part or two, with SmoothQuant factors; whole forwards against the plain path; the layers it must
leave to the plain path; the names timing records give; bad arguments. Fixtures: the two
ModernBERT checkpoints of tests/arch/test_modernbert_fused.py (D 64, F 96, 4 heads; window 128 and
no bias anywhere, erf GELU; window 64 with every bias, tanh GELU)."""

import copy
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from test_modernbert_fused import _mask

from variants.arch import modernbert, modernbert_fast, modernbert_fused_i8, modernbert_fused_q
from variants.arch.encoder import MASK_BIAS
from variants.checkpoints.load import load_checkpoint
from variants.families.w8a8.build import smooth_factors
from variants.runtime import int8_linear, parallel
from variants.runtime.int8_linear import Int8Linear
from variants.sweep import timing as sweep_timing

HF = Path(__file__).parents[1] / "fixtures" / "hf"
PROJ = (("attn", "Wqkv"), ("attn", "Wo"), ("mlp", "Wi"), ("mlp", "Wo"))


@pytest.fixture(scope="module")
def mk(qk):
    if not qk.has_dnnl():
        pytest.skip("W8A8 integer GEMM unavailable here (apt-get install libdnnl-dev)")
    assert hasattr(qk, "fused_mbert_int8layer")  # the kernel builds every source in SOURCES
    return qk


def _w8a8(enc, native=True, smooth=False, skip=()):
    """A copy of ``enc`` with every projection (but the (layer, where, name) in ``skip``) an
    Int8Linear; ``smooth``: SmoothQuant factors (α 0.5, per-channel maxima of a random input's
    scale) on every projection."""
    enc = copy.deepcopy(enc)
    rng = np.random.default_rng(0)
    for i, layer in enumerate(enc.layers):
        for where, name in PROJ:
            if (i, where, name) in skip:
                continue
            o = getattr(layer, where)
            lin = getattr(o, name)
            s = (smooth_factors(rng.uniform(0.2, 4.0, lin.weight.shape[1]), lin.weight, 0.5)
                 if smooth else None)
            setattr(o, name, Int8Linear(lin, native=native, smooth=s))
    mx.eval(enc.parameters())
    return enc


@pytest.fixture(scope="module")
def models(mk):
    fp32 = {n: load_checkpoint(HF / n).encoder for n in ("modernbert", "modernbert_g2")}
    return {(n, kind): (e if kind == "fp32" else _w8a8(e, kind != "simulated", kind == "smooth"))
            for n, e in fp32.items() for kind in ("fp32", "native", "simulated", "smooth")}


@pytest.fixture
def runs(monkeypatch):
    """How many layer stacks ran through modernbert_fused_q (which runs the W8A8 op)."""
    seen = [0]
    stack = modernbert_fused_q._stack

    def spy(*a, **k):
        seen[0] += 1
        return stack(*a, **k)

    monkeypatch.setattr(modernbert_fused_q, "_stack", spy)
    return seen


def _op(mk, enc, i, x, mask, threads=1, q_scale=None, packed=()):
    """Layer i of the W8A8 ``enc`` through the op on x (B, L, D) -> (B, L, D) NumPy (``packed``:
    the projections' prepacked blobs, or none)."""
    layer = enc.layers[i]
    proj, smooth, norms, eps1, eps2, act = modernbert_fused_i8.i8layer_args(layer)
    B, L, D = x.shape
    half = -1 if layer.is_global else enc.args.local_attention // 2
    theta = enc.args.global_rope_theta if layer.is_global else enc.args.local_rope_theta
    hd = D // layer.attn.n_heads
    cos, sin = (t.reshape(L, hd) for t in modernbert_fast.rope_for_length(L, theta, hd)[:2])
    kb = None if mask.all() else mx.array(((1 - mask) * MASK_BIAS).astype(np.float32).ravel())
    y = mk.fused_mbert_int8layer(
        mx.array(x.reshape(B * L, D)), [L] * B, kb, cos, sin, proj, smooth, norms,
        heads=layer.attn.n_heads, q_scale=layer.attn.scale if q_scale is None else q_scale,
        eps1=eps1, eps2=eps2, act=act, half=half, threads=threads, packed=list(packed))
    return np.array(y).reshape(B, L, D)


def _plain_layer(enc, i, x, mask):
    """Layer i of ``enc`` on the plain MLX path (its Linears' own calls)."""
    return np.array(enc.layers[i](mx.array(x), enc.context(mx.array(mask)))[0])


def _close(got, want, real):
    """float32 round-off; a row whose norm round-off moved one of its codes across a rounding
    boundary differs by about one code step (and, through k and v, its sequence slightly)."""
    row_err = np.abs(got - want)[real].max(axis=1)
    assert (row_err <= 1e-5).mean() >= 0.9 and row_err.max() <= 0.02, row_err
    return row_err


@pytest.mark.parametrize("name", ["modernbert", "modernbert_g2"], ids=["no-bias", "biases"])
@pytest.mark.parametrize("kind", ["native", "smooth"])
@pytest.mark.parametrize("i", [0, 1], ids=["global0", "local"])
@pytest.mark.parametrize("B,L,pad", [(1, 1, False), (1, 13, False), (3, 70, True)])
@pytest.mark.parametrize("threads", [1, 2], ids=["one-part", "two-parts"])
def test_layer_equals_the_plain_w8a8_layer(mk, models, name, kind, i, B, L, pad, threads):
    """Against the plain path of the same layer (int8_linear calls) and the simulated layer
    (fake-quantized fp32, the same codes); L = 70 passes the 64 window of modernbert_g2's local
    layer; the W8A8 error itself (against the fp32 layer) is far larger than the differences."""
    enc = models[name, kind]
    rng = np.random.default_rng(B * 1000 + L + i)
    x = rng.standard_normal((B, L, 64)).astype(np.float32)
    mask = _mask(B, L, pad)
    real = mask.astype(bool)
    y = _op(mk, enc, i, x, mask, threads)
    err = _close(y, _plain_layer(enc, i, x, mask), real)
    if kind == "native":
        err = np.maximum(err, _close(y, _plain_layer(models[name, "simulated"], i, x, mask), real))
    fp32 = _plain_layer(models[name, "fp32"], i, x, mask)
    # the round-off rows (at least 90%, _close): a row with a code across a rounding boundary
    # differs by about one code step (2.5e-4 here on a Xeon with AMX against 4.3e-3 of W8A8)
    assert np.abs(fp32 - y)[real].max() > 20 * max(np.quantile(err, 0.9), 1e-6)
    assert np.abs(y[real]).std() > 0.5


def test_the_query_scale_matters(mk, models):
    """The comparisons here can fail: without the 1/sqrt(head_dim) query scale the rows move
    far beyond round-off."""
    enc = models["modernbert_g2", "native"]
    x = np.random.default_rng(5).standard_normal((3, 70, 64)).astype(np.float32)
    mask = _mask(3, 70, True)
    real = mask.astype(bool)
    unscaled = _op(mk, enc, 1, x, mask, q_scale=1.0)
    assert np.abs(unscaled - _plain_layer(enc, 1, x, mask))[real].max() > 0.05


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
@pytest.mark.parametrize("B,L,pad", [(1, 1, False), (1, 13, False), (3, 70, True)])
def test_encoder_equals_the_plain_w8a8_path(mk, models, runs, name, B, L, pad):
    """Whole forwards (6 layers, global and local): a code that rounds the other way in one
    layer reaches its sequence through the next layers' attention, a small share of W8A8's own
    error (measured: up to 2.3e-3 here; asserted: at most a quarter of W8A8's own error
    against the fp32 encoder)."""
    plain, fused, real = _plain_and_fused(models[name, "native"], B, L, pad)
    assert runs[0] >= 1  # the op ran (once, or once per stream)
    err = np.abs(fused - plain)[real].max()
    ref = _plain_and_fused(models[name, "fp32"], B, L, pad)[0]  # the same ids
    assert err <= 0.02 and err <= 0.25 * np.abs(ref - plain)[real].max(), err


def test_layers_it_must_leave_to_the_plain_path_and_the_names(mk, models, runs):
    enc = models["modernbert_g2", "native"]
    assert modernbert.compiled_paths(enc) == modernbert_fused_i8.NAME

    class Model:
        module = enc
    gemm = int8_linear.NAMES["prepacked" if mk.int8_prepack_bytes(64, 64) > 0 else "native"]
    assert sweep_timing.kernel(Model) == f"fused-mbert-int8layer-cpp, {gemm}"
    sim = models["modernbert_g2", "simulated"]  # not the compiled GEMM
    assert modernbert_fused_i8.i8layer_args(sim.layers[0]) is None
    assert modernbert.compiled_paths(sim) is None
    kept = _w8a8(models["modernbert", "fp32"], skip={(2, "mlp", "Wo")})  # one fp32 Linear
    assert modernbert_fused_i8.i8layer_args(kept.layers[2]) is None
    assert modernbert.compiled_paths(kept) is None
    plain, fused, real = _plain_and_fused(kept, 1, 13, False)
    assert runs[0] == 0 and np.abs(fused - plain).max() == 0.0


@pytest.mark.parametrize("L,forced,want", [(13, "", 1), (31, "", 1), (32, "", 2), (13, "2", 2)])
def test_b1_splits_w8a8_layers_in_two_parts_from_32_tokens(mk, models, monkeypatch, L, forced,
                                                           want):
    """B = 1: W8A8 layers run in one part below SPLIT_ROWS_B1 = 32 real tokens (fp32 layers
    split from 8), two from there; VARIANTS_FUSED_THREADS forces it."""
    monkeypatch.setenv("VARIANTS_STREAMS", "2")
    monkeypatch.setenv("VARIANTS_FUSED_THREADS", forced)
    monkeypatch.setitem(parallel._state, "streams", None)
    seen = []
    run = modernbert_fused_i8.run
    monkeypatch.setattr(modernbert_fused_i8, "run",
                        lambda *a: seen.append(a[-1]) or run(*a))
    enc = models["modernbert", "native"]
    ids = mx.array(np.arange(5, 5 + L, dtype=np.int32)[None])
    mx.eval(enc(ids, mx.ones((1, L), mx.int32)).last_hidden)
    monkeypatch.undo()
    parallel._state["streams"] = None
    assert seen == [want] * len(enc.layers)


def test_layer_arguments_are_kept_until_a_module_or_array_changes(mk, models):
    enc = _w8a8(models["modernbert_g2", "fp32"])
    layer = enc.layers[1]
    args = modernbert_fused_i8.i8layer_args(layer)
    assert args is not None and modernbert_fused_i8.i8layer_args(layer) is args  # kept
    wo = layer.attn.Wo
    wo._native = False  # the same module, now simulated: not the compiled GEMM
    assert modernbert_fused_i8.i8layer_args(layer) is None
    wo._native = True
    again = modernbert_fused_i8.i8layer_args(layer)
    assert again is not args and again[0][4] is wo["wq"]
    wo.bias = wo.bias + 1.0  # a replaced array: the op gets the new one
    assert modernbert_fused_i8.i8layer_args(layer)[0][7] is wo["bias"]
    layer.mlp.Wi = models["modernbert_g2", "fp32"].layers[1].mlp.Wi  # an fp32 Linear
    assert modernbert_fused_i8.i8layer_args(layer) is None


def test_bad_arguments_name_the_problem(mk, models):
    proj, smooth, norms, eps1, eps2, act = modernbert_fused_i8.i8layer_args(
        models["modernbert", "native"].layers[1])
    x, cos = mx.zeros((4, 64)), mx.zeros((4, 16))
    kw = dict(heads=4, q_scale=0.25, eps1=eps1, eps2=eps2)
    with pytest.raises(ValueError, match="lens must sum"):
        mk.fused_mbert_int8layer(x, [3], None, cos, cos, proj, smooth, norms, **kw)
    with pytest.raises(ValueError, match="weights int8"):
        mk.fused_mbert_int8layer(x, [4], None, cos, cos, proj[4:8] + proj[4:], smooth, norms,
                                 **kw)
    with pytest.raises(ValueError, match="1/s"):
        mk.fused_mbert_int8layer(x, [4], None, cos, cos, proj, [mx.ones((5,))] + smooth[1:],
                                 norms, **kw)
    with pytest.raises(ValueError, match="g2 required"):
        mk.fused_mbert_int8layer(x, [4], None, cos, cos, proj, smooth, [None] * 4, **kw)


@pytest.mark.parametrize("name", ["modernbert", "modernbert_g2"], ids=["no-bias", "biases"])
@pytest.mark.parametrize("i", [0, 1], ids=["global0", "local"])
def test_prepacked_blobs_give_the_same_floats(mk, models, name, i):
    """The op on its projections' prepacked blobs (oneDNN's matmul primitive) and without them
    (dnnl_gemm_u8s8s32): the same int32 sums, so the same outputs bit for bit."""
    from variants.runtime import int8_linear

    if not mk.has_prepack():
        pytest.skip("oneDNN's prepacked int8 matmul unavailable here")
    enc = models[name, "native"]
    layer = enc.layers[i]
    packed = [int8_linear.prepacked(m, m["wq"])
              for m in (layer.attn.Wqkv, layer.attn.Wo, layer.mlp.Wi, layer.mlp.Wo)]
    assert all(p is not None for p in packed)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3, 70, 64)).astype(np.float32)
    mask = np.ones((3, 70), np.int32)
    mask[1, 50:] = 0
    refused = mk.int8_prepack_refusals()
    fast = _op(mk, enc, i, x, mask, packed=packed)
    np.testing.assert_array_equal(fast, _op(mk, enc, i, x, mask))
    assert mk.int8_prepack_refusals() == refused and np.abs(fast).max() > 0.1

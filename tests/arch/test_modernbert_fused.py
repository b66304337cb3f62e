"""ModernBERT's pre-norm layer as one compiled op (variants/arch/modernbert_fused.py,
qkernel/fused_mbert_layer.cpp): one layer equal to an independent float64 NumPy layer (global and
local, a small window so the windowed blocks run, padded and not, B = 1 and 3, L from 1 to 200,
one part or two, OpenBLAS and the panel GEMM, AVX2 and portable loops); whole forwards equal to
the plain path and to the MLX fast path; the switch and the masked mode fall back; timing
records name the path. The two fixture checkpoints: window 128 with no bias anywhere (erf GELU),
window 64 with every bias (tanh GELU)."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from scipy.special import erf

from variants.arch import modernbert, modernbert_fast, modernbert_fused
from variants.sweep import timing as sweep_timing
from variants.checkpoints.load import load_checkpoint
from variants.arch.encoder import MASK_BIAS

HF = Path(__file__).parents[1] / "fixtures" / "hf"


@pytest.fixture(scope="module")
def mk(qk):
    assert hasattr(qk, "fused_mbert_layer")  # the kernel builds every source in SOURCES
    return qk


@pytest.fixture(scope="module")
def loaded():
    return {n: load_checkpoint(HF / n).encoder for n in ("modernbert", "modernbert_g2")}


@pytest.fixture
def runs(monkeypatch):
    """How many layer stacks ran through the compiled op."""
    seen = [0]
    stack = modernbert_fused._stack

    def spy(*a, **k):
        seen[0] += 1
        return stack(*a, **k)

    monkeypatch.setattr(modernbert_fused, "_stack", spy)
    return seen


def _mask(B, L, pad):
    mask = np.ones((B, L), np.int32)
    if pad:
        for b in range(B):  # every other row shorter, the last one down to a third
            n = L if b % 2 == 0 and b != B - 1 else max(1, L // 3 + b)
            mask[b, n:] = 0
    return mask


def _numpy_layer(layer, x, mask, half, cos, sin):
    """One ModernBERT layer in float64 from the module's own weights (not the derived ones):
    x (B, L, D); key padding from mask; window |q - k| <= half (half < 0: global); rotary with
    the float32 tables cos, sin (L, head_dim) (Warner et al. 2024; HF modeling_modernbert)."""
    f = {k: np.array(v, np.float64) for k, v in _flat(layer).items()}
    B, L, D = x.shape
    H = layer.attn.n_heads
    hd = D // H

    def ln(t, g, b, eps):
        c = t - t.mean(-1, keepdims=True)
        y = c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * g
        return y if b is None else y + b

    def lin(t, name):
        y = t @ f[name + ".weight"].T
        return y + f[name + ".bias"] if name + ".bias" in f else y

    x = x.astype(np.float64)
    h = x if "attn_norm.weight" not in f else ln(x, f["attn_norm.weight"], f.get("attn_norm.bias"),
                                                 layer.attn_norm.eps)
    q, k, v = lin(h, "attn.Wqkv").reshape(B, L, 3, H, hd).transpose(2, 0, 3, 1, 4)
    c, s = cos.astype(np.float64), sin.astype(np.float64)

    def rot(t):
        return t * c + np.concatenate([-t[..., hd // 2:], t[..., :hd // 2]], -1) * s
    scores = rot(q) @ rot(k).transpose(0, 1, 3, 2) / np.sqrt(hd)
    scores = scores + ((1 - mask) * MASK_BIAS)[:, None, None, :]
    if half >= 0:
        p = np.arange(L)
        scores = np.where(np.abs(p[:, None] - p[None, :]) <= half, scores, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    ctx = ((e / e.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(B, L, D)
    x = x + lin(ctx, "attn.Wo")
    h = ln(x, f["mlp_norm.weight"], f.get("mlp_norm.bias"), layer.mlp_norm.eps)
    a, g = np.split(lin(h, "mlp.Wi"), 2, -1)
    if layer.mlp.hidden_activation == "gelu":
        a = 0.5 * a * (1 + erf(a / np.sqrt(2)))
    else:  # gelu_pytorch_tanh
        a = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))
    return x + lin(a * g, "mlp.Wo")


def _flat(layer):
    from mlx.utils import tree_flatten

    return dict(tree_flatten(layer.parameters()))


def _op(mk, enc, i, x, mask, half=None, threads=1, key_bias=True, local_block=0):
    """Layer i of enc through the op on x (B, L, D); half None: the layer's own (global: -1)."""
    layer = enc.layers[i]
    w, eps1, eps2, act = modernbert_fused.layer_args(layer)
    B, L, D = x.shape
    if B * L <= 32 and modernbert_fused.panels(layer, w) is not None:
        w = (*w, *modernbert_fused.panels(layer, w))
    if half is None:
        half = -1 if layer.is_global else enc.args.local_attention // 2
    theta = enc.args.global_rope_theta if layer.is_global else enc.args.local_rope_theta
    hd = D // layer.attn.n_heads
    cos, sin = (t.reshape(L, hd) for t in modernbert_fast.rope_for_length(L, theta, hd)[:2])
    kb = mx.array(((1 - mask) * MASK_BIAS).astype(np.float32).reshape(-1)) \
        if key_bias and not mask.all() else None
    y = mk.fused_mbert_layer(mx.array(x.reshape(B * L, D)), [L] * B, kb, cos, sin, list(w),
                             heads=layer.attn.n_heads, eps1=eps1, eps2=eps2, act=act, half=half,
                             local_block=local_block, threads=threads)
    return np.array(y).reshape(B, L, D), np.array(cos), np.array(sin), half


# layer 0: global with the identity attn_norm; 1: local; half 3: many windowed blocks
LAYERS = [(0, None), (1, None), (1, 3), (2, 3)]


@pytest.mark.parametrize("name", ["modernbert", "modernbert_g2"], ids=["no-bias", "biases"])
@pytest.mark.parametrize("i,half", LAYERS, ids=["global0", "local", "local-w3", "local2-w3"])
@pytest.mark.parametrize("B,L,pad", [(1, 1, False), (1, 5, False), (1, 24, True),
                                     (3, 24, False), (3, 70, True), (1, 200, False),
                                     (3, 200, True)])
@pytest.mark.parametrize("threads", [1, 2], ids=["one-part", "two-parts"])
def test_layer_equals_float64_numpy(mk, loaded, name, i, half, B, L, pad, threads):
    """Real rows within 1e-5 of the float64 layer (padded query rows are not compared)."""
    enc = loaded[name]
    rng = np.random.default_rng(B * 1000 + L + i)
    x = rng.standard_normal((B, L, enc.args.hidden_size)).astype(np.float32)
    mask = _mask(B, L, pad)
    y, cos, sin, h = _op(mk, enc, i, x, mask, half, threads)
    want = _numpy_layer(enc.layers[i], x, mask, h, cos, sin)
    real = mask.astype(bool)
    assert np.abs(y[real] - want[real]).max() <= 1e-5
    assert np.abs(want[real]).std() > 0.5


@pytest.mark.parametrize("block", [1, 5, 16, 64])
@pytest.mark.parametrize("half", [3, 20])
def test_any_query_block_gives_the_exact_window(mk, loaded, block, half):
    """The windowed blocks' size changes which keys are multiplied, not the result."""
    enc = loaded["modernbert_g2"]
    x = np.random.default_rng(7).standard_normal((2, 90, 64)).astype(np.float32)
    mask = _mask(2, 90, True)
    y, cos, sin, h = _op(mk, enc, 1, x, mask, half, local_block=block)
    want = _numpy_layer(enc.layers[1], x, mask, h, cos, sin)
    real = mask.astype(bool)
    assert np.abs(y[real] - want[real]).max() <= 1e-5


def test_the_padding_bias_and_the_window_matter(mk, loaded):
    """The comparison above can fail: without the padding bias, or with the window wider than
    the layer's, real rows move far beyond round-off (checked once by hand: passing no key
    bias to softmax_row in fused_mbert_layer.cpp's attend() made 55 of this file's 132 tests
    fail, the padded cases of the NumPy and whole-forward comparisons)."""
    enc = loaded["modernbert"]
    x = np.random.default_rng(5).standard_normal((3, 70, 64)).astype(np.float32)
    mask = _mask(3, 70, True)
    y, cos, sin, h = _op(mk, enc, 1, x, mask, 3)
    real = mask.astype(bool)
    no_pad, *_ = _op(mk, enc, 1, x, mask, 3, key_bias=False)
    wider, *_ = _op(mk, enc, 1, x, mask, 4)
    assert np.abs(no_pad[real] - y[real]).max() > 1e-2
    assert np.abs(wider[real] - y[real]).max() > 1e-2


@pytest.mark.parametrize("B,L", [(1, 24), (3, 70)], ids=["panels", "openblas"])
def test_portable_loops_equal_the_avx2_ones(mk, loaded, B, L):
    enc = loaded["modernbert"]
    x = np.random.default_rng(2).standard_normal((B, L, 64)).astype(np.float32)
    mask = _mask(B, L, True)
    before = mk.fused_allow_avx2(False)
    try:
        slow, *_ = _op(mk, enc, 1, x, mask, 3, threads=2)
    finally:
        mk.fused_allow_avx2(before)
    fast, *_ = _op(mk, enc, 1, x, mask, 3, threads=2)
    assert np.abs(slow - fast).max() < 1e-5 and np.abs(slow).max() > 0.5


def _plain_fast_fused(enc, ids, mask, monkeypatch):
    enc.fast = False
    try:
        plain = np.array(enc(ids, mask).last_hidden)
    finally:
        enc.fast = True
    fused = np.array(enc(ids, mask).last_hidden)
    with monkeypatch.context() as m:
        m.setenv(modernbert_fused.fused_layer.ENV_SWITCH, "off")
        mlx_fast = np.array(enc(ids, mask).last_hidden)
    return plain, mlx_fast, fused


@pytest.mark.parametrize("name", ["modernbert", "modernbert_g2"], ids=["no-bias", "biases"])
@pytest.mark.parametrize("B,L,pad", [(1, 1, False), (1, 5, False), (1, 24, True),
                                     (3, 24, False), (3, 70, True), (1, 200, False),
                                     (3, 200, True)])
def test_encoder_equals_the_plain_and_mlx_fast_paths(mk, loaded, runs, monkeypatch, name, B, L,
                                                     pad):
    enc = loaded[name]
    mask = _mask(B, L, pad)
    ids = mx.array(np.random.default_rng(L + B).integers(5, 2900, (B, L)).astype(np.int32))
    plain, mlx_fast, fused = _plain_fast_fused(enc, ids, mx.array(mask), monkeypatch)
    assert runs[0] >= 1  # the op ran (once, or once per stream)
    real = mask.astype(bool)
    assert np.abs(fused[real] - plain[real]).max() <= 1e-5
    assert np.abs(fused[real] - mlx_fast[real]).max() <= 1e-5
    assert np.abs(plain[real]).std() > 0.1


def test_batch_split_by_streams_and_by_parts_agree(mk, loaded, runs, monkeypatch):
    enc = loaded["modernbert"]
    mask = mx.array(_mask(4, 140, True))
    ids = mx.array(np.random.default_rng(3).integers(5, 2900, (4, 140)).astype(np.int32))
    monkeypatch.setattr(modernbert_fused, "SPLIT_BATCH_ROWS", 1)
    streams = np.array(enc(ids, mask).last_hidden)
    monkeypatch.setattr(modernbert_fused, "SPLIT_BATCH_ROWS", 10 ** 9)
    parts = np.array(enc(ids, mask).last_hidden)
    assert runs[0] >= 3 and np.abs(streams - parts).max() <= 1e-5


def test_switch_off_and_masked_mode_fall_back(mk, loaded, runs, monkeypatch):
    enc = loaded["modernbert_g2"]
    ids, mask = mx.array([[5, 6, 7, 8, 9]]), mx.ones((1, 5), mx.int32)
    assert modernbert.compiled_paths(enc) == modernbert_fused.NAME

    class Model:
        module = enc
    assert modernbert_fused.NAME in sweep_timing.kernel(Model)
    monkeypatch.setenv("VARIANTS_FUSED_LAYER", "off")
    enc(ids, mask)
    assert runs[0] == 0 and modernbert.compiled_paths(enc) is None
    assert sweep_timing.kernel(Model) == "fp32 gemm"
    monkeypatch.delenv("VARIANTS_FUSED_LAYER")
    enc.local_attention_impl = "masked"
    try:
        enc(ids, mask)
        assert modernbert.compiled_paths(enc) is None
    finally:
        enc.local_attention_impl = None
    assert runs[0] == 0
    enc(ids, mask)
    assert runs[0] == 1


def test_bad_arguments_name_the_problem(mk, loaded):
    enc = loaded["modernbert"]
    w, eps1, eps2, act = modernbert_fused.layer_args(enc.layers[1])
    cos = sin = mx.zeros((4, 16))
    x = mx.zeros((4, 64))
    with pytest.raises(ValueError, match="lens must sum"):
        mk.fused_mbert_layer(x, [3], None, cos, sin, list(w), heads=4, eps1=eps1, eps2=eps2)
    with pytest.raises(ValueError, match="cos, sin"):
        mk.fused_mbert_layer(x, [4], None, cos[:3], sin, list(w), heads=4, eps1=eps1, eps2=eps2)
    with pytest.raises(ValueError, match="w_qkv_t"):
        mk.fused_mbert_layer(x, [4], None, cos, sin, [w[2]] + list(w[1:]), heads=4, eps1=eps1,
                             eps2=eps2)

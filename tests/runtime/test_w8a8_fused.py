"""The compiled W8A8 BERT layer (variants.runtime.fused_layer.i8weights, qkernel/fused_int8_layer.cpp)
on MiniLM's real layers: its q|k|v bit-identical to the Int8Linear calls it replaces (the same
per-token codes for the same input: one quantization and one stacked GEMM for the three, or
three with differing SmoothQuant factors), equal to simulated W8A8 to float32 round-off, the
whole layer and whole encoder equal to the MLX path of the same W8A8 layers (padded, packed,
one and two parts), the layers it leaves to the MLX path, the timing name and bad arguments."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from test_fused_layer import calls  # noqa: F401  (fixture)

from variants.runtime import fused_layer, int8_linear
from variants.sweep import timing as sweep_timing
from variants.families.w8a8 import build as w8a8
from variants.families.w8a8.family import W8A8Config
from variants.arch.encoder import attention_bias, compiled_paths
from variants.models import sentiment

TEXTS = ["The soup was cold and the waiter never came back.", "Best pasta in years!",
         "Fine.", "I would not go back, although the dessert was lovely and the staff kind."]


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)


def _gemm(qk):
    """The GEMM's kernel name: the prepacked matmul where this CPU's oneDNN has it, else its GEMM."""
    return int8_linear.NAMES["prepacked" if qk.int8_prepack_bytes(384, 384) > 0 else "native"]


@pytest.fixture(scope="module")
def variant(qk, model):
    if not qk.has_dnnl():
        pytest.skip("W8A8 integer GEMM unavailable here (apt-get install libdnnl-dev)")
    v, info = w8a8.build(model, W8A8Config(), mode="native")
    assert info["kernel"] == _gemm(qk)
    return v


@pytest.fixture(scope="module")
def hidden(model):
    """Real inputs of layer 2: the fp32 reference's hidden states of TEXTS (B, L, 384), and
    the attention mask (B, L) int32."""
    enc, _ = model.tokenizer.encode(TEXTS)
    ids, mask = (mx.array(a) for a in model.tokenizer.batch(enc)[:2])
    out = model.module.encoder(ids, mask, output_hidden_states=True)
    return np.array(out.hidden_states[2]), np.array(mask)


def _mlx_path(monkeypatch, fn):
    monkeypatch.setenv(fused_layer.ENV_SWITCH, "off")
    try:
        return fn()
    finally:
        monkeypatch.setenv(fused_layer.ENV_SWITCH, "on")


def _smoothed(layer, x, shared):
    """A copy of ``layer`` with SmoothQuant factors (α 0.5 on ``x``'s channel maxima): the
    same for q, k, v (``shared``, from their stacked weights) or each from its own weight."""
    import copy

    layer = copy.deepcopy(layer)
    ref = copy.deepcopy(layer)
    absmax = np.abs(x).reshape(-1, x.shape[-1]).max(0)
    att = layer.attention
    fp32 = {n: nn.Linear(*getattr(att, n)["wq"].shape[::-1]) for n in ("query", "key", "value")}
    for n, lin in fp32.items():  # the dequantized int8 weights stand in for the fp32 ones
        q = getattr(ref.attention, n)
        lin.weight = q["wq"].astype(mx.float32) * q["w_scale"][:, None]
        lin.bias = q["bias"]
    stacked = np.concatenate([np.array(lin.weight) for lin in fp32.values()])
    for n, lin in fp32.items():
        s = w8a8.smooth_factors(absmax, stacked if shared else np.array(lin.weight), 0.5)
        setattr(att, n, w8a8.Int8Linear(lin, native=True, smooth=s))
    mx.eval(layer.parameters())
    return layer


def _qkv(qk, layer, x, threads):
    proj, smooth, shared, norms, packed = fused_layer.i8weights(layer)
    n = x.shape[0] * x.shape[1]
    return proj, shared, np.array(qk.fused_bert_int8layer(
        mx.array(x.reshape(n, -1)), [n], None, proj, smooth, shared, norms, heads=12,
        q_scale=float(layer.attention.scale), eps1=1e-12, eps2=1e-12, threads=threads,
        qkv_only=True, packed=packed))


@pytest.mark.parametrize("smoothing,threads", [("plain", 1), ("plain", 2), ("shared", 1),
                                               ("per-projection", 1), ("per-projection", 2)])
def test_qkv_is_bit_identical_to_the_int8_linears(qk, variant, hidden, smoothing, threads):
    """One part: one GEMM over the stacked weight (or three); two parts: each part's heads'
    columns of q, k and v."""
    x = hidden[0][:1]  # one real sequence
    layer = variant.module.encoder.layers[2]
    if smoothing != "plain":
        layer = _smoothed(layer, x, smoothing == "shared")
    proj, shared, got = _qkv(qk, layer, x, threads)
    assert shared == (smoothing != "per-projection")
    assert proj[0].shape == (3 * 384, 384) and proj[0].dtype == mx.int8  # stacked once
    att, xm = layer.attention, mx.array(x)
    want = np.array(mx.concatenate([att.query(xm) * att.scale, att.key(xm), att.value(xm)],
                                   axis=-1))[0]
    # the same codes, integer products and epilogue: the same float32 values, bit for bit
    np.testing.assert_array_equal(got, want)
    sim = np.array(mx.concatenate([att.query.simulated(xm) * att.scale, att.key.simulated(xm),
                                   att.value.simulated(xm)], axis=-1))[0]
    assert np.abs(got - sim).max() <= 2e-6 * np.abs(sim).max()
    assert np.abs(got).max() > 1.0  # real projections, not zeros


@pytest.mark.parametrize("threads", [1, 2], ids=["one-part", "two-parts"])
@pytest.mark.parametrize("rows", ["B1", "padded", "one-token"])
def test_layer_equals_the_mlx_path(qk, monkeypatch, variant, model, hidden, rows, threads):
    x, mask = hidden
    x = {"B1": x[:1], "padded": x, "one-token": x[2:3, :1]}[rows]
    mask = {"B1": mask[:1], "padded": mask, "one-token": mask[2:3, :1]}[rows]
    assert rows != "padded" or not mask.all()
    bias = None if mask.all() else attention_bias(mx.array(mask))
    layer = variant.module.encoder.layers[2]
    y = fused_layer.forward(layer, mx.array(x), bias, threads=threads)
    assert y is not None
    want = _mlx_path(monkeypatch, lambda: layer(mx.array(x), bias)[0])
    real = mask.astype(bool)
    y, want = np.array(y)[real], np.array(want)[real]
    row_err = np.abs(y - want).max(axis=1)
    # float32 round-off; a row whose LayerNorm / GELU round-off moved one of its codes across a
    # rounding boundary differs by one code step (rows are independent after the attention)
    assert (row_err <= 1e-5).mean() >= 0.9 and row_err.max() <= 0.02, row_err
    # the W8A8 error itself is far larger: the fp32 reference layer's outputs differ more
    fp32 = np.array(model.module.encoder.layers[2](mx.array(x), bias)[0])[real]
    assert np.abs(fp32 - y).max() > 20 * max(row_err.max(), 1e-6)


def test_smoothed_layer_equals_the_mlx_path(qk, monkeypatch, variant, hidden):
    x = hidden[0][:1]
    layer = _smoothed(variant.module.encoder.layers[2], x, shared=False)
    y = np.array(fused_layer.forward(layer, mx.array(x), None))
    want = np.array(_mlx_path(monkeypatch, lambda: layer(mx.array(x), None)[0]))
    assert np.abs(y - want).max() <= 1e-5


def test_encoder_equals_the_mlx_path(qk, monkeypatch, variant, model, calls):  # noqa: F811
    """Whole forwards (one stream, split by sequences, packed: as the batch decides), and each
    layer of the compiled forward against the MLX path of that layer on the same input."""
    enc, _ = model.tokenizer.encode(TEXTS * 3)
    ids, mask = (mx.array(a) for a in model.tokenizer.batch(enc)[:2])
    module = variant.module.encoder
    out = module(ids, mask, output_hidden_states=True)
    assert calls["padded"] + calls["packed"] >= 6
    real = np.array(mask).astype(bool)
    bias = attention_bias(mask)
    for i, layer in enumerate(module.layers):
        want = _mlx_path(monkeypatch, lambda: layer(out.hidden_states[i], bias)[0])
        row_err = np.abs(np.array(out.hidden_states[i + 1]) - np.array(want))[real].max(axis=1)
        assert (row_err <= 1e-5).mean() >= 0.9 and row_err.max() <= 0.02, (i, row_err)
    fast = module(ids, mask).last_hidden
    slow = _mlx_path(monkeypatch, lambda: module(ids, mask).last_hidden)
    ref = model.module.encoder(ids, mask).last_hidden
    fast, slow, ref = (np.array(a)[real] for a in (fast, slow, ref))
    # a code that rounds the other way in one layer reaches the whole sequence through the next
    # layers' attention: a share of W8A8's own error (measured on a Xeon, the same on AVX2,
    # AVX-512 without VNNI, VNNI and AMX, whose integer sums are exact: max 0.048 against
    # 0.246, 0.19 of it, with the layers' AVX2+FMA loops; 0.101, 0.41 of it, with the baseline
    # loops of VARIANTS_KERNEL_ISA=baseline, whose round-off moves more codes). Each layer
    # alone equals the MLX path to round-off and code steps (above); the sweep judges W8A8 on
    # this compiled forward, the model that runs (variants.families.family.judged_mode)
    assert np.abs(fast - slow).max() <= 0.5 * np.abs(slow - ref).max()
    assert np.median(np.abs(fast - slow).max(axis=1)) <= 1e-5  # most rows: round-off


def test_layers_it_leaves_to_the_mlx_path_and_the_names(qk, model, variant):
    assert compiled_paths(variant.module) == fused_layer.I8NAME
    assert fused_layer.path_name(variant.module.encoder.layers) == fused_layer.I8NAME
    assert sweep_timing.kernel(variant) == f"fused-int8layer-cpp, {_gemm(qk)}"
    sim, _ = w8a8.build(model, W8A8Config(), mode="simulated")  # not the compiled GEMM
    assert fused_layer.i8weights(sim.module.encoder.layers[0]) is None
    assert compiled_paths(sim.module) is None
    kept, _ = w8a8.build(model, W8A8Config(skip="layers\\.0\\.output$"), mode="native")
    layers = kept.module.encoder.layers
    assert fused_layer.i8weights(layers[0]) is None  # one fp32 Linear in the layer
    assert fused_layer.forward(layers[0], mx.zeros((1, 3, 384)), None) is None
    assert fused_layer.i8weights(layers[1]) is not None
    assert compiled_paths(kept.module) == fused_layer.I8NAME  # layers 1-5 still compiled
    assert fused_layer.path_name(layers) is None


def test_bad_arguments_raise_before_running(qk, variant):
    layer = variant.module.encoder.layers[0]
    proj, smooth, shared, norms, packed = fused_layer.i8weights(layer)
    x = mx.zeros((3, 384))
    kw = dict(heads=12, q_scale=0.125, eps1=1e-12, eps2=1e-12)
    with pytest.raises(ValueError, match="lens"):
        qk.fused_bert_int8layer(x, [2], None, proj, smooth, shared, norms, **kw)
    with pytest.raises(ValueError, match="weights int8"):
        qk.fused_bert_int8layer(x, [3], None, proj[4:8] + proj[4:], smooth, shared, norms, **kw)
    with pytest.raises(ValueError, match="inv_smooth"):
        qk.fused_bert_int8layer(x, [3], None, proj, [mx.ones((5,))] + smooth[1:], shared, norms,
                                **kw)
    with pytest.raises(ValueError, match="6 entries"):
        qk.fused_bert_int8layer(x, [3], None, proj, smooth[:5], shared, norms, **kw)
    with pytest.raises(ValueError, match="packed"):
        qk.fused_bert_int8layer(x, [3], None, proj, smooth, shared, norms, packed=packed[:3], **kw)
    with pytest.raises(ValueError, match="packed entry"):
        qk.fused_bert_int8layer(x, [3], None, proj, smooth, shared, norms,
                                packed=packed[1:2] * 4, **kw)


@pytest.mark.parametrize("rows", ["B1", "padded"])
def test_prepacked_layer_is_bit_identical_to_the_plain_gemm(qk, variant, hidden, rows):
    """The layer on its weights' blobs (oneDNN's matmul primitive) and without them
    (dnnl_gemm_u8s8s32): the same int32 sums, so the same float32 outputs bit for bit; a
    second call at another row count reuses the blobs."""
    x, mask = hidden
    layer = variant.module.encoder.layers[2]
    proj, smooth, shared, norms, packed = fused_layer.i8weights(layer)
    assert all(p is not None and p.dtype == mx.uint8 for p in packed)
    assert fused_layer.i8weights(layer)[4][0] is packed[0]  # the stacked blob made once
    refused = qk.int8_prepack_refusals()
    for n in ({"B1": [1], "padded": [4]}[rows] + [1, 3]):
        xs, lens = x[:n], [x.shape[1]] * n
        rows_x = mx.array(xs.reshape(-1, 384))
        kw = dict(heads=12, q_scale=float(layer.attention.scale), eps1=1e-12, eps2=1e-12)
        fast = np.array(qk.fused_bert_int8layer(rows_x, lens, None, proj, smooth, shared, norms,
                                                packed=packed, **kw))
        plain = np.array(qk.fused_bert_int8layer(rows_x, lens, None, proj, smooth, shared,
                                                 norms, **kw))
        np.testing.assert_array_equal(fast, plain)
        assert np.abs(fast).max() > 1.0
    assert qk.int8_prepack_refusals() == refused


def test_weights_memo_follows_the_modules_arrays(qk, variant):
    """i8weights answers from its memo while nothing changed, and anew when an array or a
    module's native flag is replaced."""
    import copy

    layer = copy.deepcopy(variant.module.encoder.layers[1])
    first = fused_layer.i8weights(layer)
    assert fused_layer.i8weights(layer) is first
    layer.intermediate.bias = layer.intermediate["bias"] + 1.0
    second = fused_layer.i8weights(layer)
    assert second is not first and second[0][11] is layer.intermediate["bias"]
    assert second[4][0] is first[4][0]  # q|k|v unchanged: its stacked blob is kept
    layer.intermediate._native = False  # now simulated: the layer leaves the compiled op
    assert fused_layer.i8weights(layer) is None

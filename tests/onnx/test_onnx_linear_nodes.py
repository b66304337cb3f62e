"""ONNX nodes of the encoder Linears (variants/onnx/linear_nodes.py, dequant_nodes.py), run by
ONNX Runtime: stored codes read back bit for bit as formats.dequantize for every width, scale
dtype and mode; MatMulNBits only where it is exact (2 and 4 bits) and within float32 round-off
of MLX's quantized Linear; the W8A8 per-row codes equal int8_linear.quantize_rows exactly (a
hand-computed row and real MiniLM activations) and the W8A8 output matches the simulated
Int8Linear; kinds without an ONNX form are refused by name."""

import pytest

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.onnxgraphs

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

from variants.arch.input_scaled import InputScaledLinear  # noqa: E402
from variants.arch.lowrank import LowRankLinear  # noqa: E402
from variants.layer_maps import formats as F  # noqa: E402
from variants.onnx import dequant_nodes  # noqa: E402
from variants.onnx.builder import FLOAT, UINT8  # noqa: E402
from variants.onnx.linear_nodes import Graph, linear, quantize_rows  # noqa: E402
from variants.runtime import qlinear  # noqa: E402
from variants.runtime.int8_linear import Int8Linear, quantize_rows as mlx_quantize_rows  # noqa: E402


def _session(g):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(g.model().SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _linear_graph(module, k, n, **kw):
    g = Graph()
    x = g.input("x", FLOAT, ["rows", k])
    g.output(linear(g, x, module, "lin", **kw), "y", FLOAT, ["rows", n])
    return g


@pytest.fixture(scope="module")
def acts(checkpoint):
    """Real MiniLM activations: (the embeddings' output (T, 384), layer 2's FFN input after the
    GELU (T, 1536)), T real tokens of three sentences."""
    tok = checkpoint.tokenizer
    ids, mask, types = (mx.array(a) for a in tok.batch(tok.encode(
        ["The soup was cold.", "Best pasta I have had in years, truly!", "ok"])[0]))
    enc = checkpoint.encoder
    out = enc(ids, mask, types, output_hidden_states=True)
    real = np.array(mask).astype(bool)
    layer = enc.layers[2]
    ffn_in = layer.activation(layer.intermediate(out.hidden_states[2]))
    return np.array(out.hidden_states[0])[real], np.array(ffn_in)[real]


@pytest.mark.parametrize("fmt", [F.Format(b, gs, "affine", sd) for b in (1, 2, 3, 4, 5, 6, 8)
                                 for gs, sd in ((32, "float16"), (64, "float32"),
                                                (128, "bfloat16"))]
                         + [F.Format(*F.MX_SHAPE[m], m) for m in ("mxfp4", "mxfp8", "nvfp4")],
                         ids=str)
def test_stored_codes_read_back_bit_for_bit(fmt):
    rng = np.random.default_rng(fmt.bits * 1000 + fmt.group_size)
    # rows of very different magnitudes: small scales, large ones, the modes' subnormal scales
    w = rng.standard_normal((24, 256)) * rng.choice([1e-4, 0.05, 3.0], (24, 1))
    q, s, b = F.quantize(mx.array(w.astype(np.float32)), fmt)
    want = np.array(F.dequantize(q, s, b, fmt))
    g = Graph()
    g.output(dequant_nodes.stored_weight(g, q, s, b, fmt, "w"), "w", FLOAT, [24, 256])
    got = _session(g).run(None, {})[0]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("bits, gs, sd", [(2, 64, "float32"), (4, 64, "float16"),
                                          (4, 32, "bfloat16"), (3, 64, "float32"),
                                          (6, 64, "float16"), (8, 128, "float32")])
def test_quantized_linear_matches_mlx(acts, bits, gs, sd):
    x = acts[0]
    base = nn.Linear(384, 96)
    mx.eval(base.parameters())
    q = nn.QuantizedLinear.from_linear(base, group_size=gs, bits=bits)
    if sd != "float32":
        q.scales, q.biases = q.scales.astype(getattr(mx, sd)), q.biases.astype(getattr(mx, sd))
    q.__class__ = qlinear.CpuQuantizedLinear
    g = _linear_graph(q, 384, 96)
    ops = {n.op_type for n in g.nodes}
    # MatMulNBits (float zero points -bias/scale) exactly where ONNX Runtime runs it exactly
    assert ("MatMulNBits" in ops) == (bits in (2, 4))
    got = _session(g).run(None, {"x": x})[0]
    want = np.array(q(mx.array(x)))
    assert np.abs(want).max() > 0.5
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6 * np.abs(want).max())


def test_nbits_zero_points_give_mlx_weights():
    # (q - (-b/s)) * s against s * q + b, float32: at most a few ulps of the weight
    w = mx.random.normal((64, 256), key=mx.random.key(1)) * 0.05
    for bits in (2, 4):
        q, s, b = mx.quantize(w, group_size=64, bits=bits)
        codes = np.array(mx.dequantize(q, mx.ones_like(s), mx.zeros_like(b), group_size=64,
                                       bits=bits)).reshape(64, 4, 64)
        s32, b32 = np.array(s)[..., None], np.array(b)[..., None]
        ort_w = (codes - (-b32 / s32)) * s32
        mlx_w = np.array(mx.dequantize(q, s, b, group_size=64, bits=bits)).reshape(64, 4, 64)
        ulp = np.spacing(np.abs(mlx_w).max())
        assert np.abs(ort_w - mlx_w).max() <= 4 * ulp


def test_activation_codes_hand_computed():
    # test_w8a8's row: [-1, 0, 0.4, 2] -> scale 3/255, zero point 85, codes [0, 85, 119, 255];
    # zeros -> scale 1, codes 0; [0.4, 1, 0, 1] -> lo 0, codes [102, 255, 0, 255]
    x = np.array([[-1.0, 0.0, 0.4, 2.0], [0, 0, 0, 0], [0.4, 1.0, 0.0, 1.0]], np.float32)
    g = Graph()
    xi = g.input("x", FLOAT, ["rows", 4])
    q, scale, zp = quantize_rows(g, xi, "act")
    g.output(q, "q", UINT8, ["rows", 4])
    g.output(scale, "scale", FLOAT, ["rows", 1])
    g.output(zp, "zp", FLOAT, ["rows", 1])
    got_q, got_s, got_zp = _session(g).run(None, {"x": x})
    np.testing.assert_array_equal(got_q, [[0, 85, 119, 255], [0, 0, 0, 0], [102, 255, 0, 255]])
    np.testing.assert_allclose(got_s[:, 0], [3 / 255, 1.0, 1 / 255], rtol=1e-7)
    np.testing.assert_array_equal(got_zp[:, 0], [85, 0, 0])


@pytest.mark.parametrize("which", [0, 1], ids=["embeddings-384", "ffn-1536"])
def test_activation_codes_equal_mlx_on_real_rows(acts, which):
    x = acts[which]
    g = Graph()
    xi = g.input("x", FLOAT, ["rows", x.shape[1]])
    q, scale, zp = quantize_rows(g, xi, "act")
    g.output(q, "q", UINT8, ["rows", x.shape[1]])
    g.output(scale, "scale", FLOAT, ["rows", 1])
    g.output(zp, "zp", FLOAT, ["rows", 1])
    got = _session(g).run(None, {"x": x})
    want = [np.array(a) for a in mlx_quantize_rows(mx.array(x))]
    np.testing.assert_array_equal(got[0], want[0].astype(np.uint8))  # every code, exactly
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    assert len(np.unique(got[0])) > 200  # the codes use the range, not a few values


@pytest.mark.parametrize("smooth", [False, True], ids=["plain", "smoothquant"])
def test_w8a8_linear_matches_simulated(checkpoint, acts, smooth):
    x = acts[1]
    lin = checkpoint.encoder.layers[2].output  # (384, 1536), a real weight
    s = None
    if smooth:  # SmoothQuant's factors at α = 0.5 from these rows (Xiao et al. 2023, eq. 4)
        s = np.sqrt(np.abs(x).max(0) / np.abs(np.array(lin.weight)).max(0)).astype(np.float32)
    m = Int8Linear(lin, smooth=s)
    want = np.array(m.simulated(mx.array(x)))
    for scheme in ("u8u8", "u8s8"):
        g = _linear_graph(m, 1536, 384, int8=scheme)
        assert "MatMulInteger" in {n.op_type for n in g.nodes}
        if scheme == "u8s8" and not _has_vnni():
            continue  # u8 x s8 saturates 16-bit pair sums on AVX2 without VNNI
        got = _session(g).run(None, {"x": x})[0]
        # same codes, integer sums exact: only the float32 order of the scaling differs
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


def _has_vnni():
    try:
        return "vnni" in open("/proc/cpuinfo").read()
    except OSError:
        return False


def test_lowrank_and_input_scaled(acts):
    x = acts[0]
    rng = np.random.default_rng(0)
    lr = LowRankLinear(rng.standard_normal((48, 16)).astype(np.float32) * 0.1,
                       rng.standard_normal((16, 384)).astype(np.float32) * 0.1,
                       np.ones(48, np.float32))
    inner = nn.Linear(384, 48)
    mx.eval(inner.parameters())
    scaled = InputScaledLinear(inner, rng.uniform(0.5, 2, 384).astype(np.float32))
    for m in (lr, scaled):
        got = _session(_linear_graph(m, 384, 48)).run(None, {"x": x})[0]
        want = np.array(m(mx.array(x)))
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_kinds_without_an_onnx_form_are_refused():
    g = Graph()
    x = g.input("x", FLOAT, ["rows", 4])
    with pytest.raises(ValueError, match="encoder.layers.0.odd: a Embedding has no ONNX form"):
        linear(g, x, nn.Embedding(3, 4), "encoder.layers.0.odd")
    with pytest.raises(ValueError, match="int8 scheme 's8s8' is not known"):
        linear(g, x, Int8Linear(nn.Linear(4, 2)), "lin", int8="s8s8")

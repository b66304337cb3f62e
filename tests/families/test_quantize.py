"""Group-wise affine quantization builder: native == simulated, MLX's quantizer, sizes, errors."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from variants.runtime import qlinear
from variants.families.quant.build import BITS, QuantConfig, quantize_module
from variants.models import sentiment
from variants.runtime.qlinear import CpuQuantizedLinear

TEXTS = ["Honestly the best pasta I have had in years.",
         "The service was slow and the soup was cold.",
         "It is a restaurant."]
LAYER = "encoder.layers.0.intermediate"  # a real (1536, 384) weight matrix
N_LINEAR = 6 * 6  # MiniLM: 6 layers x (query, key, value, out, intermediate, output)


def _module_at(module, path):
    return dict(module.named_modules())[path]


def _dequantized(w, bits, group_size):
    """``((q, scales, biases), w_hat)``: what ``mx.quantize`` stores, and its dequantization."""
    q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    return (q, s, b), mx.dequantize(q, s, b, group_size=group_size, bits=bits)


class Tiny(nn.Module):
    """64 -> 48 -> 16: the second Linear's input (48) is not a multiple of 32."""

    def __init__(self, odd_only=False):
        super().__init__()
        self.odd = nn.Linear(48, 16)
        if not odd_only:
            self.proj = nn.Linear(64, 48)

    def __call__(self, x):
        return self.odd(self.proj(x))


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)


@pytest.fixture(scope="module")
def batch(checkpoint):
    encs, _ = checkpoint.tokenizer.encode(TEXTS)
    return tuple(mx.array(a) for a in checkpoint.tokenizer.batch(encs))


# ---- native (QuantizedLinear) and simulated (dequantized dense) compute the same function ----

@pytest.mark.parametrize("cfg", [QuantConfig(bits=b, group_size=64) for b in BITS]
                         + [QuantConfig(bits=4, group_size=32), QuantConfig(bits=4, group_size=128),
                            QuantConfig(bits=4, quantize_head=True, quantize_embeddings=True)],
                         ids=lambda c: c.name)
def test_native_and_simulated_agree_to_round_off(model, batch, cfg):
    native, info_n = quantize_module(model.module, cfg, mode="native")
    sim, info_s = quantize_module(model.module, cfg, mode="simulated")
    assert info_n["mode"] == "native" and info_s["mode"] == "simulated"
    assert {k: v for k, v in info_n.items() if k != "mode"} == \
           {k: v for k, v in info_s.items() if k != "mode"}
    assert isinstance(_module_at(native, LAYER), nn.QuantizedLinear)
    # the default CPU kernel: the compiled one where it is built (variants.runtime.qkernel)
    assert qlinear.kernels(native) == [qlinear.NAMES[qlinear.resolve("cpp")]]
    assert type(_module_at(sim, LAYER)) is nn.Linear
    emb_n, emb_s = np.array(native.embed(*batch)), np.array(sim.embed(*batch))
    np.testing.assert_allclose(emb_n, emb_s, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(native(*batch)), np.array(sim(*batch)),
                               rtol=1e-4, atol=1e-5)
    # and the variant is a real approximation, not the reference itself
    emb_ref = np.array(model.module.embed(*batch))
    assert np.abs(emb_s - emb_ref).max() > 1e-4


# ---- the stored weights are exactly MLX's quantizer's ----

@pytest.mark.parametrize("bits", BITS)
def test_layer_weights_are_mx_quantize_then_dequantize(model, bits):
    cfg = QuantConfig(bits=bits, group_size=64)
    w = _module_at(model.module, LAYER).weight
    (q, s, b), w_hat = _dequantized(w, bits, 64)
    qn = _module_at(quantize_module(model.module, cfg, mode="native")[0], LAYER)
    assert (qn.group_size, qn.bits) == (64, bits)
    for got, want in ((qn.weight, q), (qn.scales, s), (qn.biases, b)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.array(got), np.array(want))
    sim = _module_at(quantize_module(model.module, cfg, mode="simulated")[0], LAYER)
    assert sim.weight.dtype == mx.float32
    np.testing.assert_array_equal(np.array(sim.weight), np.array(w_hat))
    np.testing.assert_array_equal(np.array(sim.bias), np.array(_module_at(model.module, LAYER).bias))


def test_reconstruction_error_shrinks_as_bits_grow(model):
    w = _module_at(model.module, LAYER).weight
    errs = [float(mx.abs(w - _dequantized(w, bits, 64)[1]).max()) for bits in BITS]
    assert all(a > b for a, b in zip(errs, errs[1:])), dict(zip(BITS, errs))
    # each extra bit roughly halves the step: 8 bits is > 30x finer than 2 bits
    assert errs[0] / errs[-1] > 30


@pytest.mark.parametrize("group_size", (32, 64, 128))
@pytest.mark.parametrize("bits", BITS)
def test_reconstruction_error_bounded_per_group(model, bits, group_size):
    """Per-group RTN bounds for MLX's affine quantizer (mlx/ops.cpp ``affine_quantize``).

    MLX does not store s = (max - min) / n with bias = min (n = 2**bits - 1). It keeps the
    larger-magnitude extreme ``edge`` as the bias and makes 0 exactly representable:
    q0 = round(edge / s), stored scale s' = edge / q0, bias = edge, w_hat = s' q + edge with
    q in [0, n]. Hence:

    - a weight inside the grid's span [edge, edge + n s'] is rounded to the nearest step:
      |w - w_hat| <= |s'| / 2 (the textbook RTN bound);
    - the far extreme can fall outside the span (when |s'| < s) and is clipped. Writing
      edge / s = q0 + d with |d| <= 1/2 and |edge| >= n s / 2 gives |q0| >= 2**(bits-1) and
      overshoot n |s - s'| = n s |d| / |q0| <= (1 - 2**-bits) s, which is also <= |s'|.

    So scale/2 does *not* bound every weight here; the real-weight maxima reach ~0.99 |s'|.
    """
    w = np.array(_module_at(model.module, LAYER).weight, dtype=np.float64)
    (_, s, b), w_hat = _dequantized(mx.array(w.astype(np.float32)), bits, group_size)
    n = 2 ** bits - 1
    groups = w.reshape(w.shape[0], -1, group_size)
    err = np.abs(groups - np.array(w_hat, np.float64).reshape(groups.shape))
    s = np.array(s, np.float64)[..., None]
    b = np.array(b, np.float64)[..., None]
    far = b + n * s  # the grid's other end; the bias is the group's larger-magnitude extreme
    lo, hi = np.minimum(b, far), np.maximum(b, far)
    tol = 1e-6 * np.abs(w).max()  # fp32 round-off of s' q + b
    inside = (groups >= lo - tol) & (groups <= hi + tol)
    # only the far end clips: nothing lies beyond the bias, which is a weight of the group
    beyond_far = np.where(far > b, groups > far, groups < far)
    assert np.all(inside | beyond_far)
    assert np.all((b == groups.min(-1, keepdims=True)) | (b == groups.max(-1, keepdims=True)))
    half_step = np.broadcast_to(np.abs(s) / 2, groups.shape)
    assert np.all(err[inside] <= half_step[inside] + tol)
    nominal = (groups.max(-1, keepdims=True) - groups.min(-1, keepdims=True)) / n
    assert np.all(err <= (1 - 2.0 ** -bits) * nominal + tol)
    assert np.all(err <= np.abs(s) + tol)


# ---- sizes: bits per weight, bytes, which layers ----

@pytest.mark.parametrize("group_size", (32, 64, 128))
@pytest.mark.parametrize("bits", BITS)
def test_bits_per_weight_and_model_bytes(model, bits, group_size):
    cfg = QuantConfig(bits=bits, group_size=group_size)
    native, info = quantize_module(model.module, cfg, mode="native")
    # fp32 scales and biases: one of each (32 bits) per group of `group_size` weights
    assert info["bits_per_weight"] == pytest.approx(bits + 2 * 32 / group_size, rel=1e-12)
    assert info["model_bytes"] == sum(v.nbytes for _, v in tree_flatten(native.parameters()))
    # independently: fp32 dense bytes, less the quantized weights' fp32 bytes, plus packed ones
    dense = [v for _, v in tree_flatten(model.module.parameters())]
    q_params = sum(_module_at(model.module, p).weight.size for p, m in native.named_modules()
                   if isinstance(m, nn.QuantizedLinear))
    assert info["quantized_params"] == q_params
    assert info["total_params"] == sum(v.size for v in dense)
    expected = 4 * (info["total_params"] - q_params) + q_params * (bits + 64 / group_size) / 8
    assert info["model_bytes"] == expected
    assert info["model_bytes"] < sum(v.nbytes for v in dense)


def test_head_and_embeddings_skipped_by_default(model):
    native, info = quantize_module(model.module, QuantConfig(), mode="native")
    kinds = {p: type(m) for p, m in native.named_modules()}
    assert info["quantized_layers"] == N_LINEAR
    assert sum(k is CpuQuantizedLinear for k in kinds.values()) == N_LINEAR
    assert kinds["head"] is nn.Linear
    assert kinds["encoder.embeddings.word_embeddings"] is nn.Embedding
    assert not any(k is nn.QuantizedEmbedding for k in kinds.values())
    assert ("head", "decision head (outside the encoder) kept full precision") in info["skipped"]
    assert info["head"] == {"paths": ["head"], "why": "decision head (outside the encoder)",
                            "quantized": False}


def test_head_by_role_classifier_and_declared(checkpoint):
    """A module named otherwise is the head by role (a BERT classifier's pooler and classifier,
    a declared ``head_modules``), kept fp32 unless --quantize-head."""
    from variants.models.heads import DECLARED
    from variants.checkpoints.hf_heads import BertClassifier
    from variants.models.classifier import ClassifierNet

    dense = nn.Linear(384, 384)
    net = ClassifierNet(checkpoint.encoder, BertClassifier(dense, nn.Linear(384, 2)))
    q, info = quantize_module(net, QuantConfig(bits=8), mode="native")
    assert type(q.classifier.pooler) is nn.Linear and type(q.classifier.classifier) is nn.Linear
    assert {p for p, _ in info["skipped"]} >= {"classifier.pooler", "classifier.classifier"}
    q, _ = quantize_module(net, QuantConfig(bits=8, quantize_head=True), mode="native")
    assert isinstance(q.classifier.pooler, nn.QuantizedLinear)
    net.head_modules = ("encoder.layers.5.output",)  # a factory may declare its own head
    q, info = quantize_module(net, QuantConfig(bits=8), mode="native")
    assert type(q.encoder.layers[5].output) is nn.Linear
    assert isinstance(q.classifier.pooler, nn.QuantizedLinear)
    assert ("encoder.layers.5.output", DECLARED) in info["skipped"]


@pytest.mark.parametrize("flag, path, kind, extra", [
    ("quantize_head", "head", nn.QuantizedLinear, 1),
    ("quantize_embeddings", "encoder.embeddings.word_embeddings", nn.QuantizedEmbedding, 3),
])
def test_head_and_embeddings_quantized_on_request(model, flag, path, kind, extra):
    cfg = QuantConfig(**{flag: True})
    native, info = quantize_module(model.module, cfg, mode="native")
    assert isinstance(_module_at(native, path), kind)
    assert info["quantized_layers"] == N_LINEAR + extra
    assert cfg.name == "q4-g64" + ("-head" if flag == "quantize_head" else "-emb")
    if flag == "quantize_head":
        assert not any(p == "head" for p, _ in info["skipped"])
    # the simulated form quantizes the same layers: its weight is the dequantized one
    sim, _ = quantize_module(model.module, cfg, mode="simulated")
    w = _module_at(model.module, path).weight
    np.testing.assert_array_equal(np.array(_module_at(sim, path).weight),
                                  np.array(_dequantized(w, 4, 64)[1]))


# ---- tiny modules: indivisible input sizes, no mutation ----

@pytest.mark.parametrize("mode", ["native", "simulated"])
def test_indivisible_input_size_is_skipped_with_reason(mode):
    mx.random.seed(0)
    tiny = Tiny()
    mx.eval(tiny.parameters())
    before = {k: np.array(v) for k, v in tree_flatten(tiny.parameters())}
    q, info = quantize_module(tiny, QuantConfig(bits=4, group_size=32), mode=mode)
    assert info["skipped"] == [("odd", "input size 48 not divisible by group size 32")]
    # 48·16 weights of 64·48 + 48 + 48·16 + 16 = 3904 parameters
    assert info["skipped_weights"] == {"odd": 768} and info["indivisible_params"] == 768
    assert info["indivisible_param_share"] == pytest.approx(768 / 3904, rel=1e-12)
    assert info["quantized_layers"] == 1
    assert type(q.odd) is nn.Linear
    np.testing.assert_array_equal(np.array(q.odd.weight), before["odd.weight"])
    assert isinstance(q.proj, nn.QuantizedLinear if mode == "native" else nn.Linear)
    # the input module is untouched: same layer types, identical weights
    assert type(tiny.proj) is nn.Linear and type(tiny.odd) is nn.Linear
    after = {k: np.array(v) for k, v in tree_flatten(tiny.parameters())}
    assert after.keys() == before.keys()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    x = mx.random.normal((5, 64))
    np.testing.assert_allclose(np.array(q(x)), np.array(tiny(x)), atol=0.1)


def test_real_module_not_modified(model):
    before = {k: np.array(v) for k, v in tree_flatten(model.module.parameters())}
    quantize_module(model.module, QuantConfig(bits=2, quantize_head=True, quantize_embeddings=True),
                    mode="native")
    quantize_module(model.module, QuantConfig(bits=2), mode="simulated")
    assert all(type(m) in (nn.Linear, nn.Embedding) or not hasattr(m, "to_quantized")
               for _, m in model.module.named_modules())
    for k, v in tree_flatten(model.module.parameters()):
        np.testing.assert_array_equal(np.array(v), before[k])


def test_no_quantizable_layer_raises():
    with pytest.raises(ValueError, match="no layer can be quantized with group_size=32"):
        quantize_module(Tiny(odd_only=True), QuantConfig(bits=4, group_size=32))


# ---- bad input ----

@pytest.mark.parametrize("make, match", [
    (lambda: QuantConfig(bits=5), r"--bits 5 is not supported; choose one of \(2, 3, 4, 6, 8\)"),
    (lambda: QuantConfig(bits=16), r"--bits 16"),
    (lambda: QuantConfig(group_size=48), r"--group-size 48 is not supported; choose one of "
                                         r"\(32, 64, 128\)"),
    (lambda: quantize_module(Tiny(), QuantConfig(), mode="fast"),
     r"mode='fast' is not supported; choose one of \('native', 'simulated'\)"),
], ids=["bits=5", "bits=16", "group_size=48", "mode=fast"])
def test_bad_input_raises(make, match):
    with pytest.raises(ValueError, match=match):
        make()

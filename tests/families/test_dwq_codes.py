"""DWQ's learned rounding: the codes train through the rounding (straight-through), start
exactly at the start's codes, stay integers in the packed range, and the packed tensors of the
trained layer dequantize to the weight its forward used."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from variants.arch import activations
from variants.datasets import bundled as data
from variants.families.quant import affine_codes, dwq
from variants.models import choice


def _layer(bits=4, **kw):
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((6, 128)) * 0.05).astype(np.float32)
    c, s, b = affine_codes.quantize(w, bits, 64)
    return w, c, s, b, dwq.LearnedCodeAffineLinear(c, s, b, 64, bits=bits, **kw)


def test_learned_codes_start_exactly_at_the_start_codes():
    _, c, s, b, lin = _layer()
    assert np.array_equal(np.array(lin.weight()), affine_codes.dequantize(c, s, b, 64))
    assert np.array_equal(lin.codes(), c)
    assert sorted(k for k, _ in tree_flatten(lin.trainable_parameters())) == [
        "bias_delta", "code_delta", "scale_delta"]


def test_code_offsets_round_clip_and_pass_the_gradient_straight_through():
    _, c, s, b, lin = _layer(code_unit=0.5)  # the parameter is δ / 0.5
    delta = np.zeros(lin.code_delta.shape, np.float32)
    delta[0, 0, :4] = [0.8, 1.2, -1.2, 40.0]  # δ = 0.4, 0.6, -0.6, 20 code steps
    lin.code_delta = mx.array(delta)
    got = lin.codes().reshape(6, 2, 64)[0, 0, :4].astype(int)
    c0 = c.reshape(6, 2, 64)[0, 0, :4].astype(int)
    assert got.tolist() == [c0[0], c0[1] + 1, c0[2] - 1, 15]  # the last clipped to 2^4 − 1
    # forward: the integer codes' weight; backward: d loss / d δ-parameter = g · scale · unit
    x = mx.array(np.random.default_rng(0).standard_normal((3, 128)).astype(np.float32))

    def loss(params):
        lin.update(params)
        return (lin(x) ** 2).sum()

    g = mx.grad(loss)(lin.trainable_parameters())["code_delta"]
    w = affine_codes.dequantize(lin.codes(), np.array(lin.group_scales()),
                                np.array(lin.group_biases()), 64)
    np.testing.assert_allclose(np.array(lin.weight()), w, rtol=0, atol=1e-7)
    y = np.array(x) @ w.T
    dw = 2 * y.T @ np.array(x)  # d loss / d W, (6, 128)
    want = dw.reshape(6, 2, 64) * np.array(lin.group_scales())[..., None] * 0.5
    np.testing.assert_allclose(np.array(g), want, rtol=1e-4, atol=1e-6)


def test_residual_start_puts_offsets_at_the_fp32_weights_place():
    """``code_start`` > 0: δ0 = clip((w − bias) / scale − q, ±code_start); the codes unchanged."""
    w, c, s, b, _ = _layer()
    r = (w.reshape(6, 2, 64) - b[..., None]) / s[..., None] - c.reshape(6, 2, 64)
    # round to nearest: within half a step, but where MLX's rule clips the far edge of a group
    assert np.mean(np.abs(r) <= 0.5 + 1e-5) > 0.95 and np.abs(r).max() > 0.4
    start = np.clip(r, -0.4, 0.4)
    lin = dwq.LearnedCodeAffineLinear(c, s, b, 64, bits=4, code_start=start, code_unit=0.1)
    assert np.array_equal(lin.codes(), c)
    np.testing.assert_allclose(np.array(lin.code_delta) * 0.1, start, rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def choice_model(checkpoint):
    model = choice.build(checkpoint)
    model.temperatures = {}
    return model


def test_dwq_with_learned_codes_and_the_keep_rule(choice_model):
    """Offsets that never reach a rounding edge train exactly as fixed codes (the forward is the
    same integer codes, the scales' gradients the same); a step large enough to flip codes by
    the thousand raises the held-out loss (measured: 0.0083 -> 0.71), and the keep rule returns
    the start's codes, scales and biases."""
    fit = choice.make_taskset(data.sample(data.split_frame(data.load_vader(), "fit"), 16,
                                          seed=1))
    mods = dict(choice_model.module.named_modules())
    paths = [p for p in activations.target_linears(choice_model.module) if ".5." in p]
    layers = {p: (*affine_codes.quantize(np.array(mods[p].weight), 4, 64), 64, None)
              for p in paths}
    kw = dict(epochs=3, batch_size=4, learning_rate=3e-5, train_norms=False)
    plain, _, f0 = dwq.distill(choice_model, layers, fit, **kw)
    still, _, f1 = dwq.distill(choice_model, layers, fit, learn_codes=True, code_step=3e-3, **kw)
    assert f0["trained_scales_kept"] and f1["trained_scales_kept"]
    assert f1["kl_after"] == pytest.approx(f0["kl_after"], rel=1e-5)
    for p, (c, s, b, _, _) in layers.items():
        assert np.array_equal(still[p][0], c) and still[p][0].dtype == np.uint8
        np.testing.assert_allclose(still[p][1], plain[p][1], rtol=1e-5)
        assert not np.array_equal(still[p][1], s)  # the scales trained
    back, _, f2 = dwq.distill(choice_model, layers, fit, learn_codes=True, code_step=0.1, **kw)
    assert f2["loss_after"] > 10 * f2["loss_before"] and not f2["trained_scales_kept"]
    for p, (c, s, b, _, _) in layers.items():
        assert np.array_equal(back[p][0], c) and np.array_equal(back[p][1], s)
        assert np.array_equal(back[p][2], b)

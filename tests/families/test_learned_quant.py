"""The learned quantizers (AWQ, GPTQ, distilled scales): MLX's packed format reproduced bit for
bit, GPTQ against an independent float64 transcription of the paper's algorithm, AWQ never worse
than round-to-nearest, DWQ's loss and scales, packed tensors = the simulated weights, bad input."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from variants.arch import activations
from variants.datasets import bundled as data
from variants.families.quant import affine_codes, awq, dwq, gptq, learned as quant_learned
from variants.families.quant.family import QuantConfig, ladder
from variants.cli import main
from variants.models import choice, sentiment

Q = "encoder.layers.0.attention.query"  # real (384, 384)
UP = "encoder.layers.1.intermediate"  # real (1536, 384)
DOWN = "encoder.layers.2.output"  # real (384, 1536)


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)  # head untrained: the encoder's layers are what counts


@pytest.fixture(scope="module")
def fit():
    frame = data.split_frame(data.load_vader(), "fit")
    return sentiment.make_taskset(data.sample(frame, 24, seed=0))


@pytest.fixture(scope="module")
def stats(model, fit):
    return activations.collect(model, fit, paths=[Q, UP, DOWN], batch_size=8)


def _weight(model, path):
    return np.array(dict(model.module.named_modules())[path].weight, np.float32)


# ---- MLX's affine format, bit for bit ----

@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_affine_rule_and_packing_equal_mx_quantize(bits, group_size):
    rng = np.random.default_rng(bits * group_size)
    w = (rng.standard_normal((8, 256)) * rng.uniform(0.01, 3, (8, 1))).astype(np.float32)
    w[0, :group_size] = 0.0  # an all-zero group: q0 = 0, bias 0
    w[1, :group_size] = np.abs(w[1, :group_size])  # max edge larger: negative scale
    q, s, b = mx.quantize(mx.array(w), group_size=group_size, bits=bits)
    codes, scales, biases = affine_codes.quantize(w, bits, group_size)
    packed = affine_codes.pack(codes, bits)
    assert np.array_equal(packed, np.array(q))
    assert np.array_equal(scales, np.array(s)) and np.array_equal(biases, np.array(b))
    assert np.array_equal(affine_codes.unpack(packed, bits, 256), codes)
    assert np.array_equal(affine_codes.dequantize(codes, scales, biases, group_size),
                          np.array(mx.dequantize(q, s, b, group_size=group_size, bits=bits)))


def test_affine_rule_hand_computed():
    """One 2-bit group [-2.325, ..., 1.96]: |min| > |max|, naive scale 4.285/3 = 1.428, q0 =
    rint(-2.325 / 1.428) = -2, so scale = -2.325 / -2 = 1.1625, bias = -2.325 (0 is code 2)."""
    s, b = affine_codes.group_params([-2.325], [1.96], 2)
    assert s[0] == pytest.approx(1.1625, rel=1e-6) and b[0] == pytest.approx(-2.325, rel=1e-7)
    # |max| larger: scale -4/3, q0 = rint(3 / (-4/3)) = rint(-2.25) = -2, scale 3 / -2 = -1.5
    s, b = affine_codes.group_params([-1.0], [3.0], 2)
    assert s[0] == pytest.approx(-1.5, rel=1e-6) and b[0] == pytest.approx(3.0, rel=1e-7)


# ---- GPTQ ----

def gptq_transcription(W, H, bits, group_size, damping=0.01, act_order=False):
    """Algorithm 1 of Frantar et al. 2023 written out in float64 NumPy without lazy batching:
    H⁻¹ = Cholesky(H⁻¹)ᵀ (upper), then for each column j: group parameters at a group's first
    column from the current weights, q_j = quant(w_j), e = (w_j − q_j) / [H⁻¹]_jj,
    W[:, j:] −= e [H⁻¹]_{j, j:}. ``act_order`` (the authors' ``act_order`` with
    ``static_groups``): W and H permuted by descending diag(H), each column's group parameters
    those of its original input group in the original weights, Q permuted back."""
    W = np.array(W, np.float64)
    H = np.array(H, np.float64)
    dead = np.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    n = W.shape[1]
    perm = np.argsort(-np.diag(H), kind="stable") if act_order else np.arange(n)
    W0 = W.copy()
    W, H = W[:, perm], H[np.ix_(perm, perm)]
    H = H + damping * np.mean(np.diag(H)) * np.eye(len(H))
    Hinv = np.linalg.cholesky(np.linalg.inv(H)).T  # upper factor of H⁻¹
    n_bins = 2 ** bits - 1
    Q = np.zeros_like(W)
    for j in range(n):
        if act_order or j % group_size == 0:
            start = perm[j] // group_size * group_size
            grp = (W0[:, start:start + group_size] if act_order
                   else W[:, j:j + group_size]).astype(np.float32)
            lo, hi = grp.min(1), grp.max(1)
            # MLX's rule written again: the larger-magnitude edge on an integer code
            mask = np.abs(lo) > np.abs(hi)
            sc = np.maximum((hi - lo) / np.float32(n_bins), np.float32(1e-7)).astype(np.float32)
            sc = np.where(mask, sc, -sc).astype(np.float32)
            edge = np.where(mask, lo, hi).astype(np.float32)
            q0 = np.rint(edge / sc)
            scale = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), sc).astype(np.float32)
            bias = np.where(q0 != 0, edge, 0).astype(np.float32)
        q = np.clip(np.rint((W[:, j].astype(np.float32) - bias) / scale), 0, n_bins)
        Q[:, j] = (scale * q.astype(np.float32) + bias).astype(np.float64)
        e = (W[:, j] - Q[:, j]) / Hinv[j, j]
        W[:, j:] -= np.outer(e, Hinv[j, j:])
    out = np.zeros_like(Q)
    out[:, perm] = Q
    return out


@pytest.mark.parametrize("bits, group_size, block", [(4, 64, 128), (3, 32, 48), (8, 128, 128)])
def test_gptq_equals_the_paper_transcription(model, stats, bits, group_size, block):
    W = _weight(model, Q)[:48]  # 48 real rows, all 384 inputs
    G = stats[activations.input_site(Q)].gram
    codes, scales, biases = gptq.quantize(W, G, bits, group_size, block_size=block)
    got = affine_codes.dequantize(codes, scales, biases, group_size)
    want = gptq_transcription(W, G, bits, group_size)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # and it beats round-to-nearest on these activations
    rtn = affine_codes.dequantize(*affine_codes.quantize(W, bits, group_size), group_size)
    assert gptq.output_error(W, got, G) < gptq.output_error(W, rtn, G)


@pytest.mark.parametrize("bits, group_size, block", [(4, 64, 128), (3, 32, 48)])
def test_gptq_act_order_equals_the_permuted_transcription(model, stats, bits, group_size, block):
    W = _weight(model, Q)[:48]
    G = stats[activations.input_site(Q)].gram
    assert not np.all(np.diff(np.diag(G)) <= 0)  # the order really changes
    codes, scales, biases = gptq.quantize(W, G, bits, group_size, block_size=block,
                                          act_order=True)
    got = affine_codes.dequantize(codes, scales, biases, group_size)
    want = gptq_transcription(W, G, bits, group_size, act_order=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # static groups: the packed format's scales are round-to-nearest's of the original weights
    _, s_rtn, b_rtn = affine_codes.quantize(W, bits, group_size)
    assert np.array_equal(scales, s_rtn) and np.array_equal(biases, b_rtn)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("bits", [2, 4, 6])
def test_gptq_with_identity_hessian_is_round_to_nearest(model, bits, act_order):
    W = _weight(model, UP)[:64]
    codes, scales, biases = gptq.quantize(W, np.eye(W.shape[1]), bits, 64, act_order=act_order)
    q, s, b = mx.quantize(mx.array(W), group_size=64, bits=bits)
    assert np.array_equal(affine_codes.pack(codes, bits), np.array(q))
    assert np.array_equal(scales, np.array(s)) and np.array_equal(biases, np.array(b))


def test_awq_scales_then_gptq_codes(model, stats):
    """DWQ's start: GPTQ of W·diag(s) on the scaled inputs, s from AWQ's own search; equal
    activations (s = 1) leave plain GPTQ."""
    W = _weight(model, UP)[:48]
    st = stats[activations.input_site(UP)]
    codes, scales, biases, inv, facts = awq.quantize_gptq(W, st.gram, st.mean_abs, 4, 64)
    *_, inv_awq, f_awq = awq.quantize(W, st.gram, st.mean_abs, 4, 64)
    assert facts["alpha"] == f_awq["alpha"] > 0 and np.array_equal(inv, inv_awq)
    s = (1 / inv).astype(np.float32)
    want = gptq.quantize((W * s).astype(np.float32), st.gram / np.outer(s, s), 4, 64)
    for a, b in zip((codes, scales, biases), want):
        assert np.array_equal(a, b)
    deq = affine_codes.dequantize(codes, scales, biases, 64) * inv
    assert facts["error"] == pytest.approx(gptq.output_error(W, deq, st.gram), rel=1e-12)
    flat = awq.quantize_gptq(W, st.gram, np.ones(W.shape[1]), 4, 64)
    plain = gptq.quantize(W, st.gram, 4, 64)
    assert np.all(flat[3] == 1) and all(np.array_equal(a, b) for a, b in zip(flat[:3], plain))


@pytest.mark.parametrize("H", [-np.eye(64), np.full((64, 64), np.nan)])
def test_gptq_singular_hessian_names_layer_and_damping(H):
    with pytest.raises(gptq.SingularHessianError,
                       match=r"GPTQ at enc\.l3: the Hessian 2XᵀX stays singular after damping "
                             r"0\.01"):
        gptq.quantize(np.ones((4, 64)), H, 4, 64, where="enc.l3")


# ---- AWQ ----

@pytest.mark.parametrize("path", [Q, UP, DOWN])
@pytest.mark.parametrize("bits", [3, 4])
def test_awq_never_worse_than_rtn_on_the_same_activations(model, stats, path, bits):
    W = _weight(model, path)[:128]
    s = stats[activations.input_site(path)]
    codes, scales, biases, inv, facts = awq.quantize(W, s.gram, s.mean_abs, bits, 64, grid=10,
                                                     clip_grid=10)
    deq = affine_codes.dequantize(codes, scales, biases, 64) * inv
    rtn = affine_codes.dequantize(*affine_codes.quantize(W, bits, 64), 64)
    err, err_rtn = gptq.output_error(W, deq, s.gram), gptq.output_error(W, rtn, s.gram)
    assert err <= err_rtn
    assert facts["error"] == pytest.approx(err, rel=1e-9)
    assert facts["error_rtn"] == pytest.approx(err_rtn, rel=1e-9)
    if bits == 3:  # real activations have outlier channels: AWQ wins clearly at 3 bits
        assert err < 0.95 * err_rtn


def test_awq_scales_follow_the_paper():
    m = np.array([0.5, 2.0, 8.0])
    s = awq.channel_scales(m, 0.5)  # sqrt(m) / sqrt(max · min) of sqrt(m)
    np.testing.assert_allclose(s, np.sqrt(m) / np.sqrt(np.sqrt(8.0) * np.sqrt(0.5)))
    np.testing.assert_allclose(awq.channel_scales(m, 0.0), 1.0)


# ---- the whole build: packed tensors = the simulated weights ----

@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_packed_tensors_dequantize_to_the_simulated_weights(model, fit, method, monkeypatch,
                                                            tmp_path):
    paths = [Q, DOWN] if method == "gptq" else [Q, UP]  # a 1536-wide Linear each
    monkeypatch.setattr(activations, "target_linears", lambda module, **_: paths)
    cfg = QuantConfig(bits=4, group_size=64, method=method)
    native, info = quant_learned.build(model, cfg, "native", fit=fit, cache_dir=tmp_path)
    sim, info_sim = quant_learned.build(model, cfg, "simulated", fit=fit, cache_dir=tmp_path)
    assert info["cached"] is False and info_sim["cached"] is True  # the second read the cache
    assert info["calibration_split"] == "fit" and info["calibration_rows"] == 24
    assert [r["path"] for r in info["layers"]] == paths
    nm, sm = dict(native.module.named_modules()), dict(sim.module.named_modules())
    for path in paths:
        m, inv = nm[path], None
        if isinstance(m, quant_learned.InputScaledLinear):
            m, inv = m.linear, m.input_scale
        assert isinstance(m, nn.QuantizedLinear) and m.bits == 4
        w = mx.dequantize(m["weight"], m["scales"], m["biases"], group_size=64, bits=4)
        w = w if inv is None else w * inv
        assert np.array_equal(np.array(w), np.array(sm[path].weight))
    row = info["layers"][0]
    assert row["rel_error"] <= row["rtn_rel_error"] + (1e-12 if method == "awq" else 0.05)
    x = mx.array(np.random.default_rng(0).standard_normal((3, 384)).astype(np.float32))
    np.testing.assert_allclose(np.array(nm[Q](x)), np.array(sm[Q](x)), rtol=1e-4, atol=1e-4)


def test_layers_learned_for_one_map_are_reused_by_another(model, fit, monkeypatch, tmp_path):
    # GPTQ reads the fp32 reference's activations: a layer's result depends on its own width
    # only, so a second map sharing a (layer, width) reads it from the per-layer cache
    monkeypatch.setattr(activations, "target_linears", lambda module, **_: [Q, DOWN])
    q = r"^encoder\.layers\.0\.attention\.query$=4"
    first = QuantConfig(bits=6, group_size=64, method="gptq", bits_map=q)  # Q 4, DOWN 6
    second = QuantConfig(bits=8, group_size=64, method="gptq", bits_map=q)  # Q 4, DOWN 8
    _, _, f1 = quant_learned.learned_layers(model, first, fit, cache_dir=tmp_path)
    assert f1["layers_reused"] == 0 and f1["cached"] is False
    got, _, f2 = quant_learned.learned_layers(model, second, fit, cache_dir=tmp_path)
    assert f2["layers_reused"] == 1 and f2["cached"] is False
    assert [r["reused"] for r in f2["layers"]] == [True, False]  # Q read, DOWN learned
    fresh, _, _ = quant_learned.learned_layers(model, second, fit, cache_dir=None)
    for path in (Q, DOWN):  # the cache gives exactly what learning from scratch gives
        for a, b in zip(got[path][:3], fresh[path][:3]):
            assert np.array_equal(a, b)
    _, _, f3 = quant_learned.learned_layers(model, first, fit, cache_dir=tmp_path)
    assert f3["layers_reused"] == 2 and f3["cached"] is True
    # other fit texts: other statistics, other keys: nothing is reused
    other = fit.subset(np.arange(12))
    _, _, f4 = quant_learned.learned_layers(model, first, other, cache_dir=tmp_path)
    assert f4["layers_reused"] == 0


def test_report_says_how_many_linears_came_from_the_layer_cache():
    from variants.families.quant.report import method_lines

    info = {"method": "gptq", "calibration_rows": 24, "build_s": 3.0, "layers_reused": 2}
    assert "2 Linears read from the per-layer cache" in method_lines(info)
    assert "per-layer cache" not in method_lines(dict(info, layers_reused=0))
    assert "read from the cache;" in method_lines(dict(info, cached=True))


def test_report_of_dwq_rows_from_the_awq_scaled_start():
    from variants.families.quant.report import method_lines

    row = {"path": "encoder.layers.0.attention.query", "bits": 4, "group_size": 64,
           "rtn_rel_error": 0.01, "init_rel_error": 0.005, "rel_error": 0.004, "alpha": 0.35}
    text = method_lines({"method": "dwq", "calibration_rows": 24, "layers": [row]})
    assert "| 0.attention.query | 4 | 0.01 | 0.005 | 0.004 | 0.35 | — |" in text


# ---- distilled scales ----

@pytest.fixture(scope="module")
def choice_model(checkpoint):
    return choice.build(checkpoint)


def test_dwq_loss_falls_and_scales_stay_in_range(choice_model):
    frame = data.split_frame(data.load_vader(), "fit")
    fit = choice.make_taskset(data.sample(frame, 16, seed=1))
    choice_model.temperatures = {}
    mods = dict(choice_model.module.named_modules())
    paths = [p for p in activations.target_linears(choice_model.module) if ".5." in p]
    layers = {}
    for p in paths:
        c, s, b = affine_codes.quantize(np.array(mods[p].weight), 3, 64)
        layers[p] = (c, s, b, 64, None)
    trained, norms, facts = dwq.distill(choice_model, layers, fit, epochs=3, batch_size=4,
                                        learning_rate=3e-5)
    # 12 texts train (3 batches x 3 epochs), the last 4 are held out; measured (the options
    # embedded by the quantized model, as the variant does): held-out loss 0.0232 -> 0.0229
    # (KL 0.01228 -> 0.01194), the mean step loss 0.0297 -> 0.0171
    assert facts["texts"] == 12 and facts["valid_texts"] == 4 and facts["steps"] == 9
    assert facts["loss_after"] < 0.995 * facts["loss_before"]
    assert facts["kl_after"] < 0.98 * facts["kl_before"]
    assert facts["step_means"][-1] < 0.8 * facts["step_means"][0]
    assert facts["trained_scales_kept"]
    # every encoder layer's two LayerNorms train too (weight and bias): 6 x 2 x 2
    assert len(norms) == 6 * 2 * 2 and all(v.shape == (384,) for v in norms.values())
    assert any(not np.array_equal(v, np.array(choice_model.module.parameters()["encoder"][
        "layers"][5]["output_norm"]["weight"])) for k, v in norms.items()
        if k == "encoder.layers.5.output_norm.weight")
    for p, (c, s, b, _, _) in layers.items():
        _, s2, b2 = trained[p]
        assert s2.dtype == np.float32 and s2.shape == s.shape and b2.shape == b.shape
        assert np.isfinite(s2).all() and np.isfinite(b2).all()
        assert (np.sign(s2) == np.sign(s)).all()  # the same codes still map in the same order
        assert np.abs(s2 / s - 1).max() < 0.5
        assert not np.array_equal(s2, s)  # they trained
        packed = affine_codes.pack(c, 3)
        w = mx.dequantize(mx.array(packed), mx.array(s2), mx.array(b2), group_size=64, bits=3)
        lin = dwq.AffineLinear(c, s2, b2, 64)
        assert np.array_equal(np.array(w), np.array(lin.weight()))


def test_relative_scales_start_exactly_at_the_codes_weights():
    """θ = β = 0 is the start's ``scale · q + bias`` bit for bit; θ, β move a scale by a fraction
    of itself and a bias by a fraction of one code step (s0 · β)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((6, 128)) * 0.05).astype(np.float32)
    c, s, b = affine_codes.quantize(w, 4, 64)
    lin = dwq.RelativeAffineLinear(c, s, b, 64)
    assert np.array_equal(np.array(lin.weight()), affine_codes.dequantize(c, s, b, 64))
    assert sorted(k for k, _ in tree_flatten(lin.trainable_parameters())) == [
        "bias_delta", "scale_delta"]
    lin.scale_delta = mx.full(s.shape, 0.25)
    lin.bias_delta = mx.full(b.shape, -2.0)
    np.testing.assert_allclose(np.array(lin.group_scales()), s * 1.25, rtol=1e-6)
    np.testing.assert_allclose(np.array(lin.group_biases()), b - 2 * s, rtol=1e-6, atol=1e-8)
    # the exported tensors are what the packed layer dequantizes to
    packed = affine_codes.pack(c, 4)
    deq = mx.dequantize(mx.array(packed), lin.group_scales(), lin.group_biases(),
                        group_size=64, bits=4)
    assert np.array_equal(np.array(deq), np.array(lin.weight()))


def test_dwq_refuses_a_model_it_cannot_differentiate(choice_model):
    other = choice_model.replace_module(choice_model.module)
    other.exit_head_kind = None  # no readout kind the differentiable forward knows
    frame = data.split_frame(data.load_vader(), "fit")
    fit = choice.make_taskset(data.sample(frame, 8, seed=1))
    with pytest.raises(ValueError, match="distilled scales need a model they can differentiate, "
                                         "and minilm-choice is not one .*--quant-method gptq"):
        dwq.distill(other, {}, fit, epochs=1, batch_size=8)


# ---- configuration and bad input ----

def test_ladder_crosses_methods_and_widths():
    names = [c.name for c in ladder(bits=[4, 8], quant_method=["rtn", "gptq", "dwq"])]
    assert names == ["q4-g64", "q8-g64", "q4-g64-gptq", "q8-g64-gptq", "q4-g64-dwq",
                     "q8-g64-dwq"]
    (mixed,) = ladder(bits_map="mixed_4_8", quant_method=["awq"])
    assert mixed.name.startswith("q4-g64-mixed_4_8-") and mixed.name.endswith("-awq")
    assert mixed.method == "awq" and mixed.bits_map
    with pytest.raises(ValueError, match="--quant-method foo: not known; choose from rtn awq "
                                         "gptq dwq"):
        ladder(bits=[4], quant_method=["gptq", "foo"])


def test_no_fit_rows_is_one_line():
    with pytest.raises(ValueError, match="--quant-method gptq learns from fit-split "
                                         "activations, but the fit split is empty"):
        quant_learned.check_inputs(QuantConfig(bits=4, method="gptq"), None)


def test_cli_unknown_method_exits_2_and_writes_nothing(tmp_path, capsys):
    code = main(["sweep", "--quant-method", "gptq", "optq", "--results-dir",
                 str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--quant-method optq: not known; choose from rtn awq gptq dwq" in err
    assert not (tmp_path / "r").exists()


def test_cli_learned_method_without_fit_rows_names_n_fit(tmp_path, capsys):
    code = main(["sweep", "--quant-method", "rtn", "gptq", "--n-fit", "0", "--n-calibration",
                 "40", "--n-eval", "40", "--no-progress", "--results-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert ("--quant-method gptq learns from fit-split activations, but the fit split is "
            "empty; pass --n-fit 100 or more, or use --quant-method rtn") in err
    assert not (tmp_path / "r").exists()


def test_model_toml_quant_method(tmp_path):
    from variants.models.model_config import ModelConfigError, load_model_config as load

    base = ('name = "m"\nlogits = "linear-head"\noptions = ["a", "b"]\nactions = ["x", "y"]\n')
    ok = tmp_path / "ok.toml"
    ok.write_text(base + '[quant]\nmethod = ["gptq", "rtn", "gptq"]\n')
    assert load(ok).quant_method == ("gptq", "rtn")
    bad = tmp_path / "bad.toml"
    bad.write_text(base + '[quant]\nmethod = "optq"\n')
    with pytest.raises(ModelConfigError, match=r"\[quant\] method: \['optq'\] is not a list of "
                                               "quantizers from rtn awq gptq dwq"):
        load(bad)


def test_relative_scale_unit_follows_the_width():
    """θ's unit is 15 / (2^bits − 1): one step moves the largest code's weight by the same
    number of code steps at every width (exactly 1 at 4 bits)."""
    assert dwq.scale_unit(4) == 1.0
    assert dwq.scale_unit(6) == 15 / 63 and dwq.scale_unit(8) == 15 / 255
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((4, 64)) * 0.05).astype(np.float32)
    for bits in (4, 6, 8):
        c, s, b = affine_codes.quantize(w, bits, 64)
        lin = dwq.RelativeAffineLinear(c, s, b, 64, scale_unit=dwq.scale_unit(bits))
        lin.scale_delta = mx.full(s.shape, 0.01)
        moved = (np.array(lin.weight()) - affine_codes.dequantize(c, s, b, 64)) / s
        # the largest code (2^bits − 1) moves by 15 × 0.01 code steps, whatever the width
        np.testing.assert_allclose(np.abs(moved).max(), 0.15, rtol=1e-3)


def test_dwq_student_carries_a_table_the_bits_map_names(model, fit, monkeypatch):
    """A ``--bits-map`` entry naming the word embedding table quantizes it by round-to-nearest
    (without ``--quantize-embeddings``): DWQ's student carries that table, dequantized, as it
    does for ``--quantize-embeddings``."""
    seen = {}

    def spy(reference, layers, fit, **kw):
        seen["module"] = kw["module"]
        return {}, {}, {"kl_before": 0.0, "kl_after": 0.0}

    monkeypatch.setattr(dwq, "distill", spy)
    emb = "encoder.embeddings.word_embeddings"
    w = dict(model.module.named_modules())[emb].weight
    want = np.array(mx.dequantize(*mx.quantize(w, group_size=64, bits=3), group_size=64, bits=3))
    cfg = QuantConfig(bits=4, method="dwq", bits_map="word_embeddings=3")
    quant_learned._distill(model, cfg, {}, [], {}, fit, None)
    assert seen["module"] is not None
    got = np.array(dict(seen["module"].named_modules())[emb].weight)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    assert np.abs(got - np.array(w)).max() > 1e-3  # really quantized (3 bits)


def test_gptq_keeps_the_scale_dtype_and_stores_the_unseen_rows_apart(model, fit, monkeypatch,
                                                                       tmp_path):
    """A learned build with --scale-dtype float16 stores the learned scales in float16 (the
    simulated weight is their float32 round trip) and a map's word_embeddings@unseen entry: the
    fit texts' rows at the table's width, the others at theirs (issue #42)."""
    from variants.families.quant.row_use import row_counts

    monkeypatch.setattr(activations, "target_linears", lambda module, **_: [Q])
    cfg = QuantConfig(bits=6, group_size=64, method="gptq", scale_dtype="float16",
                      bits_map="word_embeddings@unseen=3,word_embeddings=8")
    native, info = quant_learned.build(model, cfg, "native", fit=fit, cache_dir=tmp_path)
    sim, _ = quant_learned.build(model, cfg, "simulated", fit=fit, cache_dir=tmp_path)
    nm, sm = dict(native.module.named_modules()), dict(sim.module.named_modules())
    m = nm[Q]
    assert m["scales"].dtype == mx.float16 and m["biases"].dtype == mx.float16
    w = mx.dequantize(m["weight"], m["scales"].astype(mx.float32),
                      m["biases"].astype(mx.float32), group_size=64, bits=6)
    assert np.array_equal(np.array(w), np.array(sm[Q].weight))
    used = row_counts(model, fit) > 0
    rows = info["row_map"]["encoder.embeddings.word_embeddings"]
    assert rows["rows"] == [int(used.sum()), int((~used).sum())]
    assert [f[0] for f in rows["formats"]] == [8, 3]

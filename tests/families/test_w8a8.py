"""The w8a8 family: the integer GEMM against exact NumPy int64 products, the per-token quantizer
against a hand-computed example, native vs simulated Linears, SmoothQuant's identity and its α
search, the family's flags and bad input."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.datasets import bundled as data
from variants.runtime import fused_layer, int8_linear, qkernel
from variants.families import get_family
from variants.families.w8a8 import build as w8a8
from variants.families.w8a8.family import W8A8Config
from variants.models import sentiment


@pytest.fixture(scope="module")
def k8():
    mod = qkernel.load()
    if mod is None or not mod.has_dnnl():
        pytest.skip("W8A8 integer GEMM unavailable here (apt-get install libdnnl-dev, then "
                    "python -m variants.runtime.qkernel --force)")
    return mod


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 33, 5), (24, 384, 384), (37, 1536, 97),
                                     (130, 384, 1536)])
def test_int8_gemm_equals_numpy_int64(k8, m, k, n):
    rng = np.random.default_rng(m * k + n)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    b[0, :] = -128  # extremes: the largest products
    a[0, :] = 255
    got = np.array(k8.int8_gemm(mx.array(a), mx.array(b)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64).T)


def test_per_token_quantizer_hand_computed():
    # row [-1, 0, 0.4, 2]: lo -1, hi 2, scale 3/255, zero point round(1 / (3/255)) = 85;
    # codes round(x / scale) + 85 = [0, 85, 85 + 34, 85 + 170 = 255]
    # row of zeros: scale 1, zero point 0, codes 0; row [0.4, 1]: lo 0, scale 1/255, codes 102, 255
    x = mx.array([[-1.0, 0.0, 0.4, 2.0], [0.0, 0.0, 0.0, 0.0], [0.4, 1.0, 0.0, 1.0]])
    q, scale, zp = w8a8.quantize_rows(x)
    np.testing.assert_array_equal(np.array(q), [[0, 85, 119, 255], [0, 0, 0, 0],
                                                [102, 255, 0, 255]])
    np.testing.assert_allclose(np.array(scale)[:, 0], [3 / 255, 1.0, 1 / 255], rtol=1e-7)
    np.testing.assert_array_equal(np.array(zp)[:, 0], [85, 0, 0])


def test_weight_quantizer_symmetric_per_row():
    w = mx.array([[1.27, -0.635, 0.0], [0.0, 0.0, 0.0], [-2.54, 1.0, 0.01]])
    wq, s = w8a8.quantize_weight(w)
    np.testing.assert_allclose(np.array(s), [0.01, 1.0, 0.02], rtol=1e-6)
    np.testing.assert_array_equal(np.array(wq), [[127, -64, 0], [0, 0, 0], [-127, 50, 0]])


def _linear(n_in, n_out, seed, bias=True):
    mx.random.seed(seed)
    lin = nn.Linear(n_in, n_out, bias=bias)
    mx.eval(lin.parameters())
    return lin


@pytest.mark.parametrize("bias, smooth", [(True, False), (False, False), (True, True)])
def test_native_equals_simulated_to_round_off(k8, bias, smooth):
    rng = np.random.default_rng(1)
    lin = _linear(384, 96, 2, bias)
    x = rng.normal(size=(3, 17, 384)).astype(np.float32)
    x[..., 5] *= 30  # an outlier channel
    s = w8a8.smooth_factors(np.abs(x).reshape(-1, 384).max(0), np.array(lin.weight), 0.5) \
        if smooth else None
    q = w8a8.Int8Linear(lin, native=True, smooth=s)
    assert q.kernel == int8_linear.NAMES["prepacked" if int8_linear.can_prepack(q.wq) else "native"]
    native, sim = np.array(q(mx.array(x))), np.array(q.simulated(mx.array(x)))
    assert native.shape == (3, 17, 96)
    scale = np.abs(sim).max()
    assert np.abs(native - sim).max() <= 2e-6 * scale
    # and both are a W8A8 approximation of the fp32 Linear, not something else
    ref = np.array(lin(mx.array(x)))
    assert np.abs(native - ref).max() <= 0.05 * np.abs(ref).max()


def test_smoothing_leaves_the_fp32_product_unchanged():
    rng = np.random.default_rng(4)
    lin = _linear(64, 32, 5)
    x = rng.normal(size=(50, 64)).astype(np.float32) * rng.uniform(0.1, 20, 64).astype(np.float32)
    s = w8a8.smooth_factors(np.abs(x).max(0), np.array(lin.weight), 0.7)
    w = np.array(lin.weight, np.float64)
    before = x.astype(np.float64) @ w.T
    after = (x / s) @ (w * s[None, :]).T
    np.testing.assert_allclose(after, before, rtol=1e-9, atol=1e-9)
    # SmoothQuant's factors equalise the per-channel ranges: max|x/s| = max|x|^(1-α) max|W|^(1-α)
    np.testing.assert_allclose(np.abs(x / s).max(0),
                               np.abs(x).max(0) ** 0.3 * np.abs(w).max(0) ** 0.3, rtol=1e-5)


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)


@pytest.fixture(scope="module")
def fit():
    frame = data.split_frame(data.load_vader(), "fit")
    return sentiment.make_taskset(data.sample(frame, 24, seed=0))


def test_smoothquant_search_never_worse_than_plain_on_real_activations(model, fit):
    variant, info = w8a8.build(model, W8A8Config(smooth=True, skip="layers\\.[1-5]\\."),
                               fit=fit)
    assert info["int8_layers"] == 6 and len(info["kept_fp32"]) == 30
    # Amdahl: 1/6 of the Linear weights (layer 0 of 6) at 4x -> 1 / (5/6 + 1/24) = 1.1429
    assert info["int8_share"] == pytest.approx(1 / 6)
    assert info["ideal_speedup"] == pytest.approx(1 / (5 / 6 + 1 / 24))
    # one α and one error pair per input site: q|k|v share theirs
    pre = "encoder.layers.0."
    assert set(info["errors"]) == set(info["alphas"]) == {
        pre + "attention.qkv", pre + "attention.out", pre + "intermediate", pre + "output"}
    for site, (plain, smoothed) in info["errors"].items():
        assert smoothed <= plain, site
    assert any(a > 0 for a in info["alphas"].values())  # migration chosen somewhere
    assert info["median_error_smooth"] < info["median_error_plain"]
    mods = dict(variant.module.named_modules())
    # q, k and v quantize one input alike (one stacked GEMM in the fused layer)
    qkv = [mods[pre + "attention." + n] for n in ("query", "key", "value")]
    assert info["alphas"][pre + "attention.qkv"] > 0  # 0.4 here
    assert all("inv_smooth" in m for m in qkv) and fused_layer._same_smooth(qkv)
    assert isinstance(mods["encoder.layers.0.output"], w8a8.Int8Linear)
    assert type(mods["encoder.layers.1.output"]) is nn.Linear


def test_native_and_simulated_models_agree(k8, model, fit):
    enc, _ = model.tokenizer.encode(["The soup was cold.", "Best pasta in years!"])
    ids, mask = (mx.array(a) for a in model.tokenizer.batch(enc)[:2])
    outs = {}
    for mode in ("native", "simulated"):
        v, info = w8a8.build(model, W8A8Config(), mode=mode)
        assert info["int8_layers"] == 36
        outs[mode] = np.array(v.module.encoder(ids, mask).last_hidden)
    ref = np.array(model.module.encoder(ids, mask).last_hidden)
    diff = np.abs(outs["native"] - outs["simulated"]).max()
    # a per-token code can round the other way when an upstream round-off moves x across a
    # code boundary: bounded by a small share of W8A8's own error
    assert diff <= 0.05 * np.abs(outs["native"] - ref).max()


def test_family_ladder_names_and_bad_input():
    fam = get_family("w8a8")
    assert [c.name for c in fam.ladder()] == ["w8a8", "w8a8-sq"]
    assert [c.name for c in fam.ladder(smooth=["on"], smooth_alpha=0.5)] == ["w8a8-sq0.50"]
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="--smooth-alpha .* outside \\[0, 1\\]"):
            fam.ladder(smooth=["on"], smooth_alpha=bad)
    with pytest.raises(ValueError, match="--int8-skip .* not a valid regular expression"):
        fam.ladder(int8_skip="(")


def test_skip_that_matches_everything_is_refused(model):
    with pytest.raises(ValueError, match="no Linear left to run in int8 .*--int8-skip"):
        w8a8.check_model(model.module, [W8A8Config(skip=".")])


def test_skip_that_matches_nothing_is_refused(model):
    with pytest.raises(ValueError, match="--int8-skip 'nosuch' matches no encoder Linear"):
        w8a8.check_model(model.module, [W8A8Config(skip="nosuch")])


def test_smoothquant_without_fit_texts_is_refused(model):
    with pytest.raises(ValueError, match="needs fit-split texts"):
        w8a8.build(model, W8A8Config(smooth=True), fit=None)


def test_report_names_the_timed_kernel_not_the_quality_builds():
    # build.json comes from the quality build (simulated); timing.json from the native one
    fam = get_family("w8a8")
    info = {"int8_layers": 36, "int8_share": 1.0, "kept_fp32": [], "kernel": "w8a8-simulated",
            "simulated_speed": True, "smooth": False}
    timed = {"kernel": {"reference": "fused-layer-cpp",
                        "variant": "fused-int8layer-cpp, int8-gemm-dnnl"}}
    text = fam.describe(info, timed)
    assert "- kernel: fused-int8layer-cpp, int8-gemm-dnnl\n" in text and "simulated" not in text
    text = fam.describe(info, {"kernel": {"variant": "w8a8-simulated"}})
    assert "kernel: w8a8-simulated (speed columns are simulated" in text
    assert "speed columns are simulated" in fam.describe(info, None)

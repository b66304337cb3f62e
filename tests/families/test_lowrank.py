"""Low-rank builder: the whitening identity, factor shapes, exact full rank, break-even,
activation statistics (padding masked, cache), quantized factors, bad input."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.arch import activations
from variants.datasets import bundled as data
from variants.arch.activations import LinearStats
from variants.families.lowrank import build as lr
from variants.families.lowrank import family as lowrank_family
from variants.families.lowrank.build import LowRankLinear
from variants.families.lowrank.family import LowRankConfig
from variants.cli import main
from variants.models import sentiment

Q = "encoder.layers.0.attention.query"  # real (384, 384)
UP = "encoder.layers.0.intermediate"  # real (1536, 384)
DOWN = "encoder.layers.0.output"  # real (384, 1536): its input site has 1536 channels
TEXTS = ["Honestly the best pasta I have had in years.", "The soup was cold.", "It is a restaurant."]


def _stats_from(x):
    x = np.asarray(x, np.float64)
    return LinearStats(x.T @ x, np.abs(x).sum(0), len(x))


def _weight(model, path):
    return np.array(dict(model.module.named_modules())[path].weight, np.float64)


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)  # head untrained: these tests look at the encoder only


@pytest.fixture(scope="module")
def calibration():
    frame = data.split_frame(data.load_vader(), "calibration")
    return sentiment.make_taskset(data.sample(frame, 24, seed=0))


@pytest.fixture(scope="module")
def stats(model, calibration):
    return activations.collect(model, calibration, paths=[Q, UP, DOWN], batch_size=8)


@pytest.fixture(scope="module")
def batch(checkpoint):
    encs, _ = checkpoint.tokenizer.encode(TEXTS)
    return tuple(mx.array(a) for a in checkpoint.tokenizer.batch(encs))


# ---- the whitening identity ‖(W − W_k) S‖_F = √(Σ_{j>k} σ_j²) of W S (SVD-LLM §3.1) ----

@pytest.mark.parametrize("m, n, k", [(24, 16, 1), (24, 16, 7), (16, 40, 12), (32, 32, 31)])
def test_whitening_identity_random(m, n, k):
    rng = np.random.default_rng(m * n + k)
    w = rng.normal(size=(m, n))
    x = rng.normal(size=(500, n)) * rng.uniform(0.1, 5, size=n)  # anisotropic activations
    st = _stats_from(x)
    dec = lr.decompose(w, "whitened", st)
    w_u, w_v = dec.factors(k)
    s = dec.right
    np.testing.assert_allclose(s @ s.T, st.second_moment, rtol=1e-10, atol=1e-12)
    lhs = np.linalg.norm((w - w_u @ w_v) @ s)
    assert lhs == pytest.approx(math.sqrt(np.sum(dec.sv[k:] ** 2)), rel=1e-9)
    # and it is the error over the activations themselves, smaller than plain SVD's there
    e_white = np.linalg.norm((w - w_u @ w_v) @ x.T)
    p_u, p_v = lr.decompose(w, "plain").factors(k)
    assert e_white == pytest.approx(lhs * math.sqrt(len(x)), rel=1e-9)
    assert e_white <= np.linalg.norm((w - p_u @ p_v) @ x.T) * (1 + 1e-12)


@pytest.mark.parametrize("path, k", [(Q, 96), (UP, 153), (DOWN, 153), (DOWN, 10)])
def test_whitening_identity_real(model, stats, path, k):
    """Real MiniLM weights and real calibration activations (24 texts: the 1536-wide input site
    has fewer tokens than channels, so its XᵀX is singular and λ > 0 is needed and reported)."""
    w = _weight(model, path)
    st = stats[activations.input_site(path)]
    dec = lr.decompose(w, "whitened", st, site=path)
    if st.count < w.shape[1]:  # rank(XᵀX) <= tokens < channels: Cholesky needs λ > 0
        assert dec.lam > 0
    w_u, w_v = dec.factors(k)
    lhs = np.linalg.norm((w - w_u @ w_v) @ dec.right)
    assert lhs == pytest.approx(math.sqrt(np.sum(dec.sv[k:] ** 2)), rel=1e-8)
    # seed digest: real matrices are numerically full rank — a 10x cut leaves a large error
    plain = lr.decompose(w, "plain")
    assert plain.sv[-1] / plain.sv[0] > 1e-4


def test_table_predicted_equals_weighted_error_for_whitened(model, stats):
    cfg = LowRankConfig(method="whitened", ratio=0.5)
    _, layers = lr.factorize_module(model.module, cfg, stats, paths=[Q, UP])
    for r in layers:
        assert r["rank"] == int(0.5 * r["break_even"])
        assert r["weighted_rel_error"] == pytest.approx(r["predicted_rel_error"], rel=1e-6)
        assert r["weighted_rel_error"] < r["plain_rel_error"]
        assert r["predicted_rel_error"] == pytest.approx(math.sqrt(1 - r["retained_energy"]))


# ---- factor shapes and exactness at full rank ----

@pytest.mark.parametrize("method", lowrank_family.METHODS)
@pytest.mark.parametrize("path", [Q, UP, DOWN])
def test_full_rank_reproduces_weight(model, stats, method, path):
    w = _weight(model, path)
    m, n = w.shape
    dec = lr.decompose(w, method, stats[activations.input_site(path)])
    w_u, w_v = dec.factors(min(m, n))
    assert w_u.shape == (m, min(m, n)) and w_v.shape == (min(m, n), n)
    tol = 1e-9 if method != "whitened" or dec.lam == 0 else 1e-6
    np.testing.assert_allclose(w_u @ w_v, w, atol=tol * np.abs(w).max())


def test_factor_shapes_and_forward(model, batch):
    lin = dict(model.module.named_modules())[UP]
    w = _weight(model, UP)
    w_u, w_v = lr.decompose(w, "plain").factors(384)
    layer = LowRankLinear(w_u, w_v, np.array(lin.bias))
    assert layer.down.weight.shape == (384, 384) and layer.up.weight.shape == (1536, 384)
    x = mx.random.normal((2, 5, 384))
    np.testing.assert_allclose(np.array(layer(x)), np.array(lin(x)), rtol=1e-4, atol=1e-4)
    k = 40
    small = LowRankLinear(*lr.decompose(w, "plain").factors(k), np.array(lin.bias))
    assert small.down.weight.shape == (k, 384) and small.up.weight.shape == (1536, k)
    assert small(x).shape == (2, 5, 1536)


# ---- rank choice and break-even ----

def test_break_even_layers_stay_dense_with_reason(model):
    cfg = LowRankConfig(method="plain", rule="rank", rank=200)
    new, layers = lr.factorize_module(model.module, cfg, paths=[Q, UP])
    by = {r["path"]: r for r in layers}
    assert by[Q]["dense"] and "break-even 192.0" in by[Q]["reason"]  # 384²/768 = 192
    assert not by[UP]["dense"] and by[UP]["rank"] == 200  # 1536·384/1920 = 307.2
    mods = dict(new.named_modules())
    assert type(mods[Q]) is nn.Linear and isinstance(mods[UP], LowRankLinear)
    _, (q, up) = lr.factorize_module(model.module, LowRankConfig(method="plain", ratio=1.0),
                                     paths=[Q, UP])
    assert q["dense"] and q["wanted_rank"] == 192
    assert not up["dense"] and up["rank"] == 307  # just below 307.2: factorised, as the rule says


def test_energy_rule_picks_smallest_rank(model, stats):
    cfg = LowRankConfig(method="whitened", rule="energy", energy=0.9)
    _, (row,) = lr.factorize_module(model.module, cfg, stats, paths=[Q])
    assert row["retained_energy"] >= 0.9
    dec = lr.decompose(_weight(model, Q), "whitened", stats[activations.input_site(Q)])
    assert dec.retained(row["rank"] - 1) < 0.9


def test_cost_model_counts_factor_flops():
    layers = [{"shape": [384, 384], "dense": False, "rank": 96},
              {"shape": [1536, 384], "dense": True, "rank": None}]
    c = lr.cost_model(layers, seq_len=10)
    dense, low = 2 * 10 * (384 * 384 + 1536 * 384), 2 * 10 * (96 * 768 + 1536 * 384)
    assert (c["flops_dense"], c["flops_lowrank"]) == (dense, low)
    assert c["ideal_speedup"] == pytest.approx(dense / low)
    with_attn = lr.cost_model(layers, seq_len=10, hidden_size=384, n_layers=1)
    assert with_attn["flops_dense"] == dense + 4 * 100 * 384


# ---- activation statistics ----

def test_statistics_mask_padding(model, calibration, stats):
    """Padding rows must not enter XᵀX: batch size 1 (no padding) and 8 agree, counts are the
    number of real tokens."""
    one = activations.collect(model, calibration, paths=[Q], batch_size=1)
    site = activations.input_site(Q)
    encs, _ = model.tokenizer.encode(list(calibration.texts))
    assert one[site].count == stats[site].count == sum(len(e.ids) for e in encs)
    np.testing.assert_allclose(one[site].gram, stats[site].gram, rtol=1e-4,
                               atol=1e-4 * np.abs(stats[site].gram).max())
    assert set(stats) == {"encoder.layers.0.attention.qkv", UP, DOWN}


def test_statistics_cache_roundtrip(model, calibration, tmp_path):
    a = activations.cached_collect(model, calibration, cache_dir=tmp_path, batch_size=8)
    files = list((tmp_path / "activations").glob("*.npz"))
    assert len(files) == 1
    b = activations.load_stats(files[0])
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k].gram, b[k].gram)
        assert a[k].count == b[k].count


# ---- the registry entry: quantized factors, memo for the speed build ----

@pytest.mark.parametrize("mode", ["native", "simulated"])
def test_quantized_factors_run(model, batch, mode):
    cfg = LowRankConfig(method="plain", ratio=0.5, bits=8)
    assert cfg.name == "lr-plain-p0.50-q8"
    var, info = lr.build(model, cfg, mode=mode)
    layer = dict(var.module.named_modules())[UP]
    assert isinstance(layer, LowRankLinear)
    assert info["layers"][0]["rank"] % 64 == 0
    kind = nn.QuantizedLinear if mode == "native" else nn.Linear
    assert isinstance(layer.up, kind) and isinstance(layer.down, kind)
    assert not any(p.startswith("encoder.layers.") for p, _ in info["quant"]["skipped"])
    out = np.array(var.module.embed(*batch))
    assert np.isfinite(out).all() and out.shape == (3, 384)
    assert info["model_bytes"] < 0.6 * info["reference_bytes"]  # fp32 embeddings stay


def test_speed_build_reuses_factors_without_calibration(model, calibration):
    cfg = LowRankConfig(method="whitened", ratio=0.3)
    v1, i1 = lr.build(model, cfg, calibration=calibration)
    v2, i2 = lr.build(model, cfg, mode="native")  # what the sweep's timing build does
    assert i1["layers"] == i2["layers"]
    assert v1.module is v2.module
    md = lowrank_family.describe(i1)
    assert "| layers.0.attention.query | 384×384 | 57 |" in md and "ideal speed-up" in md


# ---- bad input ----

@pytest.mark.parametrize("make, match", [
    (lambda: LowRankConfig(ratio=0.0), r"ratio=0.0 is outside \(0, 1\]"),
    (lambda: LowRankConfig(ratio=1.5), r"ratio=1.5 is outside \(0, 1\]"),
    (lambda: LowRankConfig(method="tucker"), r"method='tucker' is not known"),
    (lambda: LowRankConfig(rule="vibes"), r"rank rule 'vibes' is not known"),
    (lambda: LowRankConfig(bits=5), r"--lowrank-bits 5 is not supported"),
    (lambda: lowrank_family.ladder(methods=[]), r"no methods given"),
    (lambda: lr.decompose(np.ones((4, 4)), "whitened"), r"no calibration data"),
    (lambda: lr.whitening(np.full((3, 3), np.nan)), r"non-finite"),
    (lambda: lr.whitening(np.zeros((3, 3))), r"singular"),
    (lambda: lr.whitening(np.diag([1.0, -0.5, 1.0])), r"singular: Cholesky failed"),
    (lambda: lr.decompose(np.ones((4, 4)), "plain").factors(5), r"rank 5 is outside \[1, 4\]"),
], ids=["ratio0", "ratio1.5", "method", "rule", "bits", "no-methods", "no-stats", "nan", "zero",
        "negative", "factors-rank"])
def test_bad_input_raises(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_rank_above_min_dim_and_missing_calibration(model):
    with pytest.raises(ValueError, match=r"rank=400 is larger than min\(m, n\) = 384"):
        lr.factorize_module(model.module, LowRankConfig(method="plain", rule="rank", rank=400),
                            paths=[Q])
    with pytest.raises(ValueError, match="no calibration data"):
        lr.build(model, LowRankConfig(method="whitened", ratio=0.77))
    with pytest.raises(ValueError, match="no calibration data"):
        activations.collect(model, None)


def test_ladder_names_encode_parameters():
    names = [c.name for c in lowrank_family.ladder()]
    assert names[:2] == ["lr-whitened-p0.90", "lr-whitened-p0.70"] and "lr-plain-p0.10" in names
    assert len(names) == 10 == len(set(names))
    q = lowrank_family.ladder(methods=["scaled"], ratios=[0.5], alpha=0.25, lowrank_bits=[4, 8],
                  lowrank_group_size=32)
    assert [c.name for c in q] == ["lr-scaled-a0.25-p0.50-q4g32", "lr-scaled-a0.25-p0.50-q8g32"]
    assert [c.name for c in lowrank_family.ladder(rank_rule="energy", energies=[0.99])] == \
           ["lr-whitened-e0.990", "lr-plain-e0.990"]
    assert lowrank_family.run_name(rank_rule="params") == "params"


def test_names_never_round_two_values_together():
    # .2f / .3f used to name 0.5 and 0.505 both p0.50, 0.9995 and 1.0 both e1.000
    assert [c.name for c in lowrank_family.ladder(methods=["plain"], ratios=[0.5, 0.505])] == \
           ["lr-plain-p0.50", "lr-plain-p0.505"]
    assert [c.name for c in lowrank_family.ladder(methods=["plain"], rank_rule="energy",
                                      energies=[0.99, 0.9995, 1.0])] == \
           ["lr-plain-e0.990", "lr-plain-e0.9995", "lr-plain-e1.000"]
    assert [c.name for c in lowrank_family.ladder(methods=["scaled"], ratios=[0.5], alpha=0.125)] == \
           ["lr-scaled-a0.125-p0.50"]


@pytest.mark.parametrize("args, message", [
    (["--ratios", "1.5"], "ratio=1.5 is outside (0, 1]"),
    (["--ratios", "0"], "ratio=0.0 is outside (0, 1]"),
])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    code = main(["sweep", "--family", "lowrank", "--results-dir", str(tmp_path / "r"), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.startswith("variants: error: ")
    assert not (tmp_path / "r").exists()


def test_rank_above_min_dimension_is_refused_before_writing(tmp_path, capsys):
    """Regression: --ranks above min(m, n) used to fail only after the reference was computed."""
    from variants.cli import main

    code = main(["sweep", "--family", "lowrank", "--rank-rule", "rank", "--ranks", "500",
                 "--results-dir", str(tmp_path / "r"), "--n-fit", "60", "--n-calibration", "40",
                 "--n-eval", "40", "--no-progress"])
    assert code == 2
    assert "rank=500 is larger than min(m, n) = 384" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()

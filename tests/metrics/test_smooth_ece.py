"""The smooth ECE (Błasiok & Nakkiran, ICLR 2024) of :mod:`metrics.smooth_ece`: hand-computed
cases, an independent plain-loop implementation (scalar kernel, adaptive quadrature), its
resampled form against a loop over resamples, its Lipschitz bounds, and the ``smece_*`` set
metrics of an evaluation (issue #38: the ``ece-delta`` clause must not jump at bin edges)."""

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from metrics.evaluate import evaluate
from metrics.set_metrics import parts
from metrics.smooth_ece import (reflected_gaussian_kernel, smooth_calibration_error,
                                smooth_calibration_error_resampled)
from runs.selftest import FAULTS, synthetic_outputs

SIGMA = 0.05


def _loop_smece(conf, hit, weight=None, sigma=SIGMA):
    """Independent implementation: scalar reflected kernel with images f ± 2k and -f ± 2k
    (|k| <= 1), the residual summed in a Python loop, |ρ| integrated by adaptive quadrature
    (scipy.integrate.quad)."""
    weight = [1.0] * len(conf) if weight is None else weight

    c = 1 / (sigma * math.sqrt(2 * math.pi))

    def kernel(t, f):
        return sum(c * (math.exp(-0.5 * ((t - f - 2 * k) / sigma) ** 2)
                        + math.exp(-0.5 * ((t + f - 2 * k) / sigma) ** 2)) for k in (-1, 0, 1))

    def rho(t):
        return sum(w * (y - f) * kernel(t, f) for f, y, w in zip(conf, hit, weight)) / sum(weight)

    points = sorted({min(max(f + d, 0.0), 1.0) for f in conf for d in (-2 * sigma, 0, 2 * sigma)})
    value, _ = integrate.quad(lambda t: abs(rho(t)), 0.0, 1.0, points=points, limit=500,
                              epsabs=1e-11, epsrel=1e-10)
    return value


def test_sure_and_always_wrong_is_one():
    """f = 1, y = 0 everywhere: ρ(t) = -K(t, 1), whose integral is the kernel's unit mass."""
    assert smooth_calibration_error(np.ones(7), np.zeros(7)) == pytest.approx(1.0, abs=1e-12)
    assert smooth_calibration_error(np.zeros(3), np.ones(3)) == pytest.approx(1.0, abs=1e-12)


def test_exactly_calibrated_levels_are_zero():
    """At each distinct confidence the hits average to it: every residual sum is 0, so ρ ≡ 0."""
    conf = np.repeat([0.2, 0.5, 0.75, 0.96], [5, 2, 4, 25])
    hit = np.concatenate([[1, 0, 0, 0, 0], [1, 0], [1, 1, 1, 0], [1] * 24 + [0]])
    assert smooth_calibration_error(conf, hit) == pytest.approx(0.0, abs=1e-12)


def test_one_row_is_its_residual():
    assert smooth_calibration_error([0.5], [1.0]) == pytest.approx(0.5, abs=1e-12)
    assert smooth_calibration_error([0.03], [0.0]) == pytest.approx(0.03, abs=1e-12)


def test_two_opposite_residuals_closed_form():
    """f = (0.5, 0.9), y = (1, 0): ρ = (0.5 φ(t - 0.5) - 0.9 φ(t - 0.9)) / 2, the reflected
    images negligible (>= 8σ away where the two cross). ∫|aφ1 - bφ2| = a + b - 2 ∫min(aφ1, bφ2),
    the two densities crossing once at t* = (0.56 - 2σ² ln(b/a)) / 0.8."""
    a, b = 0.5, 0.9
    t_star = (0.56 - 2 * SIGMA ** 2 * math.log(b / a)) / 0.8
    overlap = a * norm.sf((t_star - 0.5) / SIGMA) + b * norm.cdf((t_star - 0.9) / SIGMA)
    expected = (a + b - 2 * overlap) / 2  # 0.6999705...
    assert expected == pytest.approx(0.6999576, abs=1e-7)  # (1.4 - 2 (2.155e-5 + 2.084e-5)) / 2
    assert smooth_calibration_error([0.5, 0.9], [1, 0]) == pytest.approx(expected, abs=2e-7)


def test_calibrated_draws_are_near_zero_and_a_shift_of_0_1_reads_0_1():
    """y ~ Bernoulli(f): the smoothed residual is sampling noise (~sqrt(f(1-f)/(n σ))); drawn at
    f - 0.1 instead, every residual averages -0.1, so smECE = ∫ 0.1 · density = 0.1."""
    rng = np.random.default_rng(3)
    f = rng.uniform(0.1, 1.0, size=40_000)
    calibrated = (rng.random(f.size) < f).astype(float)
    over = (rng.random(f.size) < f - 0.1).astype(float)
    assert smooth_calibration_error(f, calibrated) < 0.006
    assert smooth_calibration_error(f, over) == pytest.approx(0.1, abs=0.006)


def test_matches_a_plain_loop_with_adaptive_quadrature():
    rng = np.random.default_rng(0)
    conf = np.concatenate([rng.uniform(0.3, 1.0, size=12), [0.0, 1.0, 0.01]])
    hit = (rng.random(conf.size) < 0.7).astype(float)
    weight = (rng.random(conf.size) < 0.8).astype(float)
    expected = _loop_smece(conf, hit, weight)
    assert smooth_calibration_error(conf, hit, weight=weight) == pytest.approx(expected, rel=1e-5)
    assert smooth_calibration_error(conf, hit) == pytest.approx(_loop_smece(conf, hit), rel=1e-5)


def test_resamples_equal_one_call_per_resample():
    rng = np.random.default_rng(1)
    conf, hit = rng.uniform(0.4, 1.0, size=50), (rng.random(50) < 0.75).astype(float)
    weight = (rng.random(50) < 0.7).astype(float)
    idx = rng.integers(0, 50, size=(30, 50))
    got = smooth_calibration_error_resampled(conf, hit, idx, weight=weight)
    want = [smooth_calibration_error(conf[i], hit[i], weight=weight[i]) for i in idx]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    # a set with no weighted row is NaN; an empty set is NaN
    none = smooth_calibration_error_resampled(conf, hit, np.flatnonzero(weight == 0)[None, :3],
                                              weight=weight)
    assert np.isnan(none).all()
    assert np.isnan(smooth_calibration_error_resampled(conf, hit, np.zeros((2, 0), int))).all()


@pytest.mark.parametrize("f", [0.0, 0.003, 0.5, 0.97, 1.0])
def test_the_reflected_kernel_keeps_unit_mass(f):
    t = np.linspace(0, 1, 512)
    w = np.full(512, 1 / 511)
    w[[0, -1]] /= 2
    assert (reflected_gaussian_kernel(t, [f]) @ w)[0] == pytest.approx(1.0, abs=1e-12)
    mass, _ = integrate.quad(lambda s: reflected_gaussian_kernel([s], [f])[0, 0], 0, 1,
                             points=[f], epsabs=1e-13)
    assert mass == pytest.approx(1.0, abs=1e-10)


def test_lipschitz_bounds_hold():
    """|Δ smECE| <= (1 + sqrt(2/π)/σ) max|Δf| (16.96 at σ = 0.05) and <= Σ|Δy| / n; the
    derivative bound nearly binds for a residual pair 2σ apart moved together."""
    lip = 1 + math.sqrt(2 / math.pi) / SIGMA
    assert lip == pytest.approx(16.9577, abs=1e-4)
    rng = np.random.default_rng(2)
    conf = rng.uniform(0.5, 1.0, size=200)
    hit = (rng.random(200) < conf).astype(float)
    base = smooth_calibration_error(conf, hit)
    for eta in (1e-3, 1e-6):
        moved = np.clip(conf + rng.choice([-eta, eta], size=200), 0, 1)
        assert abs(smooth_calibration_error(moved, hit) - base) <= lip * eta
    flipped = hit.copy()
    flipped[:3] = 1 - flipped[:3]
    assert abs(smooth_calibration_error(conf, flipped) - base) <= 3 / 200
    # one row moved by η: the bound per row is (1 + sqrt(2/π)/σ) η / n
    single = conf.copy()
    single[7] += 1e-4
    assert abs(smooth_calibration_error(single, hit) - base) <= lip * 1e-4 / 200


@pytest.mark.parametrize("kwargs, match", [
    (dict(confidence=[0.5, 1.2], hit=[1, 0]), r"confidence has values outside \[0, 1\]"),
    (dict(confidence=[0.5, np.nan], hit=[1, 0]), r"confidence has values outside"),
    (dict(confidence=[0.5, 0.6], hit=[1]), r"must be 1-D of the same length"),
    (dict(confidence=[0.5], hit=[1], weight=[-1.0]), r"weight must be"),
    (dict(confidence=[0.5], hit=[1], bandwidth=0.3), r"bandwidth must be in \(0, 0.1\]"),
    (dict(confidence=[0.5], hit=[1], grid_points=1), r"grid_points must be an integer >= 2"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        smooth_calibration_error(**kwargs)


def test_the_set_metrics_are_the_function_on_labeled_rows_and_pair_their_resamples():
    """``smece_*``: top-label confidence against the label on labeled rows (as the ``ece_*`` the
    ``ece-delta`` clause used before), the delta on the same resamples for both models."""
    cal, ref = synthetic_outputs(n=300)
    _, noisy = FAULTS["logit-noise"].apply(cal, ref, np.random.default_rng(0))
    ev = evaluate(ref, noisy, epsilon=0.1)
    known = ev.per_example["label"].to_numpy() >= 0
    values = {}
    for which, probs in (("ref", ev.ref_probs), ("variant", ev.var_probs)):
        p = np.where(ev.option_mask, probs, -1.0)
        pred, conf = p.argmax(axis=1), p.max(axis=1)
        hit = (pred == ev.per_example["label"].to_numpy()).astype(float)
        values[which] = smooth_calibration_error(conf[known], hit[known])
        assert ev.value(f"smece_{which}") == pytest.approx(values[which], rel=1e-12)
    assert ev.value("smece_delta") == pytest.approx(values["variant"] - values["ref"], rel=1e-9)
    assert ev.support("smece_delta") == known.sum()
    # the interval is the percentile of (variant - ref) on each resample of the paired rows
    low, high = ev.ci("smece_delta", n_boot=200, seed=4)
    idx = np.random.default_rng(4).integers(0, len(known), size=(200, len(known)))
    deltas = [smooth_calibration_error(parts(ev, "variant")["conf"][i],
                                       parts(ev, "variant")["label_hit"][i], weight=known[i])
              - smooth_calibration_error(parts(ev, "ref")["conf"][i],
                                         parts(ev, "ref")["label_hit"][i], weight=known[i])
              for i in idx]
    np.testing.assert_allclose((low, high), np.percentile(deltas, [2.5, 97.5]), rtol=1e-10)

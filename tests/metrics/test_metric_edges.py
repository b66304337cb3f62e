"""Metrics at the edges: uncapped NLL, exact KL, honest intervals at 0 and n events,
and temperature fits that say when they ran to a bound."""

import warnings

import numpy as np
import pytest
from scipy.special import softmax
from scipy.stats import beta, entropy
from sklearn.metrics import log_loss

from contracts.checker import check, contract_from_dict
from contracts.report import render_variant_report
from metrics.calibration import nll_from_logits, nll_loss
from metrics.divergence import PROB_FLOOR, kl_divergence, kl_divergence_from_logits
from metrics.evaluate import evaluate
from metrics.intervals import clopper_pearson, clopper_pearson_count
from metrics.temperature_fit import fit_calibration_temperature, fit_temperature, mean_nll


def outputs(logits, labels, *, temperature=1.0, mask=None):
    """DecisionOutputs-shaped dict with float32 probabilities, as finish_outputs writes them."""
    logits = np.asarray(logits, dtype=np.float64)
    n, k = logits.shape
    mask = np.ones((n, k), bool) if mask is None else mask
    t = np.broadcast_to(np.asarray(temperature, dtype=np.float64), (n,))
    probs = softmax(np.where(mask, logits / t[:, None], -np.inf), axis=1)
    return {"ids": np.array([f"e{i}" for i in range(n)]), "task": np.array(["t"] * n),
            "logits": np.where(mask, logits, 0).astype(np.float32), "option_mask": mask,
            "probs": probs.astype(np.float32), "temperature": t.astype(np.float32),
            "expected_score": np.full(n, np.nan, np.float32),
            "action_probs": np.stack([probs[:, 0], 1 - probs[:, 0]], axis=1).astype(np.float32),
            "labels": np.asarray(labels, np.int64)}


# -- NLL: uncapped ------------------------------------------------------------------------------

def test_nll_of_confident_mistakes_is_not_capped():
    logits = np.array([[50.0, 0.0], [50.0, 0.0], [50.0, 0.0]])
    labels = np.array([1, 0, 0])
    mask = np.ones((3, 2), bool)
    tail = np.log1p(np.exp(-50.0))
    hand = np.array([50.0 + tail, tail, tail])  # -log softmax: 50 + log(1 + e^-50), log(1 + e^-50)
    # (log-sum-exp rounds 1 + e^-50 to 1: the 1.9e-22 tail is below float64 resolution)
    np.testing.assert_allclose(nll_from_logits(logits, labels, mask), hand, rtol=1e-15, atol=1e-21)
    assert np.nanmean(nll_from_logits(logits, labels, mask)) == pytest.approx(50 / 3, rel=1e-12)
    # at T = 2 the mistake costs 25 + log1p(e^-25); per-example temperatures are honoured
    t = np.array([2.0, 1.0, 1.0])
    assert nll_from_logits(logits, labels, mask, temperature=t)[0] == pytest.approx(
        25 + np.log1p(np.exp(-25.0)), rel=1e-15)
    # the evaluation's nll_ref (float32 probs saved) gives 16.67, not the old capped 34.54 / 3
    ref = outputs(logits, labels)
    ev = evaluate(ref, ref, epsilon=0.0)
    assert ev.value("nll_ref") == pytest.approx(np.mean(hand), rel=1e-12)
    assert ev.summary["nll_variant"] == pytest.approx(np.mean(hand), rel=1e-12)
    assert ev.value("nll_delta") == 0.0


def test_nll_beyond_float32_underflow_and_probs_path():
    logits = np.array([[200.0, 0.0], [1.0, 0.0]])
    labels = np.array([1, 0])
    ref = outputs(logits, labels)
    assert ref["probs"][0, 1] == 0.0  # e^-200 underflows in float32
    ev = evaluate(ref, ref, epsilon=0.0)
    nll1 = np.log1p(np.exp(-1.0))
    assert ev.value("nll_ref") == pytest.approx((200.0 + nll1) / 2, rel=1e-12)  # exact, finite
    # without logits (probabilities only) the NLL is -log p with no floor: inf for p = 0
    mask = np.ones((2, 2), bool)
    with np.errstate(divide="ignore"):
        assert nll_loss(ref["probs"], labels, mask) == np.inf
    # and equals scikit-learn's log_loss where nothing is clipped
    rng = np.random.default_rng(0)
    z = rng.normal(size=(200, 3)) * 3
    y = rng.integers(0, 3, 200)
    p = softmax(z, axis=1)
    m = np.ones((200, 3), bool)
    assert np.nanmean(nll_from_logits(z, y, m)) == pytest.approx(log_loss(y, p, labels=range(3)), rel=1e-12)
    assert nll_loss(p, y, m) == pytest.approx(log_loss(y, p, labels=range(3)), rel=1e-12)


# -- KL from log-probabilities -----------------------------------------------------------------

def _kl_two_options(a, b):
    """Closed form KL(softmax([0, a]) ‖ softmax([0, b])) with log1p, float64."""
    logp = np.array([-np.log1p(np.exp(a)), a - np.log1p(np.exp(a))])
    logq = np.array([-np.log1p(np.exp(b)), b - np.log1p(np.exp(b))])
    return float(np.sum(np.exp(logp) * (logp - logq)))


@pytest.mark.parametrize("a, b", [(-10.0, -200.0), (-120.0, -100.0), (-100.0, -120.0)])
def test_kl_where_float32_probabilities_underflow(a, b):
    mask = np.ones((1, 2), bool)
    ref_logits, var_logits = np.array([[0.0, a]]), np.array([[0.0, b]])
    exact = _kl_two_options(a, b)
    assert exact > 0
    assert kl_divergence_from_logits(ref_logits, var_logits, mask)[0] == pytest.approx(exact, rel=1e-9)
    ev = evaluate(outputs(ref_logits, [0]), outputs(var_logits, [0]), epsilon=10.0)
    assert ev.per_example["kl"][0] == pytest.approx(exact, rel=1e-9)
    assert ev.detail["kl_reverse"][0] == pytest.approx(_kl_two_options(b, a), rel=1e-9)
    if (a, b) == (-10.0, -200.0):  # the variant's float32 probability is 0: the floor misled
        q = softmax(var_logits, axis=1).astype(np.float32)
        assert q[0, 1] == 0.0
        floored = kl_divergence(softmax(ref_logits, axis=1), q, mask, floor=PROB_FLOOR)[0]
        assert kl_divergence(softmax(ref_logits, axis=1), q, mask)[0] == np.inf  # no floor
        assert floored < exact / 10 and exact == pytest.approx(8.58e-3, rel=1e-3)


def test_kl_from_logits_is_exactly_zero_on_identical_rows_and_matches_scipy():
    rng = np.random.default_rng(1)
    n, k = 50, 5
    mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=n)[:, None]
    z = rng.normal(size=(n, k)) * 30
    t = rng.uniform(0.1, 2.0, n)
    assert np.array_equal(kl_divergence_from_logits(z, z, mask, ref_temperature=t,
                                                    var_temperature=t), np.zeros(n))
    z2 = z + rng.normal(size=(n, k)) * 0.3
    t2 = t * 1.1
    kl = kl_divergence_from_logits(z / 10, z2 / 10, mask, ref_temperature=t, var_temperature=t2)
    p, q = (softmax(np.where(mask, x / 10 / tt[:, None], -np.inf), axis=1) for x, tt in ((z, t), (z2, t2)))
    expected = [entropy(p[i, mask[i]], q[i, mask[i]]) for i in range(n)]
    np.testing.assert_allclose(kl, expected, rtol=1e-9, atol=1e-15)
    ref = outputs(z, np.zeros(n, int), temperature=t, mask=mask)
    ev = evaluate(ref, ref, epsilon=0.0)
    assert ev.summary["kl_max"] == 0.0 and ev.summary["kl_reverse_mean"] == 0.0


# -- intervals of rates and counts --------------------------------------------------------------

def test_clopper_pearson_hand_values():
    assert clopper_pearson(0, 20) == (0.0, pytest.approx(1 - 0.025 ** (1 / 20), rel=1e-9))
    assert 1 - 0.025 ** (1 / 20) == pytest.approx(0.1684, abs=1e-4)
    low, high = clopper_pearson(20, 20)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 20), rel=1e-9)
    low, high = clopper_pearson(7, 20, confidence=0.9)
    assert low == pytest.approx(beta.ppf(0.05, 7, 14), rel=1e-9)
    assert high == pytest.approx(beta.ppf(0.95, 8, 13), rel=1e-9)
    assert clopper_pearson_count(7, 20, confidence=0.9) == (pytest.approx(20 * low), pytest.approx(20 * high))
    assert all(np.isnan(clopper_pearson(0, 0)))
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson(3, 2)


@pytest.mark.parametrize("confidence", [0.95, 0.975])
def test_clopper_pearson_equals_scipy_binomtest_bit_for_bit(confidence):
    """The interval is SciPy's exact binomtest interval computed without importing scipy.stats
    (its own brentq on the same binomial ufuncs): equal to the last bit, so the goldens of
    test_identical_results hold and a SciPy change that moves either shows up here."""
    from scipy.stats import binomtest

    for n in (1, 2, 5, 20, 37, 160, 800):
        for k in sorted({0, 1, 2, n // 3, n // 2, n - 1, n}):
            if 0 <= k <= n:
                ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
                assert clopper_pearson(k, n, confidence=confidence) == (ci.low, ci.high), (k, n)


def _twenty_identical():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(20, 2)) * 3
    ref = outputs(z, (z[:, 1] > z[:, 0]).astype(int))
    return evaluate(ref, ref, epsilon=0.0)


def test_zero_events_get_an_exact_interval_not_zero_width():
    ev = _twenty_identical()
    upper = 1 - 0.025 ** (1 / 20)
    assert ev.value("flip", statistic="rate") == 0.0
    assert ev.ci("flip", statistic="rate") == (0.0, pytest.approx(upper, rel=1e-9))
    assert ev.ci("flip", statistic="count") == (0.0, pytest.approx(20 * upper, rel=1e-9))
    assert ev.ci("agreement") == (pytest.approx(1 - upper, rel=1e-9), 1.0)
    assert ev.interval_method("flip", "rate") == "clopper-pearson"
    assert ev.interval_method("certified_share") == "clopper-pearson"
    assert ev.interval_method("kl", "mean") == "bootstrap-percentile"
    assert ev.interval_method("temperature_refit_log_ratio") is None
    k = int(ev.per_example["certified"].sum())
    assert ev.ci("certified_share") == pytest.approx(clopper_pearson(k, 20), rel=1e-12)


def test_ci_clause_on_zero_flips_in_twenty_is_not_a_pass():
    ev = _twenty_identical()
    contract = contract_from_dict({"name": "c", "clause": [
        {"id": "flip-ci", "metric": "flip", "statistic": "rate", "max": 0.01, "compare": "ci"},
        {"id": "flip-value", "metric": "flip", "statistic": "rate", "max": 0.01},
        {"id": "kl", "metric": "kl", "statistic": "mean", "max": 0.01, "compare": "ci"}]})
    verdict = check(contract, ev, n_bootstrap=200)
    r = {x.id: x for x in verdict.results}
    assert r["flip-ci"].passed is False and r["flip-ci"].compared_value == pytest.approx(0.1684, abs=1e-4)
    assert r["flip-value"].passed is True and r["kl"].passed is True
    assert [r[i].interval for i in ("flip-ci", "flip-value", "kl")] == [
        "clopper-pearson", "clopper-pearson", "bootstrap-percentile"]
    d = verdict.to_dict()["clauses"]
    assert d[0]["interval"] == "clopper-pearson" and d[2]["interval"] == "bootstrap-percentile"
    # the value (0) meets the bound, the interval does not: undecided, not a pass
    assert verdict.failed == [] and verdict.undecided == ["flip-ci"] and not verdict.passed
    assert r["flip-ci"].rows_needed == 368  # 0 of 368: upper bound 0.00998 <= 0.01
    assert r["flip-ci"].status == "undecided: about 348 more rows would decide it"


# -- temperature fits that run to a bound ---------------------------------------------------------

def _ordinary(seed=3, n=2000, k=3, t=0.4):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k))
    y = np.array([rng.choice(k, p=row) for row in softmax(z / t, axis=1)])
    return z, y, np.ones((n, k), bool)


def test_separable_data_run_to_the_lower_bound_in_both_fitters():
    z = np.array([[3.0, 0.0], [0.0, 2.0], [5.0, 1.0], [1.0, 4.0]])
    y = np.array([0, 1, 0, 1])  # every label is the top logit: NLL -> 0 as T -> 0
    m = np.ones_like(z, bool)
    fit = fit_temperature(z, m, y)
    assert (fit.status, fit.temperature) == ("at_bound", 1e-3)
    with pytest.warns(UserWarning, match=r"at bound \(T=0.001\)"):
        assert fit_calibration_temperature(z, m, y).status == "at_bound"


def test_hopeless_and_flat_data_do_not_pass_as_converged():
    z, y, m = _ordinary(n=300)
    worst = np.argmin(z, axis=1)  # labels on the lowest logit: worse than uniform at every T
    fit = fit_temperature(z, m, worst)
    assert (fit.status, fit.temperature) == ("at_bound", 1e3)
    flat = fit_temperature(np.zeros_like(z), m, y)  # constant logits: NLL = log 3 for every T
    assert flat.status == "not_converged" and np.isnan(flat.temperature)
    assert flat.nll == pytest.approx(np.log(3), rel=1e-12) and "flat NLL" in flat.reason
    with pytest.warns(UserWarning, match="did not converge"):
        res = fit_calibration_temperature(np.zeros_like(z), m, y)
    assert res.status == "not_converged" and res.temperature == 1.0  # usable: no scaling
    with pytest.warns(UserWarning, match=r"at bound \(T=1000\)"):
        assert fit_calibration_temperature(z, m, worst).temperature == 1e3


def test_ordinary_fit_converges_to_the_brute_force_minimum():
    z, y, m = _ordinary()
    fit = fit_temperature(z, m, y)
    assert fit.status == "converged" and fit.reason == ""
    coarse = np.linspace(np.log(0.01), np.log(100), 2001)
    best = coarse[np.argmin([mean_nll(g, z, m, y) for g in coarse])]
    fine = np.linspace(best - 0.01, best + 0.01, 2001)
    t_grid = np.exp(fine[np.argmin([mean_nll(g, z, m, y) for g in fine])])
    assert fit.temperature == pytest.approx(t_grid, rel=1e-3)
    assert fit.temperature == pytest.approx(0.4, rel=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a converged fit does not warn
        assert fit_calibration_temperature(z, m, y).temperature == pytest.approx(fit.temperature, rel=1e-6)


def test_refit_at_a_bound_skips_the_clause_with_its_reason():
    rng = np.random.default_rng(4)
    z, y, _ = _ordinary(n=400, k=3)
    z2 = rng.normal(size=(100, 3))
    y2 = np.argmin(z2[:, :2], axis=1)  # the K=2 bucket: labels on the lower logit
    logits = np.vstack([z, z2])
    mask = np.vstack([np.ones((400, 3), bool), np.tile([True, True, False], (100, 1))])
    ref = outputs(logits, np.concatenate([y, y2]), mask=mask)
    ev = evaluate(ref, ref, epsilon=0.0)
    assert np.isnan(ev.value("temperature_refit_log_ratio"))
    reason = "temperature refit at bound (T=1000) on bucket K=2 (reference, variant)"
    assert ev.skip_reason("temperature_refit_log_ratio") == reason
    assert ev.value("temperature_refit_log_ratio", "options:3") == 0.0  # the sound bucket alone
    contract = contract_from_dict({"name": "c", "clause": [
        {"id": "temperature-refit", "metric": "temperature_refit_log_ratio", "max": 0.03},
        {"id": "no-examples", "metric": "flip", "stratum": "task:none", "statistic": "rate",
         "max": 0.1}]})
    verdict = check(contract, ev, n_bootstrap=50)
    r = verdict.results[0]
    assert r.passed is None and r.reason == reason and r.status == f"skipped: {reason}"
    assert verdict.results[1].status == "no examples" and verdict.results[1].reason == ""
    assert verdict.passed and verdict.untested == ["temperature-refit", "no-examples"]
    assert verdict.to_dict()["clauses"][0]["status"] == f"skipped: {reason}"
    text = render_variant_report("v", ev, verdict, contract, {"alpha": 0.05}, n_boot=50)
    assert f"skipped: {reason}" in text and "clopper-pearson" in text
    tt = ev.temperature_table()
    assert tt.set_index("n_options").loc[2, "refit_status_ref"] == "at_bound"
    assert tt.set_index("n_options").loc[3, "refit_status_variant"] == "converged"

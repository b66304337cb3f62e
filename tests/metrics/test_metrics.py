"""Tests of metrics/: hand-computed values, independent implementations and invariants."""

import numpy as np
import pandas as pd
import pytest
from scipy.special import rel_entr
from scipy.stats import entropy
from sklearn.metrics import accuracy_score

from metrics import (
    abs_score_error,
    accuracy,
    action_agreement,
    action_max_abs_diff,
    agreement,
    certified,
    epsilon_max,
    evaluate,
    expected_calibration_error,
    flip,
    kl_divergence,
    latency_summary,
    max_abs_logit_diff,
    negative_flip,
    paired_speedup,
    positive_flip,
    top1,
    top2_margin,
)
from metrics.evaluate import METRIC_STATISTICS, SET_METRICS
from metrics.divergence import PROB_FLOOR

# --- a hand-checked 4-example case -------------------------------------------------------------
# Row 3 has one padded option (index 2) carrying a huge logit that must be ignored.
MASK = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=bool)
REF_LOGITS = np.array([[2.0, 1.0, 0.0],    # pred 0, margin 1.0
                       [0.0, 3.0, 0.5],    # pred 1, margin 2.5
                       [1.0, 1.5, 0.2],    # pred 1, margin 0.5
                       [0.5, 0.0, 1e9]])   # pred 0, margin 0.5 (pad ignored)
VAR_LOGITS = np.array([[1.0, 2.0, 0.0],    # pred 1: flip, |Δ| max = 1.0
                       [3.5, 3.0, 0.5],    # pred 0: flip, |Δ| max = 3.5
                       [1.0, 2.0, 0.2],    # pred 1: agree, |Δ| max = 0.5
                       [0.0, 0.5, -1e9]])  # pred 1: flip, |Δ| max = 0.5 (pad ignored)
LABELS = np.array([0, 0, 1, -1])
# ref correct: [T, F, T, ?]; var correct: [F, T, T, ?]
# negative flip (ref right, var wrong): row 0; positive flip (ref wrong, var right): row 1.


def test_top1_flips_hand_computed():
    ref_pred, var_pred = top1(REF_LOGITS, MASK), top1(VAR_LOGITS, MASK)
    np.testing.assert_array_equal(ref_pred, [0, 1, 1, 0])
    np.testing.assert_array_equal(var_pred, [1, 0, 1, 1])
    np.testing.assert_array_equal(agreement(ref_pred, var_pred), [False, False, True, False])
    np.testing.assert_array_equal(flip(ref_pred, var_pred), [True, True, False, True])
    np.testing.assert_array_equal(negative_flip(ref_pred, var_pred, LABELS), [True, False, False, False])
    np.testing.assert_array_equal(positive_flip(ref_pred, var_pred, LABELS), [False, True, False, False])
    assert accuracy(ref_pred, LABELS) == pytest.approx(2 / 3)
    assert accuracy(var_pred, LABELS) == pytest.approx(2 / 3)


def test_margins_and_logit_diff_hand_computed():
    np.testing.assert_allclose(top2_margin(REF_LOGITS, MASK), [1.0, 2.5, 0.5, 0.5])
    np.testing.assert_allclose(max_abs_logit_diff(REF_LOGITS, VAR_LOGITS, MASK), [1.0, 3.5, 0.5, 0.5])
    # ε = 0.2: margin > 0.4 everywhere -> all certified; ε = 0.5: only margins > 1.0
    np.testing.assert_array_equal(certified(top2_margin(REF_LOGITS, MASK), 0.5), [False, True, False, False])


def test_top2_margin_single_option_is_inf_and_always_certified():
    mask = np.array([[True, False], [True, True]])
    margin = top2_margin([[4.0, 100.0], [1.0, 1.0]], mask)
    assert margin[0] == np.inf and margin[1] == 0.0
    np.testing.assert_array_equal(certified(margin, 1e6), [True, False])
    assert top2_margin([[3.0], [1.0]], np.ones((2, 1), bool)).tolist() == [np.inf, np.inf]


def test_certificate_is_strict_at_two_epsilon():
    np.testing.assert_array_equal(certified([1.0, 1.0 + 1e-12, 0.0], 0.5), [False, True, False])


def test_kl_hand_computed():
    # KL([.5,.5] || [.25,.75]) = .5 ln(.5/.25) + .5 ln(.5/.75) = .5 ln(4/3) = 0.1438410362
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = np.array([[0.25, 0.75, 0.7], [0.2, 0.3, 0.5]])  # 0.7 is a padded entry: ignored
    mask = np.array([[True, True, False], [True, True, True]])
    np.testing.assert_allclose(kl_divergence(p, q, mask), [0.5 * np.log(4 / 3), 0.0], atol=1e-12)
    assert kl_divergence(p, q, mask)[1] == 0.0


def test_kl_matches_scipy_and_is_nonnegative():
    rng = np.random.default_rng(0)
    n, k = 200, 6
    mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=n)[:, None]
    p = np.where(mask, rng.dirichlet(np.ones(k), size=n), 0.0)
    p /= p.sum(axis=1, keepdims=True)
    q = np.where(mask, rng.dirichlet(np.ones(k) * 0.3, size=n), 0.0)
    q /= q.sum(axis=1, keepdims=True)
    q = q.astype(np.float32)  # realistic float32 outputs (sum to 1 only to ~1e-7)
    kl = kl_divergence(p, q, mask)
    expected = [entropy(p[i, mask[i]], q[i, mask[i]].astype(np.float64)) for i in range(n)]
    np.testing.assert_allclose(kl, expected, rtol=1e-9, atol=1e-12)
    q64 = q.astype(np.float64)
    by_rel_entr = [rel_entr(p[i, mask[i]], q64[i, mask[i]] / q64[i, mask[i]].sum()).sum() for i in range(n)]
    np.testing.assert_allclose(kl, by_rel_entr, rtol=1e-9, atol=1e-12)
    assert np.all(kl >= 0)
    np.testing.assert_array_equal(kl_divergence(p, p, mask), 0.0)


def test_kl_zero_variant_probability_is_finite_via_floor():
    """With the named floor, a variant rounding a reference-probable option to 0 gives a large
    finite KL, not inf (tests/metrics/test_kl_refuses.py: inf without it)."""
    p = np.array([[0.5, 0.5]])
    q = np.array([[1.0, 0.0]])
    kl = kl_divergence(p, q, np.ones((1, 2), bool), floor=PROB_FLOOR)
    # q -> [1, 1e-12] renormalised; KL = .5 ln(.5 (1+1e-12)) + .5 ln(.5 (1+1e-12) / 1e-12)
    expected = 0.5 * np.log(0.5) + 0.5 * np.log(0.5 / 1e-12)
    assert np.isfinite(kl[0]) and kl[0] == pytest.approx(expected, rel=1e-9)
    # zero reference mass where the variant has mass costs nothing: 0 ln 0 = 0
    assert kl_divergence(q, q, np.ones((1, 2), bool))[0] == 0.0


def _brute_force_ece(probs, labels, mask, n_bins):
    """Guo et al. (2017) Eq. 3 written as a plain loop over examples and bins."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    conf, hit = [], []
    for i in range(len(labels)):
        if labels[i] < 0:
            continue
        valid = np.flatnonzero(mask[i])
        best = valid[np.argmax(probs[i, valid])]
        conf.append(probs[i, best])
        hit.append(float(best == labels[i]))
    conf, hit = np.array(conf), np.array(hit)
    total = 0.0
    for m in range(n_bins):
        lo, hi = edges[m], edges[m + 1]
        in_bin = [(c > lo or (m == 0 and c == 0.0)) and c <= hi for c in conf]
        in_bin = np.array(in_bin)
        if in_bin.any():
            total += in_bin.sum() / len(conf) * abs(hit[in_bin].mean() - conf[in_bin].mean())
    return total


def test_ece_hand_computed():
    # 5 bins of width 0.2. Row 0: conf .9 (its padded 0.99 is ignored), correct -> bin (.8, 1]:
    # |1 - .9| = .1, weight 1/3. Rows 1, 2: conf .7 (wrong), .75 (right) -> bin (.6, .8]: acc .5,
    # conf .725, gap .225, weight 2/3. Rows 3, 4: unlabeled, ignored.
    # ECE = .1/3 + 2/3 * .225 = 0.18333...
    probs = np.array([[0.9, 0.1, 0.99], [0.3, 0.7, 0.0], [0.75, 0.25, 0.0], [0.5, 0.5, 0.0],
                      [0.6, 0.4, 0.0]])
    mask = np.array([[1, 1, 0]] * 5, dtype=bool)
    labels = np.array([0, 0, 0, -1, -1])
    assert expected_calibration_error(probs, labels, mask, n_bins=5) == pytest.approx(0.1 / 3 + 0.15)
    assert np.isnan(expected_calibration_error(probs, np.full(5, -1), mask))


def test_ece_matches_brute_force():
    rng = np.random.default_rng(1)
    n, k = 400, 5
    mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=n)[:, None]
    logits = rng.normal(scale=2.0, size=(n, k))
    z = np.where(mask, logits, -np.inf)
    probs = np.exp(z - z.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = np.array([rng.integers(0, m) for m in mask.sum(axis=1)])
    labels[rng.random(n) < 0.1] = -1
    for n_bins in (1, 10, 15):
        got = expected_calibration_error(probs, labels, mask, n_bins=n_bins)
        assert got == pytest.approx(_brute_force_ece(probs, labels, mask, n_bins), abs=1e-12)
    # confidences exactly on bin edges (0.2, 0.4, 0.6, 0.8, 1.0) land where the loop puts them
    edge_probs = np.array([[0.2, 0.2, 0.2, 0.2, 0.2], [0.6, 0.4, 0, 0, 0], [1.0, 0, 0, 0, 0]])
    edge_labels = np.array([0, 1, 0])
    full = np.ones((3, 5), bool)
    assert expected_calibration_error(edge_probs, edge_labels, full, n_bins=5) == pytest.approx(
        _brute_force_ece(edge_probs, edge_labels, full, 5), abs=1e-12)


def test_accuracy_matches_sklearn_on_labeled_rows():
    rng = np.random.default_rng(2)
    pred = rng.integers(0, 4, size=300)
    labels = rng.integers(-1, 4, size=300)
    known = labels >= 0
    assert accuracy(pred, labels) == pytest.approx(accuracy_score(labels[known], pred[known]))
    assert np.isnan(accuracy(pred, np.full(300, -1)))


def test_margin_certificate_property():
    """If every valid |Δlogit| <= ε, no example with reference margin > 2ε can flip (seeded loop)."""
    rng = np.random.default_rng(3)
    n_certified = n_uncertified_flips = 0
    for _ in range(100):
        n, k = 300, int(rng.integers(1, 7))
        mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=n)[:, None]
        eps = float(rng.uniform(0.01, 1.0))
        ref = rng.normal(scale=2.0, size=(n, k)).astype(np.float32)
        # plant examples just above and at the 2ε boundary
        edge = rng.random(n) < 0.3
        ref[edge, 1 % k] = ref[edge, 0] - np.float32(2 * eps) * rng.uniform(0.999, 1.001, size=edge.sum()).astype(np.float32)
        delta = rng.uniform(-eps, eps, size=(n, k))
        delta[edge, 0] = -eps  # push the winner down and the runner-up up by the full ε
        delta[edge, 1 % k] = eps
        var = (ref + delta).astype(np.float32)
        var = np.where(mask, var, np.float32(1e9))  # padded entries must not matter
        observed_eps = epsilon_max(max_abs_logit_diff(ref, var, mask))
        assert observed_eps <= eps * (1 + 1e-6) + 1e-6
        cert = certified(top2_margin(ref, mask), observed_eps)
        flipped = flip(top1(ref, mask), top1(var, mask))
        assert not np.any(cert & flipped)
        n_certified += cert.sum()
        n_uncertified_flips += (~cert & flipped).sum()
    assert n_certified > 1000 and n_uncertified_flips > 100  # the property was really exercised


def test_padded_option_with_huge_value_changes_nothing():
    rng = np.random.default_rng(4)
    n, k = 50, 4
    mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=n)[:, None]
    ref = np.where(mask, rng.normal(size=(n, k)), 0.0)
    var = np.where(mask, ref + rng.normal(scale=0.1, size=(n, k)), 0.0)
    huge_ref, huge_var = np.where(mask, ref, 1e30), np.where(mask, var, -1e30)
    p = ref_probs = _softmax(ref, mask)
    q = _softmax(var, mask)
    labels = rng.integers(0, 1, size=n)
    for f in (top1, top2_margin):
        np.testing.assert_array_equal(f(ref, mask), f(huge_ref, mask))
    np.testing.assert_array_equal(max_abs_logit_diff(ref, var, mask), max_abs_logit_diff(huge_ref, huge_var, mask))
    q_pad = np.where(mask, q, 1.0)
    np.testing.assert_array_equal(kl_divergence(p, q, mask), kl_divergence(p, q_pad, mask))
    assert expected_calibration_error(ref_probs, labels, mask) == expected_calibration_error(
        np.where(mask, ref_probs, 1.0), labels, mask)


def test_score_and_action_drift():
    np.testing.assert_allclose(abs_score_error([0.5, np.nan, 1.0], [0.25, np.nan, 1.5]), [0.25, np.nan, 0.5])
    ref_a = np.array([[0.7, 0.3], [0.4, 0.6], [0.0, 0.0]])
    var_a = np.array([[0.6, 0.4], [0.55, 0.45], [0.0, 0.0]])
    np.testing.assert_allclose(action_max_abs_diff(ref_a, var_a), [0.1, 0.15, 0.0])
    np.testing.assert_array_equal(action_agreement(ref_a, var_a), [True, False, True])
    assert np.isnan(action_max_abs_diff(np.zeros((2, 0)), np.zeros((2, 0)))).all()
    assert action_agreement(np.zeros((2, 0)), np.zeros((2, 0))).all()


def test_latency_summary_values():
    s = latency_summary([1.0, 2.0, 3.0, 4.0, 10.0])
    # linear percentile: p95 at position 0.95 * 4 = 3.8 -> 4 + 0.8 * (10 - 4) = 8.8
    assert s == pytest.approx({"p50_ms": 3.0, "p95_ms": 8.8, "mean_ms": 4.0,
                               "sem_ms": np.std([1, 2, 3, 4, 10], ddof=1) / np.sqrt(5),
                               "min_ms": 1.0, "max_ms": 10.0, "n": 5})
    assert np.isnan(latency_summary([2.0])["sem_ms"])


def test_paired_speedup_values_and_seeded_ci():
    ref = np.array([2.0, 4.0, 6.0, 3.0, 5.0])
    var = np.array([1.0, 2.0, 2.0, 1.5, 2.5])  # ratios 2, 2, 3, 2, 2
    s = paired_speedup(ref, var)
    assert s["speedup_median"] == 2.0 and s["n_rounds"] == 5 and s["variant_wins"] == 5
    assert 2.0 <= s["speedup_ci_low"] <= s["speedup_median"] <= s["speedup_ci_high"] <= 3.0
    assert paired_speedup(ref, var) == s  # seeded: reproducible
    const = paired_speedup([3.0] * 9, [1.5] * 9)
    assert const["speedup_ci_low"] == const["speedup_ci_high"] == 2.0
    slower = paired_speedup([1.0, 1.0, 1.0], [2.0, 2.0, 4.0])
    assert slower["speedup_median"] == 0.5 and slower["variant_wins"] == 0


@pytest.mark.parametrize("call, match", [
    (lambda: top1([[1.0, 2.0]], [[False, False]]), "no valid option"),
    (lambda: top1([[1.0, 2.0]], [[1, 0]]), "must be a bool array"),
    (lambda: max_abs_logit_diff(np.zeros((2, 3)), np.zeros((2, 2)), np.ones((2, 3), bool)), "same shape"),
    (lambda: kl_divergence([[0.5, 0.5]], [[np.nan, 1.0]], [[True, True]]), "NaN"),
    (lambda: kl_divergence([[1.5, -0.5]], [[0.5, 0.5]], [[True, True]]), "negative value"),
    (lambda: expected_calibration_error([[0.5, 0.5]], [0], [[True, True]], n_bins=0), "n_bins"),
    (lambda: negative_flip([0, 1], [0, 1], [0.0, 1.0]), "integers"),
    (lambda: agreement([0, 1], [0]), "length"),
    (lambda: epsilon_max([]), "non-empty"),
    (lambda: epsilon_max([0.1, np.nan]), "NaN"),
    (lambda: certified([1.0], -0.1), "epsilon"),
    (lambda: latency_summary([]), "non-empty"),
    (lambda: paired_speedup([1.0, 2.0], [1.0]), "alternated round"),
    (lambda: paired_speedup([1.0], [0.0]), "> 0"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- evaluate ----------------------------------------------------------------------------------

def _softmax(logits, mask, temperature=1.0):
    z = np.where(mask, logits / np.reshape(temperature, (-1, 1)), -np.inf)
    e = np.where(mask, np.exp(z - z.max(axis=1, keepdims=True)), 0.0)
    return e / e.sum(axis=1, keepdims=True)


def make_outputs(logits, mask, labels, *, temperature=1.0, scores=None, tasks=None):
    """A DecisionOutputs-shaped dict (2 actions: option 0 -> action 0, others -> action 1)."""
    n = len(labels)
    probs = _softmax(logits, mask, temperature).astype(np.float32)
    scores = np.tile(np.linspace(0.0, 1.0, mask.shape[1]), (n, 1)) if scores is None else scores
    expected = np.where(np.isnan(scores).all(axis=1), np.nan, np.nansum(probs * scores, axis=1))
    actions = np.stack([probs[:, 0], probs[:, 1:].sum(axis=1)], axis=1)
    return {
        "ids": np.array([f"ex{i}" for i in range(n)]),
        "task": np.array(tasks if tasks is not None else ["t"] * n),
        "logits": np.where(mask, logits, 0.0).astype(np.float32),
        "option_mask": mask,
        "temperature": np.full(n, temperature, np.float32),
        "probs": probs,
        "expected_score": expected.astype(np.float32),
        "action_probs": actions.astype(np.float32),
        "labels": np.asarray(labels, np.int64),
    }


def test_evaluate_hand_case():
    ref = make_outputs(REF_LOGITS, MASK, LABELS, tasks=["a", "a", "b", "b"])
    var = make_outputs(VAR_LOGITS, MASK, LABELS, tasks=["a", "a", "b", "b"])
    ev = evaluate(ref, var, epsilon=0.5, near_tie_margin=1.0)
    df = ev.per_example
    assert list(df.columns) == [
        "id", "task", "n_options", "label", "ref_pred", "var_pred", "agreement", "flip",
        "negative_flip", "positive_flip", "ref_margin", "max_abs_logit_diff", "kl",
        "abs_score_error", "action_max_abs_diff", "action_agreement", "ref_correct",
        "var_correct", "near_tie", "certified"]
    assert df["n_options"].tolist() == [3, 3, 3, 2]
    assert df["negative_flip"].tolist() == [True, False, False, pd.NA]
    assert df["near_tie"].tolist() == [False, False, True, True]  # margins 1.0, 2.5, 0.5, 0.5
    assert df["certified"].tolist() == [False, True, False, False]  # margin > 1.0
    s = ev.summary
    assert s["n_examples"] == 4 and s["agreement"] == 0.25 and s["flip_rate"] == 0.75
    assert s["negative_flips"] == 1 and s["positive_flips"] == 1
    assert s["certified_flips"] == 1 and s["certified_flip_ids"] == ["ex1"]  # 3.5 > ε: certificate broken
    assert s["max_abs_logit_diff_max"] == pytest.approx(3.5)
    assert s["n_near_tie"] == 2 and s["near_tie_flip_rate"] == 0.5
    assert s["certified_share"] == 0.25 and s["epsilon"] == 0.5
    assert s["ece_delta"] == pytest.approx(s["ece_variant"] - s["ece_ref"])
    # strata and statistics
    assert ev.value("negative_flip", statistic="rate") == pytest.approx(1 / 3)  # over labeled rows
    assert ev.value("flip", "certified", "count") == 1.0
    assert ev.value("flip", "uncertified", "rate") == pytest.approx(2 / 3)
    assert ev.value("agreement", "task:b", "rate") == 0.5
    assert ev.value("max_abs_logit_diff", "task:a", "max") == pytest.approx(3.5)
    assert ev.value("max_abs_logit_diff", "all", "p50") == pytest.approx(0.75)  # of [1, 3.5, .5, .5]
    assert ev.value("accuracy_ref", "task:a") == 0.5 and ev.value("accuracy_drop", "task:b") == 0.0
    assert np.isnan(ev.value("accuracy_ref", "task:nosuch"))
    assert ev.support("negative_flip", "all") == 3 and ev.support("accuracy_ref", "task:b") == 1
    kl = kl_divergence(ref["probs"], var["probs"], MASK)
    assert ev.value("kl", statistic="p95") == pytest.approx(np.percentile(kl, 95))


def test_evaluate_identical_variant_is_perfect_and_accepts_npz(tmp_path):
    rng = np.random.default_rng(5)
    n, k = 60, 4
    mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=n)[:, None]
    labels = np.array([rng.integers(0, m) for m in mask.sum(axis=1)])
    ref = make_outputs(rng.normal(size=(n, k)), mask, labels, temperature=0.1)
    np.savez(tmp_path / "ref.npz", **ref)
    with np.load(tmp_path / "ref.npz") as z:
        ev = evaluate(z, ref, epsilon=0.0)
    s = ev.summary
    assert s["agreement"] == 1.0 and s["kl_max"] == 0.0 and s["ece_delta"] == 0.0
    assert s["accuracy_ref"] == s["accuracy_variant"] and s["certified_flips"] == 0
    assert s["score_abs_err_max"] == 0.0 and s["action_agreement"] == 1.0
    for metric, stats in METRIC_STATISTICS.items():
        for stat in stats:
            value = ev.value(metric, "all", stat)
            if metric == "temperature_refit_log_ratio":
                # random labels: the 15-row K=2 bucket is no better than uniform, so both refits
                # run to T = 1000; their ratio (1) is no estimate, the value is NaN with a reason
                assert np.isnan(value) and ev.skip_reason(metric) == (
                    "temperature refit at bound (T=1000) on bucket K=2 (reference, variant)")
                continue
            assert not np.isnan(value), (metric, stat, value)  # ref_margin may be +inf (K_i = 1)
    assert set(SET_METRICS) <= set(METRIC_STATISTICS)
    single = ev.per_example["n_options"] == 1
    assert single.sum() > 0 and np.isinf(ev.per_example.loc[single, "ref_margin"]).all()
    margins = ev.per_example["ref_margin"].to_numpy()
    for stat, q in (("p50", 50), ("p95", 95), ("p99", 99)):
        with np.errstate(invalid="ignore"):
            expected = np.percentile(margins, q)  # NaN between two infs: ours gives inf
        if np.isnan(expected):
            assert ev.value("ref_margin", statistic=stat) == np.inf
        else:
            assert ev.value("ref_margin", statistic=stat) == pytest.approx(expected, rel=1e-12)


def test_evaluate_rejects_misaligned_outputs():
    ref = make_outputs(REF_LOGITS, MASK, LABELS)
    var = dict(make_outputs(VAR_LOGITS, MASK, LABELS), ids=np.array(["ex0", "ex2", "ex1", "ex3"]))
    with pytest.raises(ValueError, match="ids differ at 2 row"):
        evaluate(ref, var, epsilon=0.1)
    with pytest.raises(ValueError, match="no field 'probs'"):
        evaluate(ref, {k: v for k, v in ref.items() if k != "probs"}, epsilon=0.1)
    with pytest.raises(ValueError, match="epsilon"):
        evaluate(ref, ref, epsilon=-1.0)
    with pytest.raises(ValueError, match="unknown stratum"):
        evaluate(ref, ref, epsilon=0.1).value("flip", "near-ties", "rate")
    with pytest.raises(ValueError, match="not allowed for metric 'kl'"):
        evaluate(ref, ref, epsilon=0.1).value("kl", "all", "rate")


def test_metrics_package_imports_neither_mlx_nor_variants():
    import subprocess
    import sys

    code = ("import sys, metrics, contracts; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'variants')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_evaluate_accepts_decision_outputs_objects():
    """The real producer's dataclass works as input (attribute access, float32 fields)."""
    from runs.outputs import finish_outputs

    rng = np.random.default_rng(6)
    n, k = 30, 3
    mask = np.arange(k)[None, :] < rng.integers(1, k + 1, size=n)[:, None]
    action_map = np.zeros((n, k, 2))
    action_map[:, 0, 0] = 1.0
    action_map[:, 1:, 1] = mask[:, 1:]
    scores = np.where(np.arange(n)[:, None] < 10, np.nan, np.tile([0.0, 0.5, 1.0], (n, 1)))

    def outputs(logits):
        return finish_outputs(logits, mask, np.full(n, 0.1), scores, action_map,
                              ids=[f"e{i}" for i in range(n)], task=["t"] * n,
                              labels=np.zeros(n, np.int64), human_dist=np.full((n, k), np.nan))

    logits = rng.normal(size=(n, k))
    ref, var = outputs(logits), outputs(logits + rng.uniform(-0.01, 0.01, size=(n, k)))
    ev = evaluate(ref, var, epsilon=0.01)
    assert ev.per_example["abs_score_error"].isna().sum() == 10  # tasks without scores
    assert ev.summary["max_abs_logit_diff_max"] <= 0.01 + 1e-6
    assert ev.summary["certified_flips"] == 0
    assert ev.support("abs_score_error") == 20

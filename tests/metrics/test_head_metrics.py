"""Metrics of multi-label and regression heads (metrics.multilabel, metrics.regression) on tiny
outputs whose values are worked out by hand here (flips, errors, ranks), with scipy's
spearmanr as the independent check of the rank correlation and its bootstrap resamples."""

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from metrics.evaluate import evaluate
from metrics.regression import spearman_rows


def _outputs(logits, ids=None):
    """The DecisionOutputs fields of raw ``logits`` (N, K): unlabelled rows, every option
    offered, softmax probabilities at T = 1 (what the pipeline stores beside the logits)."""
    z = np.asarray(logits, np.float64)
    n, k = z.shape
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return {"ids": np.array(ids or [f"r{i}" for i in range(n)]), "task": np.array(["t"] * n),
            "logits": z.astype(np.float32), "option_mask": np.ones((n, k), bool),
            "probs": p.astype(np.float32), "expected_score": np.full(n, np.nan, np.float32),
            "action_probs": p.astype(np.float32), "labels": np.full(n, -1, np.int64),
            "temperature": np.ones(n, np.float32)}


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


# --- multi-label ------------------------------------------------------------------------------
REF_ML = [[2.0, -1.0], [0.5, 0.2], [-3.0, 1.0], [0.0, -0.5]]
VAR_ML = [[1.0, -1.0], [-0.5, 0.3], [-3.0, -1.0], [0.0, -0.5]]


@pytest.fixture(scope="module")
def ml():
    return evaluate(_outputs(REF_ML), _outputs(VAR_ML), epsilon=0.1, n_bins=1)


def test_label_flips_at_the_half_threshold(ml):
    # decisions (z >= 0): ref [[1,0],[1,1],[0,1],[1,0]], var [[1,0],[0,1],[0,0],[1,0]]:
    # row 1 flips label 0, row 2 flips label 1; z = 0 is "yes" on both sides (p = 0.5)
    assert ml.detail["label_flip"].tolist() == [False, True, True, False]
    assert ml.value("label_flip", statistic="rate") == 0.5
    assert ml.value("label_flip", statistic="count") == 2
    assert ml.value("label_flip_rate_max") == 0.25  # one flip in 4 rows, on each label


def test_label_probability_drift(ml):
    row0 = _sig(2.0) - _sig(1.0)  # label 1 unchanged
    row1 = max(_sig(0.5) - _sig(-0.5), _sig(0.3) - _sig(0.2))
    row2 = _sig(1.0) - _sig(-1.0)
    assert ml.detail["label_prob_max_abs_diff"].to_numpy() == pytest.approx(
        [row0, row1, row2, 0.0], abs=1e-7)
    mean1 = ((_sig(0.5) - _sig(-0.5)) + (_sig(0.3) - _sig(0.2))) / 2
    assert ml.detail["label_prob_mean_abs_diff"].to_numpy() == pytest.approx(
        [row0 / 2, mean1, row2 / 2, 0.0], abs=1e-7)
    assert ml.value("label_prob_mean_abs_diff", statistic="max") == pytest.approx(row2 / 2,
                                                                                  abs=1e-7)
    assert ml.value("label_prob_max_abs_diff", statistic="max") == pytest.approx(row2, abs=1e-7)


def test_label_calibration_against_the_reference_decisions(ml):
    ref, var = np.array(REF_ML), np.array(VAR_ML)
    y = (ref >= 0).astype(float)
    brier, ece = [], []
    for k in range(2):
        p = [_sig(x) for x in ref[:, k]]
        q = [_sig(x) for x in var[:, k]]
        brier.append(sum((qi - yi) ** 2 - (pi - yi) ** 2 for pi, qi, yi in zip(p, q, y[:, k])) / 4)
        # one bin: ECE = |sum (y - p)| / n
        ece.append(abs(sum(y[:, k]) - sum(q)) / 4 - abs(sum(y[:, k]) - sum(p)) / 4)
    assert ml.value("label_brier_delta") == pytest.approx(max(brier), abs=1e-7)
    assert ml.value("label_ece_delta") == pytest.approx(max(ece), abs=1e-7)
    assert max(brier) > 0  # the flips moved probabilities across the targets: worse


def test_identical_multi_label_outputs_change_nothing():
    ev = evaluate(_outputs(REF_ML), _outputs(REF_ML), epsilon=0.1)
    assert ev.value("label_flip", statistic="count") == 0
    for m in ("label_flip_rate_max", "label_brier_delta", "label_ece_delta"):
        assert ev.value(m) == 0.0, m
    assert ev.value("label_prob_max_abs_diff", statistic="max") == 0.0


# --- regression -------------------------------------------------------------------------------
REF_V = [1.0, 2.0, 3.0, 4.0, 5.0]
VAR_V = [1.1, 2.0, 3.8, 3.5, 5.0]


@pytest.fixture(scope="module")
def reg():
    return evaluate(_outputs(np.array(REF_V)[:, None]), _outputs(np.array(VAR_V)[:, None]),
                    epsilon=0.1, value_tolerance=0.1)


def test_absolute_and_relative_error(reg):
    err = [0.1, 0.0, 0.8, 0.5, 0.0]
    assert reg.detail["value_abs_error"].to_numpy() == pytest.approx(err, abs=1e-6)
    assert reg.value("value_abs_error", statistic="max") == pytest.approx(0.8, abs=1e-6)
    # p95 of [0, 0, .1, .5, .8]: position 3.8 -> .5 + .8 x (.8 - .5)
    assert reg.value("value_abs_error", statistic="p95") == pytest.approx(0.74, abs=1e-6)
    spread = math.sqrt(2.0)  # std of 1..5, ddof 0
    assert reg.detail["value_rel_error"].to_numpy() == pytest.approx(
        [e / spread for e in err], abs=1e-6)


def test_tolerance_is_in_units_of_the_reference_spread(reg):
    # |Δ| <= 0.1 x sqrt(2) = 0.141: rows 0, 1, 4
    assert reg.detail["within_tolerance"].tolist() == [True, True, False, False, True]
    assert reg.value("within_tolerance", statistic="rate") == pytest.approx(0.6)
    wide = evaluate(_outputs(np.array(REF_V)[:, None]), _outputs(np.array(VAR_V)[:, None]),
                    epsilon=0.1, value_tolerance=0.6)  # 0.849: every row
    assert wide.value("within_tolerance", statistic="rate") == 1.0


def test_spearman_by_hand_and_by_scipy(reg):
    # ranks 1 2 3 4 5 vs 1 2 4 3 5: sum d^2 = 2, rho = 1 - 6 x 2 / (5 x 24) = 0.9
    assert reg.value("value_spearman") == pytest.approx(0.9, abs=1e-12)
    assert reg.value("value_spearman") == pytest.approx(spearmanr(REF_V, VAR_V).statistic)


def test_spearman_resamples_match_scipy_with_ties():
    rng = np.random.default_rng(0)
    a = np.round(rng.normal(size=40), 1)  # ties within a row, and repeated rows in resamples
    b = np.round(a + rng.normal(scale=0.5, size=40), 1)
    idx = rng.integers(0, 40, size=(25, 40))
    want = [spearmanr(a[i], b[i]).statistic for i in idx]
    assert spearman_rows(a[idx], b[idx]) == pytest.approx(want, abs=1e-12)
    assert np.isnan(spearman_rows(np.ones((1, 5)), b[None, :5])[0])  # constant: undefined


def test_spearman_interval_is_a_bootstrap_that_brackets_the_value(reg):
    low, high = reg.ci("value_spearman", n_boot=200, seed=0)
    assert reg.interval_method("value_spearman") == "bootstrap-percentile"
    assert low <= 0.9 <= high <= 1.0


def test_a_constant_reference_leaves_the_relative_error_undefined():
    ev = evaluate(_outputs(np.full((4, 1), 2.0)), _outputs(np.array([[2.0], [2.1], [2.0], [1.9]])),
                  epsilon=0.1)
    assert np.isnan(ev.detail["value_rel_error"]).all()
    assert ev.support("within_tolerance") == 0 and math.isnan(ev.value("within_tolerance"))
    assert ev.value("value_abs_error", statistic="max") == pytest.approx(0.1, abs=1e-6)

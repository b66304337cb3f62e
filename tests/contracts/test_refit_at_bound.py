"""The temperature-refit clause when only one model's refit fails to find an optimum.

The clause compares temperatures refitted (NLL) on the eval rows of the reference and of the
variant. Its value is no estimate when the *reference's* refit ran to a bound or did not
converge: then the clause is skipped with the reason. When the reference converged and only the
*variant's* refit ran to a bound (its best T at or beyond 1e-3 or 1e3), the variant needs a
temperature outside everything the deployed ones could be: the clause fails, its value the shift
to the bound (a lower bound of the shift), the reason saying so. A variant whose refit did not
converge (its NLL flat in T: constant logits) fails too, with no value.
"""

import math

import numpy as np
import pytest
from scipy.special import softmax

from contracts.checker import check, contract_from_dict
from metrics.evaluate import evaluate
from metrics.temperature_fit import fit_temperature

CONTRACT = contract_from_dict({"name": "c", "clause": [
    {"id": "temperature-refit", "metric": "temperature_refit_log_ratio", "max": 0.04}]})


def _outputs(logits, labels):
    """DecisionOutputs-shaped dict (all options valid), probabilities at T = 1."""
    logits = np.asarray(logits, dtype=np.float64)
    n, k = logits.shape
    probs = softmax(logits, axis=1)
    return {"ids": np.array([f"e{i}" for i in range(n)]), "task": np.array(["t"] * n),
            "logits": logits.astype(np.float32), "option_mask": np.ones((n, k), bool),
            "probs": probs.astype(np.float32), "temperature": np.ones(n, np.float32),
            "expected_score": np.full(n, np.nan, np.float32),
            "action_probs": np.stack([probs[:, 0], 1 - probs[:, 0]], axis=1).astype(np.float32),
            "labels": np.asarray(labels, np.int64)}


@pytest.fixture(scope="module")
def data():
    """600 rows, 3 options, labels drawn at T = 0.5: a refit on these logits converges;
    the negated logits put the labels on the low side, so their NLL falls all the way to T = 1e3;
    constant logits give a flat NLL."""
    rng = np.random.default_rng(5)
    z = rng.normal(size=(600, 3))
    y = np.array([rng.choice(3, p=row) for row in softmax(z / 0.5, axis=1)])
    return z, y


def _verdict(ref, var, y):
    ev = evaluate(_outputs(ref, y), _outputs(var, y), epsilon=0.0)
    return ev, check(CONTRACT, ev, n_bootstrap=0).results[0]


def test_the_fits_are_what_the_cases_need(data):
    z, y = data
    mask = np.ones(z.shape, bool)
    assert fit_temperature(z, mask, y).status == "converged"
    assert (fit_temperature(-z, mask, y).status, fit_temperature(-z, mask, y).temperature) == (
        "at_bound", 1e3)
    assert fit_temperature(np.zeros_like(z), mask, y).status == "not_converged"


def test_variant_at_the_bound_fails_when_the_reference_converged(data):
    z, y = data
    t_ref = fit_temperature(z.astype(np.float32).astype(np.float64), np.ones(z.shape, bool),
                            y).temperature
    ev, r = _verdict(z, -z, y)
    assert r.passed is False and r.status.startswith("FAIL: ")
    assert r.value == pytest.approx(math.log(1e3 / t_ref), rel=1e-9)  # the shift to the bound
    assert "variant" in r.reason and "T=1000" in r.reason and "reference" in r.reason
    assert "at least" in r.reason
    assert ev.fail_reason("temperature_refit_log_ratio") == r.reason
    assert ev.skip_reason("temperature_refit_log_ratio") == ""


def test_reference_at_the_bound_stays_skipped(data):
    z, y = data
    _, r = _verdict(-z, z, y)
    assert r.passed is None and math.isnan(r.value)
    assert r.status == "skipped: temperature refit at bound (T=1000) on bucket K=3 (reference)"


def test_variant_without_an_optimum_fails_with_no_value(data):
    z, y = data
    _, r = _verdict(z, np.zeros_like(z), y)
    assert r.passed is False and math.isnan(r.value) and r.status.startswith("FAIL: ")
    assert "did not converge" in r.reason and "variant" in r.reason


def test_both_converged_is_an_ordinary_number(data):
    z, y = data
    _, r = _verdict(z, 1.02 * z, y)  # a logit scale of 1.02: refit T scales by 1.02
    assert r.passed is True and r.reason == "" and r.status == "pass"
    assert r.value == pytest.approx(math.log(1.02), rel=1e-3)

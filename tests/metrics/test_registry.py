"""The metric registry (metrics/registry.py): the facts every reader uses come from one table,
the old constant names are views of it, and the facts agree with what the metrics compute."""

import numpy as np
import pytest

from contracts import ContractError, contract_from_dict
from metrics.evaluate import evaluate
from metrics.registry import (
    BINOMIAL_SET_METRICS,
    BOOL,
    BOOL_METRICS,
    DETAIL_METRICS,
    FLOAT,
    FLOAT_METRICS,
    LABELED_METRICS,
    METRIC_STATISTICS,
    METRICS,
    NO_CI_METRICS,
    REGISTRY,
    SET,
    SET_METRICS,
    MULTI_LABEL,
    REGRESSION,
    SOFTMAX,
    metrics_for,
    names,
    spec,
)
from runs.selftest import FAULTS, synthetic_outputs


@pytest.fixture(scope="module")
def pair():
    """(evaluation of the reference against itself, against a logit-noise variant)."""
    cal, ref = synthetic_outputs(n=300)
    _, noisy = FAULTS["logit-noise"].apply(cal, ref, np.random.default_rng(0))
    return evaluate(ref, ref, epsilon=0.1), evaluate(ref, noisy, epsilon=0.1)


def test_old_constants_are_views_of_the_registry_in_the_old_order():
    assert BOOL_METRICS[:3] == ("agreement", "flip", "negative_flip") and len(BOOL_METRICS) == 18
    assert FLOAT_METRICS[:3] == ("ref_margin", "max_abs_logit_diff", "kl") and len(FLOAT_METRICS) == 17
    assert SET_METRICS[-9:-4] == ("temperature_refit_log_ratio", "certified_share_conformal",
                                  "epsilon_max", "epsilon_conformal", "nonfinite_rows")
    assert BOOL_METRICS[-2:] == ("label_flip", "within_tolerance")
    assert len(SET_METRICS) == 34
    # the metrics of multi-label and regression heads come last (metrics.multilabel, .regression)
    assert metrics_for(MULTI_LABEL) == (
        "label_flip", "label_prob_max_abs_diff", "label_prob_mean_abs_diff", "nonfinite_rows",
        "label_flip_rate_max", "label_brier_delta", "label_ece_delta")
    assert metrics_for(REGRESSION) == ("within_tolerance", "value_abs_error", "value_rel_error",
                                       "nonfinite_rows", "value_spearman")
    assert len(metrics_for(SOFTMAX)) == len(METRICS) - 10
    assert METRICS == BOOL_METRICS + FLOAT_METRICS + SET_METRICS == tuple(REGISTRY)
    assert LABELED_METRICS == ("negative_flip", "positive_flip", "ref_correct", "var_correct")
    assert NO_CI_METRICS == ("temperature_refit_log_ratio", "epsilon_max", "epsilon_conformal",
                             "nonfinite_rows")
    assert BINOMIAL_SET_METRICS == {"accuracy_ref": "ref_correct", "accuracy_variant": "var_correct",
                                    "certified_share": "certified",
                                    "certified_share_conformal": "certified_conformal"}
    assert len(DETAIL_METRICS) == 21 and DETAIL_METRICS[0] == "epsilon_exceeded"
    assert METRIC_STATISTICS["flip"] == ("rate", "count")
    assert METRIC_STATISTICS["kl"][0] == "mean" and METRIC_STATISTICS["ece_delta"] == ("value",)
    assert names(SET, needs_labels=True) == ("accuracy_ref", "accuracy_variant", "accuracy_drop",
                                             "ece_ref", "ece_variant", "ece_delta", "smece_ref",
                                             "smece_variant", "smece_delta")


def test_each_column_lives_in_the_frame_its_spec_names(pair):
    _, ev = pair
    for s in REGISTRY.values():
        if s.kind == SET:
            assert s.compute is not None and s.name not in ev.per_example
            continue
        assert s.compute is None
        frame, other = (ev.detail, ev.per_example) if s.detail else (ev.per_example, ev.detail)
        assert s.name in frame and s.name not in other, s.name
        if s.kind == BOOL:
            assert set(np.unique(ev._array(s.name)[~np.isnan(ev._array(s.name))])) <= {0.0, 1.0}


def test_interval_method_and_support_follow_the_spec(pair):
    _, ev = pair
    labeled = int((ev.per_example["label"] >= 0).sum())
    for s in REGISTRY.values():
        want = (None if s.name in NO_CI_METRICS else "clopper-pearson"
                if s.kind == BOOL or s.name in BINOMIAL_SET_METRICS
                else "tango-paired-score" if s.name == "accuracy_drop"
                else "bootstrap-percentile")
        assert ev.interval_method(s.name) == s.interval == want, s.name
        if s.needs_labels:
            assert ev.support(s.name) == labeled < len(ev.per_example), s.name
        elif s.kind == SET or s.name in ("agreement", "kl"):
            assert ev.support(s.name) == len(ev.per_example), s.name


#: Directed metrics that need not be worse under logit noise than with identical outputs:
#: properties of the reference or of ε (equal in both), accuracy and calibration of the variant
#: (noise can help by chance), and the positive flips (the variant fixing a reference error).
NOT_MONOTONE = {"certified", "certified_share", "epsilon_max", "epsilon_conformal",
                "certified_conformal", "certified_share_conformal", "ref_correct", "positive_flip",
                "var_correct", "temperature_refit_log_ratio"}
CALIBRATION = ("accuracy_", "ece", "classwise_ece", "brier", "nll")


def test_higher_is_better_matches_what_noise_does(pair):
    """Logit noise moves every drift metric in the worse direction its spec names (or leaves it,
    e.g. no bound violation either way), and most of them strictly."""
    same, noisy = pair
    strictly = []
    for s in REGISTRY.values():
        if s.higher_is_better is None or s.name in NOT_MONOTONE or s.name.startswith(CALIBRATION):
            continue
        stat = "max" if s.kind == FLOAT else None
        a, b = same.value(s.name, statistic=stat), noisy.value(s.name, statistic=stat)
        assert (b <= a) if s.higher_is_better else (b >= a), (s.name, a, b)
        if b != a:
            strictly.append(s.name)
    assert {"agreement", "flip", "kl", "max_abs_logit_diff", "prob_tv", "action_tv",
            "log_ratio_max", "kl_reverse", "epsilon_exceeded"} <= set(strictly), strictly


def test_contract_validation_reads_the_registry():
    c = contract_from_dict({"clause": [{"id": "a", "metric": "ece_delta", "max": 1.0}]})
    assert c.clauses[0].statistic == spec("ece_delta").default_statistic == "value"
    with pytest.raises(ContractError, match="statistic None, not allowed for metric 'kl'"):
        contract_from_dict({"clause": [{"id": "a", "metric": "kl", "max": 1.0}]})
    with pytest.raises(ContractError, match="unknown metric 'nope'; use one of agreement, flip"):
        contract_from_dict({"clause": [{"id": "a", "metric": "nope", "max": 1}]})
    with pytest.raises(ContractError, match="statistic 'p95', not allowed for metric 'flip'; use "
                                            "one of rate, count"):
        contract_from_dict({"clause": [{"id": "a", "metric": "flip", "statistic": "p95", "max": 1}]})
    with pytest.raises(ValueError, match="unknown metric"):
        spec(["kl"])

"""Contract metrics: pure NumPy/SciPy/pandas functions over decision-model outputs.

Naming rule: ``*_score`` is higher-is-better; ``*_loss`` and ``*_error`` are lower-is-better.
Everything else (``agreement``, ``flip``, ``kl_divergence``, ``top2_margin``...) is named after the
quantity it returns, and its docstring says which direction is good.

Per-example functions take arrays with the field names of ``runs.outputs.DecisionOutputs``
(``logits`` (N, K), ``option_mask`` (N, K), ``probs`` (N, K), ``expected_score`` (N,),
``action_probs`` (N, A), ``labels`` (N,) with -1 = unknown) and return (N,) arrays. This package
never imports ``mlx`` or ``variants``.
"""

from metrics.accuracy import accuracy, correct
from metrics.bootstrap import bootstrap_ci
from metrics.bounds import kl_bound, log_ratio_bound, max_abs_log_ratio, ratio_bounds, tv_bound
from metrics.calibration import (
    brier_loss,
    calibration_error,
    classwise_calibration_error,
    expected_calibration_error,
    nll_from_logits,
    nll_loss,
    reliability_diagram,
)
from metrics.conformal import conformal_quantile, coverage, epsilon_by_bucket
from metrics.distribution import describe
from metrics.divergence import kl_divergence, kl_divergence_from_logits
from metrics.drift import (
    abs_score_error,
    action_agreement,
    action_max_abs_diff,
    confidence_drift,
    delta_top_prob,
    entropy_confidence,
    total_variation,
)
from metrics.evaluate import Evaluation, evaluate
from metrics.flips import agreement, flip, negative_flip, positive_flip, top1
from metrics.intervals import clopper_pearson
from metrics.latency import latency_summary, paired_speedup
from metrics.margin import certified, epsilon_max, max_abs_logit_diff, top2_margin
from metrics.registry import REGISTRY, MetricSpec
from metrics.softmax import masked_softmax
from metrics.temperature_fit import fit_calibration_temperature, fit_temperature, fits_by_bucket
from metrics.ties import human_near_tie, human_top2_gap

__all__ = [
    "bootstrap_ci",
    "clopper_pearson",
    "brier_loss",
    "calibration_error",
    "classwise_calibration_error",
    "confidence_drift",
    "conformal_quantile",
    "coverage",
    "delta_top_prob",
    "describe",
    "entropy_confidence",
    "epsilon_by_bucket",
    "fit_calibration_temperature",
    "fit_temperature",
    "fits_by_bucket",
    "masked_softmax",
    "MetricSpec",
    "REGISTRY",
    "human_near_tie",
    "human_top2_gap",
    "kl_bound",
    "log_ratio_bound",
    "max_abs_log_ratio",
    "nll_from_logits",
    "nll_loss",
    "ratio_bounds",
    "reliability_diagram",
    "total_variation",
    "tv_bound",
    "Evaluation",
    "abs_score_error",
    "accuracy",
    "action_agreement",
    "action_max_abs_diff",
    "agreement",
    "certified",
    "correct",
    "epsilon_max",
    "evaluate",
    "expected_calibration_error",
    "flip",
    "kl_divergence",
    "kl_divergence_from_logits",
    "latency_summary",
    "max_abs_logit_diff",
    "negative_flip",
    "paired_speedup",
    "positive_flip",
    "top1",
    "top2_margin",
]

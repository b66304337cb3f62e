"""Evaluate a variant against the reference: per-example table, summary and stratified values.

:func:`evaluate` checks the two outputs and returns an :class:`Evaluation`
(:mod:`metrics.evaluation`), whose ``value``/``ci``/``support`` compute any metric of the
registry (:mod:`metrics.registry`) on any stratum (:mod:`metrics.strata`). The per-example
columns are built in :mod:`metrics.columns`, the set-level metrics in :mod:`metrics.set_metrics`,
the summary in :mod:`metrics.summary`.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; every other
metric's direction is ``MetricSpec.higher_is_better`` in :mod:`metrics.registry`.

The metric, statistic and stratum names are re-exported here (``METRICS``, ``BOOL_METRICS``,
``METRIC_STATISTICS``, ``STRATA``, ...) for code that imports them from this module.
"""

import math
from collections.abc import Mapping

import numpy as np

from metrics.columns import build_evaluation
from metrics.defaults import (HUMAN_TIE_GAP, N_BINS, NEAR_TIE_MARGIN, NUMERICAL_TIE_MULTIPLE,
                              VALUE_TOLERANCE)
from metrics.evaluation import Evaluation
from metrics.evaluation_tables import BOUND_ATOL, BOUND_RTOL
from metrics.registry import (
    BINOMIAL_SET_METRICS,
    BOOL_METRICS,
    DETAIL_METRICS,
    FLOAT_METRICS,
    LABELED_METRICS,
    METRIC_STATISTICS,
    METRICS,
    NO_CI_METRICS,
    SET_METRICS,
    check_metric_statistic,
)
from metrics.set_metrics import CALIBRATION_FIGURES
from metrics.statistics import BOOL_STATISTICS, FLOAT_STATISTICS, SET_STATISTICS, STATISTICS
from metrics.strata import (
    MARGIN_STRATUM_PREFIX,
    OPTIONS_STRATUM_PREFIX,
    STRATA,
    TASK_STRATUM_PREFIX,
    check_stratum,
)
from metrics.summary import summarise

__all__ = [
    "BINOMIAL_SET_METRICS", "BOOL_METRICS", "BOOL_STATISTICS", "BOUND_ATOL", "BOUND_RTOL",
    "CALIBRATION_FIGURES", "DETAIL_METRICS", "Evaluation", "FLOAT_METRICS", "FLOAT_STATISTICS",
    "LABELED_METRICS", "MARGIN_STRATUM_PREFIX", "METRICS", "METRIC_STATISTICS", "NO_CI_METRICS",
    "OPTIONAL_FIELDS", "OPTIONS_STRATUM_PREFIX", "REQUIRED_FIELDS", "SET_METRICS",
    "SET_STATISTICS", "STATISTICS", "STRATA", "TASK_STRATUM_PREFIX", "check_metric_statistic",
    "check_stratum", "evaluate",
]

#: Fields each outputs mapping must provide (names of ``runs.outputs.DecisionOutputs``).
REQUIRED_FIELDS = ("ids", "task", "logits", "option_mask", "probs", "expected_score",
                   "action_probs", "labels")

#: Fields used when present (older outputs or hand-made dicts may lack them).
OPTIONAL_FIELDS = ("temperature", "option_scores", "confidence", "human_dist")


def _get(outputs, name, which):
    """Field ``name`` of a mapping (dict, NpzFile) or of an object with attributes."""
    try:
        value = outputs[name] if isinstance(outputs, Mapping) else getattr(outputs, name)
    except (KeyError, AttributeError):
        raise ValueError(
            f"{which} outputs have no field {name!r}; pass a mapping or DecisionOutputs with "
            f"fields {', '.join(REQUIRED_FIELDS)}."
        ) from None
    return np.asarray(value)


def evaluate(ref, var, *, epsilon, near_tie_margin=NEAR_TIE_MARGIN, n_bins=N_BINS,
             epsilon_conformal=None, alpha=None, human_tie_gap=HUMAN_TIE_GAP,
             numerical_noise=0.0, value_tolerance=VALUE_TOLERANCE):
    """Compare a variant's outputs with the reference's on the same examples.

    Parameters
    ----------
    ref, var : mapping or object with DecisionOutputs fields
        ``ids`` (N,) str, ``task`` (N,) str, ``logits`` (N, K) float, ``option_mask`` (N, K) bool,
        ``probs`` (N, K) float, ``expected_score`` (N,) float (NaN = no score), ``action_probs``
        (N, A) float, ``labels`` (N,) int (-1 = unknown); used when present: ``temperature``
        (N,), ``option_scores`` (N, K), ``confidence`` (N,), ``human_dist`` (N, K). A dict,
        ``np.load('outputs.npz')`` or a ``DecisionOutputs`` all work. Same examples in the same
        order; ``ref``'s mask is used, and rows where ``var``'s mask differs are flagged
        (``mask_mismatch``) rather than rejected, so a contract can fail them.
    epsilon : float
        Certificate bound on the per-logit drift (raw-logit units, >= 0), normally
        :func:`metrics.margin.epsilon_max` on a calibration split.
    near_tie_margin : float, default=NEAR_TIE_MARGIN (1.0, :mod:`metrics.defaults`)
        An example is a near tie when the reference's raw top-two margin is below this.
    n_bins : int, default=N_BINS (15)
        Bins of the expected calibration errors.
    epsilon_conformal : float, optional
        Split-conformal ε (:func:`metrics.conformal.conformal_quantile` on the calibration
        split); default ``epsilon``.
    alpha : float, optional
        Its miscoverage level (recorded in the summary).
    human_tie_gap : float, default=HUMAN_TIE_GAP (0.2)
        An item is a human near tie when its raters' top-two share gap is at most this.
    numerical_noise : float, default=0.0
        The reference's own numerical noise (raw-logit units, >= 0: the largest |Δlogit|
        between two compute paths of the reference, run.json ``reference_noise``). A row whose
        reference margin is at most ``NUMERICAL_TIE_MULTIPLE`` (10, :mod:`metrics.defaults`)
        times it is a numerical tie (``detail`` column ``numerical_tie``; strata
        ``numerical_tie`` and ``decided``, its complement).
    value_tolerance : float, default=VALUE_TOLERANCE (0.05, :mod:`metrics.defaults`)
        A regression row is within tolerance (``detail`` column ``within_tolerance``) when
        ``|variant - reference|`` of its value is at most this many times the spread (standard
        deviation) of the reference's values (:mod:`metrics.regression`); > 0.

    Returns
    -------
    Evaluation
        ``per_example`` columns: ``id``, ``task``, ``n_options``, ``label``, ``ref_pred``,
        ``var_pred``, ``agreement``, ``flip``, ``negative_flip``, ``positive_flip``,
        ``ref_margin``, ``max_abs_logit_diff``, ``kl``, ``abs_score_error``,
        ``action_max_abs_diff``, ``action_agreement``, ``ref_correct``, ``var_correct``,
        ``near_tie``, ``certified``. The four label-dependent bool columns use pandas' nullable
        ``boolean`` dtype, NA where the label is unknown. ``kl`` (and ``kl_reverse``), like the
        per-example NLL behind ``nll_*``, are exact from each model's logits at its own
        temperature where its probabilities are their softmax, from the probabilities elsewhere
        (:mod:`metrics.from_logits`): no cap, no floor.

        ``detail`` columns (``DETAIL_METRICS`` plus ``score_range`` and ``log_ratio_bound``):
        ``epsilon_exceeded`` (max|Δlogit| > ε), ``within_conformal`` (max|Δlogit| <=
        ``epsilon_conformal``), ``certified_conformal`` (margin > 2 ``epsilon_conformal``),
        ``bound_violation`` (some observed drift exceeds what the example's own max|Δlogit|
        allows at its temperature: probabilities inconsistent with logits, a checker or model
        bug; False where there is no temperature), ``mask_mismatch``, ``human_near_tie``,
        ``kl_reverse`` (KL(variant ‖ ref)), ``prob_tv``, ``delta_top_prob`` (signed Δp of the
        reference's top option), ``abs_delta_top_prob``, ``confidence_drift``, ``action_tv``,
        ``log_ratio_max`` / ``action_log_ratio_max`` (observed max |log p'/p|),
        ``human_top2_gap``; the columns of multi-label heads (``label_flip``,
        ``label_prob_max_abs_diff``, ``label_prob_mean_abs_diff``: :mod:`metrics.multilabel`)
        and of regression heads (``value_abs_error``, ``value_rel_error``,
        ``within_tolerance``: :mod:`metrics.regression`), computed from the raw logits for
        every model (a contract names those of its model's outputs).

        ``summary`` keys: ``n_examples``, ``agreement``, ``flip_rate``, ``negative_flips``,
        ``positive_flips`` (counts), ``accuracy_ref``, ``accuracy_variant``, ``kl_mean``,
        ``kl_p50``, ``kl_p95``, ``kl_p99``, ``kl_max``, ``max_abs_logit_diff_max``, ``epsilon``,
        ``certified_share``, ``certified_flips`` (count), ``certified_flip_ids`` (list of str;
        non-empty means ε was exceeded on these examples), ``ece_ref``, ``ece_variant``,
        ``ece_delta`` (variant - ref; 15 equal-width bins), ``smece_ref``, ``smece_variant``,
        ``smece_delta`` (smooth ECE, :mod:`metrics.smooth_ece`; the ``ece-delta`` clause's
        metric), ``score_abs_err_mean``, ``score_abs_err_max`` (NaN when no
        example has a score), ``action_max_abs_diff_max``, ``action_agreement``, ``n_near_tie``,
        ``near_tie_flip_rate`` (NaN when there is no near tie); then ``epsilon_conformal``,
        ``alpha``, ``conformal_coverage``, ``certified_share_conformal``,
        ``epsilon_exceeded_ids`` (every example where max|Δlogit| > ε), ``bound_violations``,
        ``mask_mismatches``, ``n_human_near_tie``, ``human_near_tie_flip_rate``.

    Raises
    ------
    ValueError
        If a field is missing, shapes or ids or labels of ``ref`` and ``var`` disagree,
        probabilities are invalid, or ``epsilon``/``near_tie_margin`` is invalid.
    """
    r = {name: _get(ref, name, "ref") for name in REQUIRED_FIELDS}
    v = {name: _get(var, name, "var") for name in REQUIRED_FIELDS}
    n = r["logits"].shape[0] if r["logits"].ndim == 2 else -1
    for name in REQUIRED_FIELDS:
        if r[name].shape[:1] != (n,) or v[name].shape != r[name].shape:
            raise ValueError(
                f"field {name!r}: ref {r[name].shape} and var {v[name].shape} must have equal "
                f"shapes with N = {n} rows; evaluate both models on the same examples."
            )
    ids = r["ids"].astype(str)
    differ = np.flatnonzero(ids != v["ids"].astype(str))
    if differ.size:
        raise ValueError(
            f"ref and var ids differ at {differ.size} row(s) (first: row {differ[0]}, "
            f"{ids[differ[0]]!r} vs {v['ids'].astype(str)[differ[0]]!r}); align the examples."
        )
    if not np.array_equal(r["labels"], v["labels"]):
        raise ValueError("ref and var labels differ; both must come from the same examples.")
    near_tie_margin = float(near_tie_margin)
    if not near_tie_margin >= 0:
        raise ValueError(f"near_tie_margin must be >= 0, got {near_tie_margin}.")
    epsilon_conformal = float(epsilon if epsilon_conformal is None else epsilon_conformal)
    if not epsilon_conformal >= 0:
        raise ValueError(f"epsilon_conformal must be >= 0, got {epsilon_conformal}.")

    value_tolerance = float(value_tolerance)
    if not (math.isfinite(value_tolerance) and value_tolerance > 0):
        raise ValueError(f"value_tolerance must be a finite number > 0, got {value_tolerance}.")
    evaluation = build_evaluation(r, v, ref, var, epsilon=epsilon, near_tie_margin=near_tie_margin,
                                  n_bins=n_bins, epsilon_conformal=epsilon_conformal, alpha=alpha,
                                  human_tie_gap=human_tie_gap, value_tolerance=value_tolerance)
    noise = float(numerical_noise)
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"numerical_noise must be a finite number >= 0, got {numerical_noise}.")
    evaluation.numerical_noise = noise
    evaluation.detail["numerical_tie"] = (
        evaluation.per_example["ref_margin"].to_numpy() <= NUMERICAL_TIE_MULTIPLE * noise)
    evaluation.summary = summarise(evaluation)
    return evaluation

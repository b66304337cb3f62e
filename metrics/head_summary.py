"""Summary figures of a multi-label or a regression head: what the run's tables, reports and
model card show for such a head in place of the softmax figures (agreement, certified share,
ECE, KL...), which mean nothing for its outputs (a softmax over one value is 1).

Every figure is the point value, on all eval rows, of a per-example column or set-level metric
of :mod:`metrics.multilabel` / :mod:`metrics.regression`, the same numbers a contract clause on
that metric reads (``mean`` / ``max`` / ``rate`` / ``p95`` as :mod:`metrics.statistics`).

Regression (``outputs = "regression"``):

- ``value_abs_error_mean`` / ``value_abs_error_max``: |v − r| in the output's own units;
- ``value_rel_error_mean`` / ``value_rel_error_max``: |v − r| / s, s the reference's spread
  (``value_spread``, the std of its values, ddof 0);
- ``within_tolerance``: share of rows with |v − r| <= ``value_tolerance`` · s (rows where s is 0
  are not counted; NaN when none is left);
- ``value_spearman``: Spearman's ρ of reference and variant values.

Multi-label (``outputs = "multi_label"``), each label decided "yes" at sigmoid >= 0.5:

- ``label_flips``: label decisions that changed (a row with two changed labels counts 2);
- ``label_set_changes`` / ``label_set_change_rate``: rows whose set of labels changed (count,
  share: the ``label_flip`` column's ``count`` / ``rate``);
- ``label_flip_rate_max``: the largest per-label flip rate;
- ``label_prob_drift_max`` / ``label_prob_drift_p95``: max / 95th percentile over rows of the
  row's largest |Δ sigmoid|; ``label_prob_drift_mean``: mean over rows of the row's mean;
- ``label_brier_delta`` / ``label_ece_delta``: the largest per-label Brier / binary-ECE
  worsening (variant − reference, against the reference's decisions).
"""

import numpy as np

from metrics.multilabel import (decisions, label_brier_delta, label_ece_delta,
                                label_flip_rate_max)
from metrics.regression import spread, value_spearman, values
from metrics.statistics import percentile

SOFTMAX, MULTI_LABEL, REGRESSION = "softmax", "multi_label", "regression"

#: the summary keys of each output kind, in the order of the module docstring
KEYS = {
    REGRESSION: ("value_abs_error_mean", "value_abs_error_max", "value_rel_error_mean",
                 "value_rel_error_max", "value_spread", "value_tolerance", "within_tolerance",
                 "value_spearman"),
    MULTI_LABEL: ("label_flips", "label_set_changes", "label_set_change_rate",
                  "label_flip_rate_max", "label_prob_drift_max", "label_prob_drift_p95",
                  "label_prob_drift_mean", "label_brier_delta", "label_ece_delta"),
}


#: summary keys of :func:`metrics.summary.summarise` that are softmax figures (agreement and
#: flips of the top option, accuracy, KL and TV between softmaxes, margin certificates, ECE,
#: Brier, NLL, temperatures, score and action drift, near-tie strata): constant by
#: construction on a multi-label or regression head (a softmax over one value is 1), so such a
#: run records them as NaN (summary.csv's cells empty, metrics.json / report.json null) and
#: lists them under ``not_applicable``. The rest (ε and |Δlogit| figures, the row counts, the
#: numerical noise) measure the raw outputs and stay.
SOFTMAX_KEYS = (
    "agreement", "flip_rate", "negative_flips", "positive_flips", "accuracy_ref",
    "accuracy_variant", "kl_mean", "kl_p50", "kl_p95", "kl_p99", "kl_max", "certified_share",
    "certified_flips", "certified_flip_ids", "ece_ref", "ece_variant", "ece_delta", "smece_ref",
    "smece_variant", "smece_delta", "score_abs_err_mean", "score_abs_err_max",
    "action_max_abs_diff_max", "action_agreement", "n_near_tie", "near_tie_flip_rate",
    "certified_share_conformal", "certified_conformal_flips", "bound_violations",
    "kl_reverse_mean", "prob_tv_max", "action_tv_max", "abs_delta_top_prob_p95",
    "confidence_drift_max", "n_human_near_tie", "n_numerical_tie", "numerical_tie_flips",
    "human_near_tie_flip_rate", "brier_ref", "brier_variant", "nll_ref", "nll_variant",
    "ece_mass_ref", "ece_mass_variant", "classwise_ece_ref", "classwise_ece_variant",
    "temperature_refit_log_ratio")


def blank_softmax(summary):
    """``summary`` (a :func:`metrics.summary.summarise` dict) with every :data:`SOFTMAX_KEYS`
    entry present set to NaN (a list to None) and ``not_applicable`` listing them, for a
    multi-label or regression run; a new dict."""
    out = dict(summary)
    gone = [k for k in SOFTMAX_KEYS if k in out]
    for k in gone:
        out[k] = None if isinstance(out[k], (list, tuple)) else float("nan")
    out["not_applicable"] = gone
    return out


def _stat(x, how):
    """``how`` ("mean", "max", "p95") of the finite entries of ``x``; NaN when none."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan")
    return float(x.mean() if how == "mean" else x.max() if how == "max" else percentile(x, 95.0))


def _whole(metric, ev):
    """A set-level metric on all rows (one 'resample' holding every row); NaN on no row."""
    n = len(ev.per_example)
    return float(metric(ev, np.arange(n)[None, :])[0]) if n else float("nan")


def head_summary(ev, outputs, value_tolerance=None):
    """The summary figures (module docstring) of ``outputs`` from an evaluation.

    Parameters
    ----------
    ev : metrics.evaluation.Evaluation
        Its ``detail`` holds the multi-label and regression columns (:mod:`metrics.columns`).
    outputs : str
        ``"multi_label"`` or ``"regression"``; ``"softmax"`` gives {} (the softmax figures are
        :mod:`metrics.summary`'s).
    value_tolerance : float, optional
        The tolerance in force (recorded as ``value_tolerance``; regression only).

    Returns
    -------
    dict of str -> float (NaN where there is no row to measure)

    Raises
    ------
    ValueError
        An unknown ``outputs``.
    """
    d = ev.detail
    if outputs == SOFTMAX:
        return {}
    if outputs == REGRESSION:
        within = d["within_tolerance"]
        known = within.dropna().to_numpy(dtype=bool)
        return {
            "value_abs_error_mean": _stat(d["value_abs_error"], "mean"),
            "value_abs_error_max": _stat(d["value_abs_error"], "max"),
            "value_rel_error_mean": _stat(d["value_rel_error"], "mean"),
            "value_rel_error_max": _stat(d["value_rel_error"], "max"),
            "value_spread": spread(values(ev.ref_logits)),
            "value_tolerance": float("nan") if value_tolerance is None else float(value_tolerance),
            "within_tolerance": float(known.mean()) if known.size else float("nan"),
            "value_spearman": _whole(value_spearman, ev),
        }
    if outputs == MULTI_LABEL:
        mask = np.asarray(ev.option_mask, dtype=bool)
        changed = (decisions(ev.ref_logits) != decisions(ev.var_logits)) & mask
        rows = d["label_flip"].to_numpy(dtype=bool)
        return {
            "label_flips": float(changed.sum()),
            "label_set_changes": float(rows.sum()),
            "label_set_change_rate": float(rows.mean()) if rows.size else float("nan"),
            "label_flip_rate_max": _whole(label_flip_rate_max, ev),
            "label_prob_drift_max": _stat(d["label_prob_max_abs_diff"], "max"),
            "label_prob_drift_p95": _stat(d["label_prob_max_abs_diff"], "p95"),
            "label_prob_drift_mean": _stat(d["label_prob_mean_abs_diff"], "mean"),
            "label_brier_delta": _whole(label_brier_delta, ev),
            "label_ece_delta": _whole(label_ece_delta, ev),
        }
    raise ValueError(f"unknown outputs {outputs!r}; use one of {SOFTMAX}, {MULTI_LABEL}, "
                     f"{REGRESSION}")

"""Evaluate a variant against the reference: per-example table, summary and stratified values.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; for the other
columns see the module that defines them (``agreement``/``*_agreement``/``*_correct``/``accuracy_*``
higher-is-better; ``flip``/``negative_flip``/``kl``/``*_diff``/``ece_*`` lower-is-better).

The allowed metric, statistic and stratum names live in module constants, which the contract
checker uses to validate contracts.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from metrics.accuracy import accuracy, correct
from metrics.calibration import expected_calibration_error
from metrics.divergence import kl_divergence
from metrics.drift import abs_score_error, action_agreement, action_max_abs_diff
from metrics.flips import agreement, negative_flip, positive_flip, top1
from metrics.margin import certified, max_abs_logit_diff, top2_margin

#: Per-example bool columns; statistics ``rate`` (mean) and ``count`` (sum). The label-dependent
#: ones (``LABELED_METRICS``) are missing (pandas NA) where the label is unknown, so their rate is
#: over labeled examples (e.g. the negative flip rate of Yan et al.).
BOOL_METRICS = (
    "agreement", "flip", "negative_flip", "positive_flip", "action_agreement",
    "ref_correct", "var_correct", "near_tie", "certified",
)
LABELED_METRICS = ("negative_flip", "positive_flip", "ref_correct", "var_correct")
#: Per-example float columns; NaN values (no score) are skipped by every statistic.
FLOAT_METRICS = ("ref_margin", "max_abs_logit_diff", "kl", "abs_score_error", "action_max_abs_diff")
#: Set-level metrics, recomputed on the stratum's rows; statistic ``value`` only.
SET_METRICS = (
    "accuracy_ref", "accuracy_variant", "accuracy_drop",
    "ece_ref", "ece_variant", "ece_delta", "certified_share",
)
METRICS = BOOL_METRICS + FLOAT_METRICS + SET_METRICS

BOOL_STATISTICS = ("rate", "count")
FLOAT_STATISTICS = ("mean", "max", "min", "p50", "p95", "p99")
SET_STATISTICS = ("value",)
STATISTICS = BOOL_STATISTICS + FLOAT_STATISTICS + SET_STATISTICS
#: Allowed statistics of each metric; the first is the default of :meth:`Evaluation.value`.
METRIC_STATISTICS = {
    **{m: BOOL_STATISTICS for m in BOOL_METRICS},
    **{m: FLOAT_STATISTICS for m in FLOAT_METRICS},
    **{m: SET_STATISTICS for m in SET_METRICS},
}

#: Fixed strata; a task stratum is ``TASK_STRATUM_PREFIX + <task name>``, e.g. ``task:sentiment-3``.
STRATA = ("all", "near_tie", "certified", "uncertified")
TASK_STRATUM_PREFIX = "task:"

#: Fields each outputs mapping must provide (names of ``variants.outputs.DecisionOutputs``).
REQUIRED_FIELDS = ("ids", "task", "logits", "option_mask", "probs", "expected_score",
                   "action_probs", "labels")

_PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0}


def _percentile(values, q):
    """``numpy.percentile(values, q)`` (linear), but inf-safe: two equal infinite neighbours give
    inf, not ``inf - inf = NaN`` (``ref_margin`` is +inf for single-option examples)."""
    v = np.sort(values)
    pos = q / 100.0 * (v.size - 1)
    i = int(np.floor(pos))
    frac = pos - i
    lo, hi = v[i], v[min(i + 1, v.size - 1)]
    if frac == 0.0 or lo == hi:
        return float(lo)
    return float(lo + frac * (hi - lo))


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


def check_stratum(stratum):
    """Raise ValueError unless ``stratum`` is one of ``STRATA`` or ``task:<name>``."""
    if not isinstance(stratum, str):
        raise ValueError(f"stratum must be a string, got {stratum!r}.")
    if stratum in STRATA:
        return
    if stratum.startswith(TASK_STRATUM_PREFIX) and len(stratum) > len(TASK_STRATUM_PREFIX):
        return
    raise ValueError(
        f"unknown stratum {stratum!r}; use one of {', '.join(STRATA)} or "
        f"'{TASK_STRATUM_PREFIX}<task name>'."
    )


def check_metric_statistic(metric, statistic):
    """Raise ValueError unless ``metric`` is known and ``statistic`` is allowed for it."""
    if metric not in METRIC_STATISTICS:
        raise ValueError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}.")
    allowed = METRIC_STATISTICS[metric]
    if statistic not in allowed:
        raise ValueError(
            f"statistic {statistic!r} is not allowed for metric {metric!r}; use one of "
            f"{', '.join(allowed)}."
        )


@dataclass
class Evaluation:
    """Result of :func:`evaluate`.

    Attributes
    ----------
    per_example : pandas.DataFrame
        One row per example (columns listed in :func:`evaluate`).
    summary : dict
        Named numbers for reports (see :func:`evaluate`).
    epsilon : float
        The certificate's ε (raw-logit units).
    near_tie_margin : float
        Reference top-two margin below which an example is a near tie.
    n_bins : int
        ECE bins.
    ref_probs, var_probs : ndarray of shape (N, K), float64
        Option probabilities, kept to recompute ECE on a stratum.
    option_mask : ndarray of shape (N, K), bool
    """

    per_example: pd.DataFrame
    summary: dict
    epsilon: float
    near_tie_margin: float
    n_bins: int
    ref_probs: np.ndarray = field(repr=False)
    var_probs: np.ndarray = field(repr=False)
    option_mask: np.ndarray = field(repr=False)

    def rows(self, stratum="all"):
        """Bool mask of shape (N,) selecting ``stratum`` (see ``STRATA``; ``task:<name>``).

        Raises
        ------
        ValueError
            If ``stratum`` is unknown.
        """
        check_stratum(stratum)
        df = self.per_example
        if stratum == "all":
            return np.ones(len(df), dtype=bool)
        if stratum == "near_tie":
            return df["near_tie"].to_numpy(dtype=bool)
        if stratum == "certified":
            return df["certified"].to_numpy(dtype=bool)
        if stratum == "uncertified":
            return ~df["certified"].to_numpy(dtype=bool)
        return (df["task"] == stratum[len(TASK_STRATUM_PREFIX):]).to_numpy()

    def _column(self, metric, rows):
        """Defined (non-missing) values of a per-example column on ``rows``."""
        col = self.per_example.loc[rows, metric]
        if metric in BOOL_METRICS:
            return col.dropna().to_numpy(dtype=bool)
        values = col.to_numpy(dtype=np.float64)
        return values[~np.isnan(values)]

    def support(self, metric, stratum="all"):
        """Number of examples ``value(metric, stratum, ...)`` is computed over.

        The stratum's size, less rows where the metric is undefined (unknown label for
        ``negative_flip``/``positive_flip``/``*_correct``/``accuracy_*``/``ece_*``; no score for
        ``abs_score_error``).

        Raises
        ------
        ValueError
            If ``metric`` or ``stratum`` is unknown.
        """
        if metric not in METRIC_STATISTICS:
            raise ValueError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}.")
        rows = self.rows(stratum)
        if metric == "certified_share":
            return int(rows.sum())
        if metric in SET_METRICS:
            return int((rows & (self.per_example["label"].to_numpy() >= 0)).sum())
        return int(self._column(metric, rows).size)

    def value(self, metric, stratum="all", statistic=None):
        """One number: ``statistic`` of ``metric`` over the examples of ``stratum``.

        Parameters
        ----------
        metric : str
            One of ``METRICS``.
        stratum : str, default='all'
            One of ``STRATA`` or ``'task:<name>'``.
        statistic : str, optional
            One of ``METRIC_STATISTICS[metric]``; default its first entry (``rate`` for bool
            columns, ``mean`` for float columns, ``value`` for set-level metrics). Percentiles
            interpolate linearly, as ``numpy.percentile`` (and stay inf, not NaN, between infs).

        Returns
        -------
        value : float
            NaN when the stratum has no example on which the metric is defined.

        Raises
        ------
        ValueError
            If the metric, statistic or stratum is unknown, or the statistic does not apply.
        """
        if statistic is None and metric in METRIC_STATISTICS:
            statistic = METRIC_STATISTICS[metric][0]
        check_metric_statistic(metric, statistic)
        rows = self.rows(stratum)
        if not rows.any():
            return float("nan")
        if metric in SET_METRICS:
            return self._set_value(metric, rows)
        values = self._column(metric, rows)
        if values.size == 0:
            return float("nan")
        if statistic in ("rate", "mean"):
            return float(values.mean())
        if statistic == "count":
            return float(values.sum())
        if statistic == "max":
            return float(values.max())
        if statistic == "min":
            return float(values.min())
        return _percentile(values, _PERCENTILES[statistic])

    def _set_value(self, metric, rows):
        df = self.per_example
        labels = df["label"].to_numpy()[rows]
        if metric == "certified_share":
            return float(df["certified"].to_numpy(dtype=bool)[rows].mean())
        if metric.startswith("accuracy_"):
            acc_ref = accuracy(df["ref_pred"].to_numpy()[rows], labels)
            acc_var = accuracy(df["var_pred"].to_numpy()[rows], labels)
            return {"accuracy_ref": acc_ref, "accuracy_variant": acc_var,
                    "accuracy_drop": acc_ref - acc_var}[metric]
        mask = self.option_mask[rows]
        ece_ref = expected_calibration_error(self.ref_probs[rows], labels, mask, n_bins=self.n_bins)
        ece_var = expected_calibration_error(self.var_probs[rows], labels, mask, n_bins=self.n_bins)
        return {"ece_ref": ece_ref, "ece_variant": ece_var, "ece_delta": ece_var - ece_ref}[metric]


def evaluate(ref, var, *, epsilon, near_tie_margin=1.0, n_bins=15):
    """Compare a variant's outputs with the reference's on the same examples.

    Parameters
    ----------
    ref, var : mapping or object with DecisionOutputs fields
        ``ids`` (N,) str, ``task`` (N,) str, ``logits`` (N, K) float, ``option_mask`` (N, K) bool,
        ``probs`` (N, K) float, ``expected_score`` (N,) float (NaN = no score), ``action_probs``
        (N, A) float, ``labels`` (N,) int (-1 = unknown). A dict, ``np.load('outputs.npz')`` or a
        ``DecisionOutputs`` all work. Same examples in the same order; ``ref``'s mask is used.
    epsilon : float
        Certificate bound on the per-logit drift (raw-logit units, >= 0), normally
        :func:`metrics.margin.epsilon_max` on a calibration split.
    near_tie_margin : float, default=1.0
        An example is a near tie when the reference's raw top-two margin is below this.
    n_bins : int, default=15
        Bins of the expected calibration error.

    Returns
    -------
    Evaluation
        ``per_example`` columns: ``id``, ``task``, ``n_options``, ``label``, ``ref_pred``,
        ``var_pred``, ``agreement``, ``flip``, ``negative_flip``, ``positive_flip``,
        ``ref_margin``, ``max_abs_logit_diff``, ``kl``, ``abs_score_error``,
        ``action_max_abs_diff``, ``action_agreement``, ``ref_correct``, ``var_correct``,
        ``near_tie``, ``certified``. The four label-dependent bool columns use pandas' nullable
        ``boolean`` dtype, NA where the label is unknown.

        ``summary`` keys: ``n_examples``, ``agreement``, ``flip_rate``, ``negative_flips``,
        ``positive_flips`` (counts), ``accuracy_ref``, ``accuracy_variant``, ``kl_mean``,
        ``kl_p50``, ``kl_p95``, ``kl_p99``, ``kl_max``, ``max_abs_logit_diff_max``, ``epsilon``,
        ``certified_share``, ``certified_flips`` (count), ``certified_flip_ids`` (list of str;
        non-empty means ε was exceeded on these examples), ``ece_ref``, ``ece_variant``,
        ``ece_delta`` (variant - ref), ``score_abs_err_mean``, ``score_abs_err_max`` (NaN when no
        example has a score), ``action_max_abs_diff_max``, ``action_agreement``, ``n_near_tie``,
        ``near_tie_flip_rate`` (NaN when there is no near tie).

    Raises
    ------
    ValueError
        If a field is missing, shapes or ids or labels or option masks of ``ref`` and ``var``
        disagree, probabilities are invalid, or ``epsilon``/``near_tie_margin`` is invalid.
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
    if not np.array_equal(r["option_mask"], v["option_mask"]):
        raise ValueError("ref and var option_mask differ; both must come from the same examples.")
    near_tie_margin = float(near_tie_margin)
    if not near_tie_margin >= 0:
        raise ValueError(f"near_tie_margin must be >= 0, got {near_tie_margin}.")

    mask = r["option_mask"]
    labels = r["labels"]
    known = labels >= 0
    ref_pred = top1(r["logits"], mask)
    var_pred = top1(v["logits"], mask)
    margin = top2_margin(r["logits"], mask)
    cert = certified(margin, epsilon)

    def labeled(x):
        out = pd.array(np.asarray(x, dtype=bool), dtype="boolean")
        out[~known] = pd.NA
        return out

    df = pd.DataFrame({
        "id": ids,
        "task": r["task"].astype(str),
        "n_options": mask.sum(axis=1).astype(np.int64),
        "label": labels.astype(np.int64),
        "ref_pred": ref_pred,
        "var_pred": var_pred,
        "agreement": agreement(ref_pred, var_pred),
        "flip": ~agreement(ref_pred, var_pred),
        "negative_flip": labeled(negative_flip(ref_pred, var_pred, labels)),
        "positive_flip": labeled(positive_flip(ref_pred, var_pred, labels)),
        "ref_margin": margin,
        "max_abs_logit_diff": max_abs_logit_diff(r["logits"], v["logits"], mask),
        "kl": kl_divergence(r["probs"], v["probs"], mask),
        "abs_score_error": abs_score_error(r["expected_score"], v["expected_score"]),
        "action_max_abs_diff": action_max_abs_diff(r["action_probs"], v["action_probs"]),
        "action_agreement": action_agreement(r["action_probs"], v["action_probs"]),
        "ref_correct": labeled(correct(ref_pred, labels)),
        "var_correct": labeled(correct(var_pred, labels)),
        "near_tie": margin < near_tie_margin,
        "certified": cert,
    })
    evaluation = Evaluation(
        per_example=df, summary={}, epsilon=float(epsilon), near_tie_margin=near_tie_margin,
        n_bins=int(n_bins), ref_probs=r["probs"].astype(np.float64),
        var_probs=v["probs"].astype(np.float64), option_mask=mask,
    )
    evaluation.summary = _summarise(evaluation)
    return evaluation


def _nan_stat(values, fn):
    values = values[~np.isnan(values)]
    return float(fn(values)) if values.size else float("nan")


def _summarise(ev):
    df = ev.per_example
    value = ev.value
    flips = df["flip"].to_numpy()
    cert = df["certified"].to_numpy()
    return {
        "n_examples": int(len(df)),
        "agreement": value("agreement", statistic="rate"),
        "flip_rate": value("flip", statistic="rate"),
        "negative_flips": int(df["negative_flip"].sum()),
        "positive_flips": int(df["positive_flip"].sum()),
        "accuracy_ref": value("accuracy_ref"),
        "accuracy_variant": value("accuracy_variant"),
        "kl_mean": value("kl", statistic="mean"),
        "kl_p50": value("kl", statistic="p50"),
        "kl_p95": value("kl", statistic="p95"),
        "kl_p99": value("kl", statistic="p99"),
        "kl_max": value("kl", statistic="max"),
        "max_abs_logit_diff_max": value("max_abs_logit_diff", statistic="max"),
        "epsilon": ev.epsilon,
        "certified_share": value("certified_share"),
        "certified_flips": int((flips & cert).sum()),
        "certified_flip_ids": df["id"][flips & cert].astype(str).tolist(),
        "ece_ref": value("ece_ref"),
        "ece_variant": value("ece_variant"),
        "ece_delta": value("ece_delta"),
        "score_abs_err_mean": _nan_stat(df["abs_score_error"].to_numpy(), np.mean),
        "score_abs_err_max": _nan_stat(df["abs_score_error"].to_numpy(), np.max),
        "action_max_abs_diff_max": _nan_stat(df["action_max_abs_diff"].to_numpy(), np.max),
        "action_agreement": value("action_agreement", statistic="rate"),
        "n_near_tie": int(df["near_tie"].sum()),
        "near_tie_flip_rate": value("flip", "near_tie", "rate"),
    }

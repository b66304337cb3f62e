"""Evaluate a variant against the reference: per-example table, summary and stratified values.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; for the other
columns see the module that defines them (``agreement``/``*_agreement``/``*_correct``/``accuracy_*``
higher-is-better; ``flip``/``negative_flip``/``kl``/``*_diff``/``ece_*`` lower-is-better).

The allowed metric, statistic and stratum names live in module constants, which the contract
checker uses to validate contracts.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from metrics._checks import short_repr
from metrics.accuracy import accuracy, correct
from metrics.bootstrap import bootstrap_ci
from metrics.bounds import kl_bound, log_ratio_bound, max_abs_log_ratio, score_range, tv_bound
from metrics.calibration import (
    brier_loss,
    calibration_error,
    classwise_calibration_error,
    expected_calibration_error,
    temperature_fits_by_bucket,
)
from metrics.from_logits import kl_columns, nll_column
from metrics.intervals import (BOOTSTRAP_PERCENTILE, CLOPPER_PEARSON, CLOPPER_PEARSON_DIFFERENCE,
                               clopper_pearson, clopper_pearson_difference)
from metrics.temperature_fit import refit_log_ratio
from metrics.drift import (
    abs_score_error,
    action_agreement,
    action_max_abs_diff,
    confidence_drift,
    delta_top_prob,
    entropy_confidence,
    total_variation,
)
from metrics.flips import agreement, negative_flip, positive_flip, top1
from metrics.margin import certified, max_abs_logit_diff, top2_margin
from metrics.ties import human_near_tie, human_top2_gap

#: Per-example bool columns; statistics ``rate`` (mean) and ``count`` (sum). The label-dependent
#: ones (``LABELED_METRICS``) are missing (pandas NA) where the label is unknown, so their rate is
#: over labeled examples (e.g. the negative flip rate of Yan et al.).
BOOL_METRICS = (
    "agreement", "flip", "negative_flip", "positive_flip", "action_agreement",
    "ref_correct", "var_correct", "near_tie", "certified",
    # in-depth checks (columns of ``Evaluation.detail``)
    "epsilon_exceeded", "within_conformal", "certified_conformal", "bound_violation",
    "mask_mismatch", "human_near_tie",
)
LABELED_METRICS = ("negative_flip", "positive_flip", "ref_correct", "var_correct")
#: Per-example float columns; NaN values (no score) are skipped by every statistic.
FLOAT_METRICS = (
    "ref_margin", "max_abs_logit_diff", "kl", "abs_score_error", "action_max_abs_diff",
    # in-depth checks (columns of ``Evaluation.detail``)
    "kl_reverse", "prob_tv", "delta_top_prob", "abs_delta_top_prob", "confidence_drift",
    "action_tv", "log_ratio_max", "action_log_ratio_max",
)
#: Set-level metrics, recomputed on the stratum's rows; statistic ``value`` only. The ``ece_*``
#: and ``accuracy_*`` ones use labeled rows only; the other calibration figures (``ece_mass_*``,
#: ``classwise_ece_*``, ``brier_*``, ``nll_*``, ``ece_width_*``) use the label where known and the
#: reference's top-1 option where not (``Evaluation.targets``).
CALIBRATION_FIGURES = ("ece_width", "ece_mass", "classwise_ece", "brier", "nll")
SET_METRICS = (
    "accuracy_ref", "accuracy_variant", "accuracy_drop",
    "ece_ref", "ece_variant", "ece_delta", "certified_share",
    *(f"{f}_{w}" for f in CALIBRATION_FIGURES for w in ("ref", "variant", "delta")),
    "temperature_refit_log_ratio", "certified_share_conformal", "epsilon_max", "epsilon_conformal",
)
#: Set metrics without a bootstrap interval (constants of the run, or too costly to resample).
NO_CI_METRICS = ("temperature_refit_log_ratio", "epsilon_max", "epsilon_conformal")
#: Set metrics that are the rate of a bool column (set metric -> column): their interval, like
#: that of every bool column's ``rate`` and ``count``, is the exact Clopper–Pearson interval.
BINOMIAL_SET_METRICS = {"certified_share": "certified",
                        "certified_share_conformal": "certified_conformal",
                        "accuracy_ref": "ref_correct", "accuracy_variant": "var_correct"}
#: Per-example columns kept in ``Evaluation.detail`` (``per_example`` keeps the original 20).
DETAIL_METRICS = (
    "epsilon_exceeded", "within_conformal", "certified_conformal", "bound_violation",
    "mask_mismatch", "human_near_tie", "kl_reverse", "prob_tv", "delta_top_prob",
    "abs_delta_top_prob", "confidence_drift", "action_tv", "log_ratio_max", "action_log_ratio_max",
)
METRICS = BOOL_METRICS + FLOAT_METRICS + SET_METRICS

BOOL_STATISTICS = ("rate", "count")
FLOAT_STATISTICS = ("mean", "max", "min", "p50", "p95", "p99", "p90", "p999", "rms")
SET_STATISTICS = ("value",)
STATISTICS = BOOL_STATISTICS + FLOAT_STATISTICS + SET_STATISTICS
#: Allowed statistics of each metric; the first is the default of :meth:`Evaluation.value`.
METRIC_STATISTICS = {
    **{m: BOOL_STATISTICS for m in BOOL_METRICS},
    **{m: FLOAT_STATISTICS for m in FLOAT_METRICS},
    **{m: SET_STATISTICS for m in SET_METRICS},
}

#: Fixed strata; a task stratum is ``TASK_STRATUM_PREFIX + <task name>``, e.g. ``task:sentiment-3``;
#: an option-count stratum ``options:<K>``; a reference-margin bin ``margin:<lo>-<hi>`` (raw logits,
#: lo <= margin < hi, hi may be ``inf``).
STRATA = ("all", "near_tie", "certified", "uncertified", "human_near_tie", "not_near_tie",
          "certified_conformal", "epsilon_held", "labeled")
TASK_STRATUM_PREFIX = "task:"
OPTIONS_STRATUM_PREFIX = "options:"
MARGIN_STRATUM_PREFIX = "margin:"
_MARGIN_RE = re.compile(r"^margin:(\d+(?:\.\d*)?)-(\d+(?:\.\d*)?|inf)$")
_OPTIONS_RE = re.compile(r"^options:(\d+)$")

#: Fields each outputs mapping must provide (names of ``variants.outputs.DecisionOutputs``).
REQUIRED_FIELDS = ("ids", "task", "logits", "option_mask", "probs", "expected_score",
                   "action_probs", "labels")

#: Fields used when present (older outputs or hand-made dicts may lack them).
OPTIONAL_FIELDS = ("temperature", "option_scores", "confidence", "human_dist")

_PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p90": 90.0, "p999": 99.9}


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
        raise ValueError(f"stratum must be a string, got {short_repr(stratum)}.")
    if stratum in STRATA:
        return
    if stratum.startswith(TASK_STRATUM_PREFIX) and len(stratum) > len(TASK_STRATUM_PREFIX):
        return
    if _OPTIONS_RE.match(stratum):
        return
    m = _MARGIN_RE.match(stratum)
    if m and float(m.group(1)) < float(m.group(2)):
        return
    raise ValueError(
        f"unknown stratum {short_repr(stratum)}; use one of {', '.join(STRATA)} or "
        f"'{TASK_STRATUM_PREFIX}<task name>', '{OPTIONS_STRATUM_PREFIX}<K>', "
        f"'{MARGIN_STRATUM_PREFIX}<lo>-<hi>' (e.g. margin:0-0.5, margin:2-inf)."
    )


def check_metric_statistic(metric, statistic):
    """Raise ValueError unless ``metric`` is known and ``statistic`` is allowed for it."""
    if not isinstance(metric, str) or metric not in METRIC_STATISTICS:
        raise ValueError(f"unknown metric {short_repr(metric)}; use one of {', '.join(METRICS)}.")
    allowed = METRIC_STATISTICS[metric]
    if statistic not in allowed:
        raise ValueError(
            f"statistic {short_repr(statistic)} is not allowed for metric {metric!r}; use one of "
            f"{', '.join(allowed)}."
        )


#: Tolerances of the bound check: an observed value counts as above its bound only beyond
#: ``bound + BOUND_ATOL + BOUND_RTOL * bound`` (float32 outputs carry ~1e-7 relative round-off,
#: float32 logits ~1e-7 * |logit| / T).
BOUND_ATOL = 1e-4
BOUND_RTOL = 1e-3


def _rate_stat(values, statistic):
    """``statistic`` of a 1-D float array with no NaN (bool columns as 0/1)."""
    if statistic in ("rate", "mean"):
        return float(values.mean())
    if statistic == "count":
        return float(values.sum())
    if statistic == "max":
        return float(values.max())
    if statistic == "min":
        return float(values.min())
    if statistic == "rms":
        return float(np.sqrt(np.mean(values ** 2)))
    return _percentile(values, _PERCENTILES[statistic])


def _rate_stat_rows(values, statistic):
    """``statistic`` along axis 1 of a (B, n) array (vectorised bootstrap)."""
    if statistic in ("rate", "mean"):
        return values.mean(axis=1)
    if statistic == "count":
        return values.sum(axis=1)
    if statistic == "max":
        return values.max(axis=1)
    if statistic == "min":
        return values.min(axis=1)
    if statistic == "rms":
        return np.sqrt(np.mean(values ** 2, axis=1))
    with np.errstate(invalid="ignore"):
        return np.percentile(values, _PERCENTILES[statistic], axis=1)


def _ece_uniform_batch(conf, hit, weight, idx, n_bins):
    """Equal-width top-label (or one-class) ECE for each resample row of ``idx`` (B, n).

    ``weight`` (N,) of 0/1 selects the rows that count (None = all); NaN where none counts.
    """
    from metrics.calibration import _bin_index

    b = _bin_index(conf, n_bins)
    w = np.ones_like(conf) if weight is None else weight
    n_boot = idx.shape[0]
    flat = (np.arange(n_boot)[:, None] * n_bins + b[idx]).ravel()
    gap = np.bincount(flat, weights=((hit - conf) * w)[idx].ravel(),
                      minlength=n_boot * n_bins).reshape(n_boot, n_bins)
    count = w[idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.abs(gap).sum(axis=1) / count, np.nan)


def _ece_mass_batch(conf, hit, idx, n_bins):
    """Equal-mass top-label ECE for each resample row of ``idx`` (B, n); bins as
    ``numpy.array_split`` of the sorted confidences (as :func:`metrics.calibration._bins`)."""
    n = idx.shape[1]
    if n == 0:
        return np.full(idx.shape[0], np.nan)
    order = np.argsort(conf[idx], axis=1, kind="stable")
    g = np.take_along_axis((hit - conf)[idx], order, axis=1)
    sizes = np.array([len(a) for a in np.array_split(np.arange(n), n_bins)])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])[sizes > 0]
    return np.abs(np.add.reduceat(g, starts, axis=1)).sum(axis=1) / n


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
    detail : pandas.DataFrame
        The in-depth per-example columns (``DETAIL_METRICS``), same rows as ``per_example``.
    epsilon_conformal : float
        Split-conformal ε (raw-logit units); equals ``epsilon`` unless given.
    alpha : float or None
        Miscoverage level of ``epsilon_conformal``.
    human_tie_gap : float
        Rater top-two share gap at or below which an item is a human near tie.
    ref_logits, var_logits : ndarray of shape (N, K), float64
    temperature : ndarray of shape (N,), float64 or None
        Reference temperature per example (None when the outputs have none).
    var_temperature : ndarray of shape (N,), float64 or None
        The variant's own temperature per example (None when its outputs have none).
    targets : ndarray of shape (N,), int64
        Calibration target: the label where known, else the reference's top-1 option.
    """

    per_example: pd.DataFrame
    summary: dict
    epsilon: float
    near_tie_margin: float
    n_bins: int
    ref_probs: np.ndarray = field(repr=False)
    var_probs: np.ndarray = field(repr=False)
    option_mask: np.ndarray = field(repr=False)
    detail: pd.DataFrame = field(default=None, repr=False)
    epsilon_conformal: float = float("nan")
    alpha: float | None = None
    human_tie_gap: float = 0.2
    ref_logits: np.ndarray = field(default=None, repr=False)
    var_logits: np.ndarray = field(default=None, repr=False)
    temperature: np.ndarray = field(default=None, repr=False)
    targets: np.ndarray = field(default=None, repr=False)
    var_temperature: np.ndarray = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    # -- rows and columns -------------------------------------------------------------------
    def rows(self, stratum="all"):
        """Bool mask of shape (N,) selecting ``stratum`` (see ``STRATA``; ``task:<name>``,
        ``options:<K>``, ``margin:<lo>-<hi>``).

        Raises
        ------
        ValueError
            If ``stratum`` is unknown.
        """
        check_stratum(stratum)
        df = self.per_example
        n = len(df)
        if stratum == "all":
            return np.ones(n, dtype=bool)
        if stratum == "near_tie":
            return df["near_tie"].to_numpy(dtype=bool)
        if stratum == "not_near_tie":
            return ~df["near_tie"].to_numpy(dtype=bool)
        if stratum == "certified":
            return df["certified"].to_numpy(dtype=bool)
        if stratum == "uncertified":
            return ~df["certified"].to_numpy(dtype=bool)
        if stratum == "labeled":
            return df["label"].to_numpy() >= 0
        if stratum in ("human_near_tie", "certified_conformal"):
            return self._array(stratum) == 1.0
        if stratum == "epsilon_held":
            return self._array("epsilon_exceeded") == 0.0
        if stratum.startswith(OPTIONS_STRATUM_PREFIX):
            return df["n_options"].to_numpy() == int(stratum[len(OPTIONS_STRATUM_PREFIX):])
        m = _MARGIN_RE.match(stratum)
        if m:
            margin = df["ref_margin"].to_numpy()
            return (margin >= float(m.group(1))) & (margin < float(m.group(2)))
        return (df["task"] == stratum[len(TASK_STRATUM_PREFIX):]).to_numpy()

    def _array(self, metric):
        """Per-example column as float64 (bool as 0/1, missing as NaN), cached."""
        if metric not in self._cache:
            frame = self.detail if metric in DETAIL_METRICS else self.per_example
            col = frame[metric]
            if metric in BOOL_METRICS:
                values = col.astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
            else:
                values = col.to_numpy(dtype=np.float64)
            self._cache[metric] = values
        return self._cache[metric]

    def _column(self, metric, rows):
        """Defined (non-missing) values of a per-example column on ``rows``."""
        values = self._array(metric)[rows]
        values = values[~np.isnan(values)]
        return values.astype(bool) if metric in BOOL_METRICS else values

    def support(self, metric, stratum="all"):
        """Number of examples ``value(metric, stratum, ...)`` is computed over.

        The stratum's size, less rows where the metric is undefined (unknown label for
        ``negative_flip``/``positive_flip``/``*_correct``/``accuracy_*``/``ece_*``; no score for
        ``abs_score_error``; no raters for ``human_top2_gap``).

        Raises
        ------
        ValueError
            If ``metric`` or ``stratum`` is unknown.
        """
        if not isinstance(metric, str) or metric not in METRIC_STATISTICS:
            raise ValueError(f"unknown metric {short_repr(metric)}; use one of "
                             f"{', '.join(METRICS)}.")
        rows = self.rows(stratum)
        if metric in ("accuracy_ref", "accuracy_variant", "accuracy_drop", "ece_ref",
                      "ece_variant", "ece_delta"):
            return int((rows & (self.per_example["label"].to_numpy() >= 0)).sum())
        if metric in SET_METRICS:
            return int(rows.sum())
        return int(np.sum(~np.isnan(self._array(metric)[rows])))

    def value(self, metric, stratum="all", statistic=None):
        """One number: ``statistic`` of ``metric`` over the examples of ``stratum``.

        Parameters
        ----------
        metric : str
            One of ``METRICS``.
        stratum : str, default='all'
            One of ``STRATA``, ``'task:<name>'``, ``'options:<K>'`` or ``'margin:<lo>-<hi>'``.
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
            return self._set_value(metric, np.flatnonzero(rows))
        values = self._array(metric)[rows]
        values = values[~np.isnan(values)]
        if values.size == 0:
            return float("nan")
        return _rate_stat(values, statistic)

    def interval_method(self, metric, statistic=None):
        """Name of the interval :meth:`ci` gives ``metric``: ``"clopper-pearson"`` (``rate`` and
        ``count`` of a bool column, and ``BINOMIAL_SET_METRICS``), ``"clopper-pearson-difference"``
        (``accuracy_drop``: negative minus positive flip rate), ``"bootstrap-percentile"``
        (every other metric) or None (``NO_CI_METRICS``: no interval).

        Raises
        ------
        ValueError
            If the metric or statistic is unknown.
        """
        if statistic is None and metric in METRIC_STATISTICS:
            statistic = METRIC_STATISTICS[metric][0]
        check_metric_statistic(metric, statistic)
        if metric in NO_CI_METRICS:
            return None
        if metric in BOOL_METRICS or metric in BINOMIAL_SET_METRICS:
            return CLOPPER_PEARSON
        if metric == "accuracy_drop":
            return CLOPPER_PEARSON_DIFFERENCE
        return BOOTSTRAP_PERCENTILE

    def ci(self, metric, stratum="all", statistic=None, *, n_boot=1000, confidence=0.95, seed=0):
        """Interval of :meth:`value`, by the method :meth:`interval_method` names.

        Rates of events (``rate`` of a bool column, ``BINOMIAL_SET_METRICS``) get the exact
        Clopper–Pearson interval of k events in the n examples the value is computed over, and
        counts n times it: honest at 0 and n events, where a bootstrap gives zero width (0 of 20
        -> [0, 0.168], not [0, 0]). Everything else gets the percentile bootstrap (examples of
        the stratum resampled, ``n_boot`` times, ``seed``).

        Returns
        -------
        (low, high) : tuple of float
            ``(nan, nan)`` when the value is NaN, ``n_boot`` is 0 (no intervals, either method),
            or the metric is in ``NO_CI_METRICS`` (constants of the run such as ε, or the
            temperature refit).

        References
        ----------
        B. Efron and R. J. Tibshirani, "An Introduction to the Bootstrap", 1993, Ch. 13;
        C. J. Clopper and E. S. Pearson, Biometrika 26 (1934) (:mod:`metrics.intervals`).
        """
        if statistic is None and metric in METRIC_STATISTICS:
            statistic = METRIC_STATISTICS[metric][0]
        check_metric_statistic(metric, statistic)
        nan = (float("nan"), float("nan"))
        if not n_boot or metric in NO_CI_METRICS:
            return nan
        rows = np.flatnonzero(self.rows(stratum))
        if self.interval_method(metric, statistic) == CLOPPER_PEARSON:
            events = self._array(BINOMIAL_SET_METRICS.get(metric, metric))[rows]
            events = events[~np.isnan(events)]
            if events.size == 0:
                return nan
            low, high = clopper_pearson(int(events.sum()), events.size, confidence=confidence)
            return (low * events.size, high * events.size) if statistic == "count" else (low, high)
        if metric == "accuracy_drop":  # negative minus positive flips, over labelled rows
            neg, pos = (self._array(c)[rows] for c in ("negative_flip", "positive_flip"))
            known = ~np.isnan(neg)
            if not known.any():
                return nan
            return clopper_pearson_difference(int(neg[known].sum()), int(pos[known].sum()),
                                              int(known.sum()), confidence=confidence)
        if metric in SET_METRICS:
            return bootstrap_ci(lambda idx: self._set_values_batch(metric, rows[idx]), rows.size,
                                n_boot=n_boot, confidence=confidence, seed=seed, vectorized=True)
        values = self._array(metric)[rows]
        values = values[~np.isnan(values)]
        if values.size == 0:
            return nan
        if statistic in ("max", "min") or np.isinf(values).any():
            return bootstrap_ci(lambda i: _rate_stat(values[i], statistic), values.size,
                                n_boot=n_boot, confidence=confidence, seed=seed)
        return bootstrap_ci(lambda idx: _rate_stat_rows(values[idx], statistic), values.size,
                            n_boot=n_boot, confidence=confidence, seed=seed, vectorized=True)

    def skip_reason(self, metric, stratum="all"):
        """Why :meth:`value` of ``metric`` on ``stratum`` is NaN although the stratum has
        examples, or "" (a number, or an empty stratum: "no examples").

        Today only ``temperature_refit_log_ratio`` has one: a refit that ran to a bound or did
        not converge, e.g. "temperature refit at bound (T=1000) on bucket K=3 (reference)".
        """
        if metric != "temperature_refit_log_ratio":
            return ""
        rows = np.flatnonzero(self.rows(stratum))
        if rows.size == 0 or not np.isnan(self._set_value(metric, rows)):
            return ""
        return self._cache[("refit", rows.tobytes())][1]

    def _parts(self, which):
        """Per-example pieces of the set-level metrics of ``which`` ('ref' or 'variant'), cached:
        top-label confidence and hit (against ``targets`` and against labels), Brier and NLL
        terms, probabilities on valid options."""
        key = ("parts", which)
        if key not in self._cache:
            p = self.ref_probs if which == "ref" else self.var_probs
            logits = self.ref_logits if which == "ref" else self.var_logits
            t = self.temperature if which == "ref" else self.var_temperature
            mask = self.option_mask
            p = np.where(mask, p, 0.0)
            z = np.where(mask, p, -np.inf)
            pred = np.argmax(z, axis=1)
            rows = np.arange(p.shape[0])
            conf = np.minimum(p[rows, pred], 1.0)
            labels = self.per_example["label"].to_numpy()
            onehot = np.zeros_like(p)
            onehot[rows, self.targets] = 1.0
            self._cache[key] = {
                "probs": p, "conf": conf, "hit": (pred == self.targets).astype(np.float64),
                "known": (labels >= 0).astype(np.float64),
                "label_hit": ((pred == labels) & (labels >= 0)).astype(np.float64),
                "brier": np.where(mask, (p - onehot) ** 2, 0.0).sum(axis=1),
                "nll": nll_column(p if logits is None else logits, p, self.targets, mask, t),
            }
        return self._cache[key]

    def _set_values_batch(self, metric, idx):
        """Set-level ``metric`` on each row of ``idx`` (B, n) at once (bootstrap resamples).

        Agrees with :meth:`_set_value` row by row (tested); metrics without a vectorised form
        fall back to a loop.
        """
        idx = np.atleast_2d(idx)
        if metric in NO_CI_METRICS:
            return np.array([self._set_value(metric, i) for i in idx])
        df = self.per_example
        if metric in ("certified_share", "certified_share_conformal"):
            col = "certified" if metric == "certified_share" else "certified_conformal"
            return self._array(col)[idx].mean(axis=1)
        if metric.startswith("accuracy_"):
            labels = df["label"].to_numpy()
            known = (labels >= 0).astype(np.float64)[idx]
            n = known.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                acc = {w: (self._array(c)[idx] == 1.0).sum(axis=1) / np.where(n > 0, n, np.nan)
                       for w, c in (("ref", "ref_correct"), ("variant", "var_correct"))}
            return {"accuracy_ref": acc["ref"], "accuracy_variant": acc["variant"],
                    "accuracy_drop": acc["ref"] - acc["variant"]}[metric]
        if metric in ("ece_ref", "ece_variant", "ece_delta"):
            figure, which = "ece_labels", metric.split("_", 1)[1]
        else:
            figure, which = metric.rsplit("_", 1)

        def one(w):
            part = self._parts(w)
            if figure in ("brier", "nll"):
                return part[figure][idx].mean(axis=1)
            if figure == "ece_labels":
                return _ece_uniform_batch(part["conf"], part["label_hit"], part["known"], idx,
                                          self.n_bins)
            if figure == "ece_width":
                return _ece_uniform_batch(part["conf"], part["hit"], None, idx, self.n_bins)
            if figure == "ece_mass":
                return _ece_mass_batch(part["conf"], part["hit"], idx, self.n_bins)
            per_class = []
            for k in range(self.option_mask.shape[1]):
                valid = self.option_mask[:, k].astype(np.float64)
                conf = np.minimum(part["probs"][:, k], 1.0)
                hit = (self.targets == k).astype(np.float64)
                per_class.append(_ece_uniform_batch(conf, hit, valid, idx, self.n_bins))
            with np.errstate(invalid="ignore"):
                stacked = np.stack(per_class, axis=1)
                ok = ~np.isnan(stacked)
                return np.where(ok.any(axis=1), np.nansum(stacked, axis=1) / np.maximum(ok.sum(axis=1), 1), np.nan)

        if which == "ref":
            return one("ref")
        if which == "variant":
            return one("variant")
        return one("variant") - one("ref")

    def _set_value(self, metric, idx):
        """Set-level ``metric`` on the rows ``idx`` (int array, repeats allowed)."""
        df = self.per_example
        if metric == "epsilon_max":
            return self.epsilon
        if metric == "epsilon_conformal":
            return self.epsilon_conformal
        if idx.size == 0:
            return float("nan")
        if metric == "certified_share":
            return float(df["certified"].to_numpy(dtype=bool)[idx].mean())
        if metric == "certified_share_conformal":
            return float(self._array("certified_conformal")[idx].mean())
        labels = df["label"].to_numpy()[idx]
        if metric.startswith("accuracy_"):
            acc_ref = accuracy(df["ref_pred"].to_numpy()[idx], labels)
            acc_var = accuracy(df["var_pred"].to_numpy()[idx], labels)
            return {"accuracy_ref": acc_ref, "accuracy_variant": acc_var,
                    "accuracy_drop": acc_ref - acc_var}[metric]
        mask = self.option_mask[idx]
        if metric in ("ece_ref", "ece_variant", "ece_delta"):
            ece_ref = expected_calibration_error(self.ref_probs[idx], labels, mask, n_bins=self.n_bins)
            ece_var = expected_calibration_error(self.var_probs[idx], labels, mask, n_bins=self.n_bins)
            return {"ece_ref": ece_ref, "ece_variant": ece_var, "ece_delta": ece_var - ece_ref}[metric]
        targets = self.targets[idx]
        if metric == "temperature_refit_log_ratio":
            # |n-weighted mean over buckets of log(T_var / T_ref)|: a systematic change of the
            # logit scale moves every bucket alike and survives the mean, while the refit noise
            # of small buckets (e.g. +/-4% at n = 200) averages out instead of deciding alone.
            # NaN (reason in skip_reason) when a refit ran to a bound or did not converge.
            key = ("refit", idx.tobytes())
            if key not in self._cache:
                self._cache[key] = refit_log_ratio(self.ref_logits[idx], self.var_logits[idx],
                                                   targets, mask)
            return self._cache[key][0]
        figure, which = metric.rsplit("_", 1)
        if figure == "nll":
            ref, var = (self._parts(w)["nll"][idx].mean() for w in ("ref", "variant"))
            return float({"ref": ref, "variant": var, "delta": var - ref}[which])
        fn = {
            "ece_width": lambda p: calibration_error(p, targets, mask, n_bins=self.n_bins),
            "ece_mass": lambda p: calibration_error(p, targets, mask, n_bins=self.n_bins,
                                                    strategy="quantile"),
            "classwise_ece": lambda p: classwise_calibration_error(p, targets, mask, n_bins=self.n_bins),
            "brier": lambda p: brier_loss(p, targets, mask),
        }[figure]
        if which == "ref":
            return fn(self.ref_probs[idx])
        if which == "variant":
            return fn(self.var_probs[idx])
        return fn(self.var_probs[idx]) - fn(self.ref_probs[idx])

    # -- tables for reports -----------------------------------------------------------------
    def temperature_table(self):
        """Per option-count bucket: deployed T, T refitted (NLL) for reference and variant, and
        the variant's ECE at the deployed and at its refitted temperature.

        Returns
        -------
        pandas.DataFrame
            Columns ``n_options``, ``n``, ``T_deployed``, ``T_refit_ref``, ``T_refit_variant``,
            ``ece_variant``, ``ece_variant_refit`` (equal-width, targets as ``self.targets``),
            ``refit_status_ref``, ``refit_status_variant`` ("converged", "at_bound",
            "not_converged"; see :mod:`metrics.temperature_fit`).
        """
        rows = []
        k = self.option_mask.sum(axis=1)
        fits_ref = temperature_fits_by_bucket(self.ref_logits, self.targets, self.option_mask)
        fits_var = temperature_fits_by_bucket(self.var_logits, self.targets, self.option_mask)
        t_ref = {kk: f.temperature for kk, f in fits_ref.items()}
        t_var = {kk: f.temperature for kk, f in fits_var.items()}
        for kk in sorted(t_ref):
            sel = k == kk
            mask = self.option_mask[sel]
            t_dep = float(np.median(self.temperature[sel])) if self.temperature is not None else np.nan
            ece_refit = np.nan
            if np.isfinite(t_var[kk]):
                z = np.where(mask, self.var_logits[sel] / t_var[kk], -np.inf)
                e = np.where(mask, np.exp(z - z.max(axis=1, keepdims=True)), 0.0)
                ece_refit = calibration_error(e / e.sum(axis=1, keepdims=True), self.targets[sel],
                                              mask, n_bins=self.n_bins)
            rows.append({"n_options": int(kk), "n": int(sel.sum()), "T_deployed": t_dep,
                         "T_refit_ref": t_ref[kk], "T_refit_variant": t_var[kk],
                         "ece_variant": calibration_error(self.var_probs[sel], self.targets[sel],
                                                          mask, n_bins=self.n_bins),
                         "ece_variant_refit": ece_refit,
                         "refit_status_ref": fits_ref[kk].status,
                         "refit_status_variant": fits_var[kk].status})
        return pd.DataFrame(rows)

    def bounds_table(self, epsilon=None):
        """Certified bounds implied by ``epsilon`` per temperature bucket, beside the observed
        worst case on the examples where ``epsilon`` held (``max|Δlogit| <= epsilon``).

        Parameters
        ----------
        epsilon : float, optional
            Default ``self.epsilon`` (the certificate's ε).

        Returns
        -------
        pandas.DataFrame
            One row per (option count, temperature): ``n_options``, ``T``, ``n_held`` (rows where
            ε held), ``2eps_over_T``, and for each quantity a ``*_bound`` and ``*_observed`` pair:
            ``log_ratio`` (options; ratio bound = exp of it), ``action_log_ratio``, ``tv``,
            ``kl``, ``score`` (|Δ expected score|, bound uses the bucket's widest score range),
            plus ``violated`` (names of quantities whose observed value exceeds the bound). Empty
            when the outputs carry no temperature.
        """
        if self.temperature is None:
            return pd.DataFrame()
        eps = self.epsilon if epsilon is None else float(epsilon)
        d, df = self.detail, self.per_example
        held = df["max_abs_logit_diff"].to_numpy() <= eps
        rows = []
        keys = np.stack([df["n_options"].to_numpy(), np.round(self.temperature, 6)], axis=1)
        for k, t in sorted({tuple(x) for x in keys.tolist()}):
            sel = (keys[:, 0] == k) & (keys[:, 1] == t) & held
            b = float(log_ratio_bound(eps, t))
            srange = np.nanmax(d["score_range"].to_numpy()[sel]) if sel.any() and \
                np.isfinite(d["score_range"].to_numpy()[sel]).any() else np.nan

            def worst(col):
                v = (d[col] if col in d else df[col]).to_numpy(dtype=np.float64)[sel]
                v = v[~np.isnan(v)]
                return float(v.max()) if v.size else np.nan

            row = {"n_options": int(k), "T": float(t), "n_held": int(sel.sum()), "2eps_over_T": b,
                   "log_ratio_bound": b, "log_ratio_observed": worst("log_ratio_max"),
                   "action_log_ratio_bound": b, "action_log_ratio_observed": worst("action_log_ratio_max"),
                   "tv_bound": float(tv_bound(eps, t)), "tv_observed": worst("prob_tv"),
                   "kl_bound": float(kl_bound(eps, t)), "kl_observed": worst("kl"),
                   "score_bound": float(tv_bound(eps, t)) * srange,
                   "score_observed": worst("abs_score_error")}
            row["violated"] = ",".join(
                q for q in ("log_ratio", "action_log_ratio", "tv", "kl", "score")
                if row[f"{q}_observed"] > row[f"{q}_bound"] + BOUND_ATOL + BOUND_RTOL * row[f"{q}_bound"])
            rows.append(row)
        return pd.DataFrame(rows)


def _optional(outputs, name):
    try:
        value = outputs[name] if isinstance(outputs, Mapping) else getattr(outputs, name)
    except (KeyError, AttributeError):
        return None
    return None if value is None else np.asarray(value)


def evaluate(ref, var, *, epsilon, near_tie_margin=1.0, n_bins=15, epsilon_conformal=None,
             alpha=None, human_tie_gap=0.2):
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
    near_tie_margin : float, default=1.0
        An example is a near tie when the reference's raw top-two margin is below this.
    n_bins : int, default=15
        Bins of the expected calibration errors.
    epsilon_conformal : float, optional
        Split-conformal ε (:func:`metrics.conformal.conformal_quantile` on the calibration
        split); default ``epsilon``.
    alpha : float, optional
        Its miscoverage level (recorded in the summary).
    human_tie_gap : float, default=0.2
        An item is a human near tie when its raters' top-two share gap is at most this.

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
        ``human_top2_gap``.

        ``summary`` keys: ``n_examples``, ``agreement``, ``flip_rate``, ``negative_flips``,
        ``positive_flips`` (counts), ``accuracy_ref``, ``accuracy_variant``, ``kl_mean``,
        ``kl_p50``, ``kl_p95``, ``kl_p99``, ``kl_max``, ``max_abs_logit_diff_max``, ``epsilon``,
        ``certified_share``, ``certified_flips`` (count), ``certified_flip_ids`` (list of str;
        non-empty means ε was exceeded on these examples), ``ece_ref``, ``ece_variant``,
        ``ece_delta`` (variant - ref), ``score_abs_err_mean``, ``score_abs_err_max`` (NaN when no
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

    max_diff = max_abs_logit_diff(r["logits"], v["logits"], mask)
    temperature, var_temperature = _optional(ref, "temperature"), _optional(var, "temperature")
    if temperature is not None:
        temperature = temperature.astype(np.float64)
    if var_temperature is not None:
        var_temperature = var_temperature.astype(np.float64)
    # exact from logits / own T where the probabilities are their softmax (metrics.from_logits)
    kl, kl_rev, _ = kl_columns(r["logits"], v["logits"], r["probs"],
                               np.where(mask, v["probs"], 0.0), mask, temperature, var_temperature)
    score_err = abs_score_error(r["expected_score"], v["expected_score"])
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
        "max_abs_logit_diff": max_diff,
        "kl": kl,
        "abs_score_error": score_err,
        "action_max_abs_diff": action_max_abs_diff(r["action_probs"], v["action_probs"]),
        "action_agreement": action_agreement(r["action_probs"], v["action_probs"]),
        "ref_correct": labeled(correct(ref_pred, labels)),
        "var_correct": labeled(correct(var_pred, labels)),
        "near_tie": margin < near_tie_margin,
        "certified": cert,
    })

    # -- in-depth columns -------------------------------------------------------------------
    ref_probs = r["probs"].astype(np.float64)
    var_probs = np.where(mask, v["probs"].astype(np.float64), 0.0)
    log_ratio = max_abs_log_ratio(ref_probs, var_probs, mask)
    action_log_ratio = max_abs_log_ratio(r["action_probs"], v["action_probs"])
    prob_tv = total_variation(np.where(mask, ref_probs, 0.0), var_probs)
    scores = _optional(ref, "option_scores")
    srange = score_range(scores, mask) if scores is not None else np.full(n, np.nan)
    if temperature is not None:
        own = log_ratio_bound(max_diff, temperature)  # what each example's own drift allows
        tol = BOUND_ATOL + BOUND_RTOL * own
        tvb = tv_bound(max_diff, temperature)
        over_score = np.nan_to_num(score_err - tvb * srange, nan=-np.inf) > BOUND_ATOL * (1 + np.nan_to_num(srange))
        violation = ((log_ratio > own + tol) | (action_log_ratio > own + tol)
                     | (prob_tv > tvb + tol) | (kl > own + tol) | over_score)
    else:
        own = np.full(n, np.nan)
        violation = np.zeros(n, dtype=bool)
    human = _optional(ref, "human_dist")
    gap = human_top2_gap(human, mask) if human is not None else np.full(n, np.nan)
    ref_conf, var_conf = _optional(ref, "confidence"), _optional(var, "confidence")
    if ref_conf is None or var_conf is None:  # not saved: derive from the probabilities
        ref_conf, var_conf = entropy_confidence(ref_probs, mask), entropy_confidence(var_probs, mask)
    conf_drift = confidence_drift(ref_conf, var_conf)
    dtop = delta_top_prob(ref_probs, var_probs, mask)
    detail = pd.DataFrame({
        "epsilon_exceeded": max_diff > float(epsilon),
        "within_conformal": max_diff <= epsilon_conformal,
        "certified_conformal": certified(margin, epsilon_conformal),
        "bound_violation": violation,
        "mask_mismatch": (v["option_mask"] != mask).any(axis=1),
        "human_near_tie": human_near_tie(gap, tie_gap=human_tie_gap),
        "kl_reverse": kl_rev,
        "prob_tv": prob_tv,
        "delta_top_prob": dtop,
        "abs_delta_top_prob": np.abs(dtop),
        "confidence_drift": conf_drift,
        "action_tv": total_variation(r["action_probs"], v["action_probs"]),
        "log_ratio_max": log_ratio,
        "action_log_ratio_max": action_log_ratio,
        "human_top2_gap": gap,
        "score_range": srange,
        "log_ratio_bound": own,
    })
    evaluation = Evaluation(
        per_example=df, summary={}, epsilon=float(epsilon), near_tie_margin=near_tie_margin,
        n_bins=int(n_bins), ref_probs=ref_probs, var_probs=var_probs, option_mask=mask,
        detail=detail, epsilon_conformal=epsilon_conformal,
        alpha=None if alpha is None else float(alpha), human_tie_gap=float(human_tie_gap),
        ref_logits=r["logits"].astype(np.float64), var_logits=v["logits"].astype(np.float64),
        temperature=temperature, targets=np.where(known, labels, ref_pred).astype(np.int64),
        var_temperature=var_temperature,
    )
    evaluation.summary = _summarise(evaluation)
    return evaluation


def _nan_stat(values, fn):
    values = values[~np.isnan(values)]
    return float(fn(values)) if values.size else float("nan")


def _summarise(ev):
    df, d = ev.per_example, ev.detail
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
        # in-depth checks
        "epsilon_conformal": ev.epsilon_conformal,
        "alpha": ev.alpha,
        "conformal_coverage": value("within_conformal", statistic="rate"),
        "certified_share_conformal": value("certified_share_conformal"),
        "certified_conformal_flips": int((flips & d["certified_conformal"].to_numpy()).sum()),
        "epsilon_exceeded_ids": df["id"][d["epsilon_exceeded"].to_numpy()].astype(str).tolist(),
        "bound_violations": int(d["bound_violation"].sum()),
        "mask_mismatches": int(d["mask_mismatch"].sum()),
        "kl_reverse_mean": value("kl_reverse", statistic="mean"),
        "prob_tv_max": value("prob_tv", statistic="max"),
        "action_tv_max": value("action_tv", statistic="max"),
        "abs_delta_top_prob_p95": value("abs_delta_top_prob", statistic="p95"),
        "confidence_drift_max": _nan_stat(d["confidence_drift"].to_numpy(), np.max),
        "n_human_near_tie": int(d["human_near_tie"].sum()),
        "human_near_tie_flip_rate": value("flip", "human_near_tie", "rate"),
        "brier_ref": value("brier_ref"),
        "brier_variant": value("brier_variant"),
        "nll_ref": value("nll_ref"),
        "nll_variant": value("nll_variant"),
        "ece_mass_ref": value("ece_mass_ref"),
        "ece_mass_variant": value("ece_mass_variant"),
        "classwise_ece_ref": value("classwise_ece_ref"),
        "classwise_ece_variant": value("classwise_ece_variant"),
        "temperature_refit_log_ratio": value("temperature_refit_log_ratio"),
    }

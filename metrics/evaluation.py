"""The result of :func:`metrics.evaluate.evaluate`: per-example columns plus what is needed to
recompute any registered metric on any stratum, with its interval.

Which metrics exist, their statistics and interval methods: :mod:`metrics.registry`; strata:
:mod:`metrics.strata`; set-level computations: :mod:`metrics.set_metrics`.
"""

from dataclasses import dataclass, field

import hashlib

import numpy as np
import pandas as pd

from metrics.bootstrap import bootstrap_ci
from metrics.defaults import HUMAN_TIE_GAP
from metrics.evaluation_tables import EvaluationTables
from metrics.intervals import CLOPPER_PEARSON, TANGO_PAIRED, clopper_pearson
from metrics.paired import tango_interval
from metrics.registry import BOOL, REGISTRY, SET, resolve_statistic, spec
from metrics.statistics import column_statistic, column_statistic_rows
from metrics.strata import stratum_rows

#: The ``finite-outputs`` clause's metric (:mod:`metrics.finite`).
NONFINITE = "nonfinite_rows"


@dataclass
class Evaluation(EvaluationTables):
    """Result of :func:`metrics.evaluate.evaluate`.

    Attributes
    ----------
    per_example : pandas.DataFrame
        One row per example (columns listed in :func:`metrics.evaluate.evaluate`).
    summary : dict
        Named numbers for reports (see :func:`metrics.evaluate.evaluate`).
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
    numerical_noise : float
        The reference's own numerical noise (raw-logit units, run.json ``reference_noise``):
        rows whose reference margin is at most ``NUMERICAL_TIE_MULTIPLE`` times it are the
        ``numerical_tie`` stratum; 0 when not measured (only exact ties are numerical ties).
    nonfinite : dict
        The variant's rows with NaN or inf outputs, left out of every other metric
        (:func:`runs.judge.judge_outputs`, :mod:`metrics.finite`): ``{"eval": [ids],
        "calibration": [ids], "rows": rows checked on both splits}``; {} = none checked.
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
    human_tie_gap: float = HUMAN_TIE_GAP
    ref_logits: np.ndarray = field(default=None, repr=False)
    var_logits: np.ndarray = field(default=None, repr=False)
    temperature: np.ndarray = field(default=None, repr=False)
    targets: np.ndarray = field(default=None, repr=False)
    var_temperature: np.ndarray = field(default=None, repr=False)
    numerical_noise: float = 0.0
    nonfinite: dict = field(default_factory=dict, repr=False)
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
        return stratum_rows(self, stratum)

    def _array(self, metric):
        """Per-example column as float64 (bool as 0/1, missing as NaN), cached."""
        if metric not in self._cache:
            s = spec(metric)
            col = (self.detail if s.detail else self.per_example)[metric]
            if s.kind == BOOL:
                values = col.astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
            else:
                values = col.to_numpy(dtype=np.float64)
            self._cache[metric] = values
        return self._cache[metric]

    def _column(self, metric, rows):
        """Defined (non-missing) values of a per-example column on ``rows``."""
        values = self._array(metric)[rows]
        values = values[~np.isnan(values)]
        return values.astype(bool) if spec(metric).kind == BOOL else values

    def support(self, metric, stratum="all"):
        """Number of examples ``value(metric, stratum, ...)`` is computed over.

        The stratum's size, less rows where the metric is undefined (``MetricSpec.undefined``:
        unknown label for ``negative_flip``/``positive_flip``/``*_correct``/``accuracy_*``/
        ``ece_*``; no score for ``abs_score_error``).

        Raises
        ------
        ValueError
            If ``metric`` or ``stratum`` is unknown.
        """
        s = spec(metric)
        rows = self.rows(stratum)
        if metric == NONFINITE:  # the rows checked, both splits, those left out included
            return int(self.nonfinite.get("rows", rows.size))
        if s.kind == SET and s.needs_labels:
            return int((rows & (self.per_example["label"].to_numpy() >= 0)).sum())
        if s.kind == SET:
            return int(rows.sum())
        return int(np.sum(~np.isnan(self._array(metric)[rows])))

    def value(self, metric, stratum="all", statistic=None):
        """One number: ``statistic`` of ``metric`` over the examples of ``stratum``.

        Parameters
        ----------
        metric : str
            One of ``METRICS`` (:mod:`metrics.registry`).
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
        statistic = resolve_statistic(metric, statistic)
        rows = self.rows(stratum)
        if metric == NONFINITE:  # rows outside the evaluation: the same on every stratum
            return float(self.n_nonfinite)
        if not rows.any():
            return float("nan")
        s = spec(metric)
        if s.kind == SET:
            return s.value(self, np.flatnonzero(rows))
        values = self._array(metric)[rows]
        values = values[~np.isnan(values)]
        if values.size == 0:
            return float("nan")
        return column_statistic(values, statistic)

    def interval_method(self, metric, statistic=None):
        """Name of the interval :meth:`ci` gives ``metric`` (``MetricSpec.interval``):
        ``"clopper-pearson"`` (``rate`` and ``count`` of a bool column, and set metrics that are
        a rate of one), ``"tango-paired-score"`` (``accuracy_drop``: negative minus positive
        flip rate, :func:`metrics.paired.tango_interval`), ``"bootstrap-percentile"`` (every other metric) or None.

        Raises
        ------
        ValueError
            If the metric or statistic is unknown.
        """
        resolve_statistic(metric, statistic)
        return spec(metric).interval

    def ci(self, metric, stratum="all", statistic=None, *, n_boot=1000, confidence=0.95, seed=0):
        """Interval of :meth:`value`, by the method :meth:`interval_method` names.

        Rates of events (``rate`` of a bool column, set metrics with ``MetricSpec.events``) get
        the exact Clopper–Pearson interval of k events in the n examples the value is computed
        over, and counts n times it: honest at 0 and n events, where a bootstrap gives zero width
        (0 of 20 -> [0, 0.168], not [0, 0]). A difference of two such rates on the same rows
        (``accuracy_drop``) gets Tango's score interval (0 and 0 of 20 -> +-0.161). Everything
        else gets the percentile bootstrap
        (examples of the stratum resampled, ``n_boot`` times, ``seed``); a set metric is
        recomputed on all resamples at once by its one vectorised definition.

        Returns
        -------
        (low, high) : tuple of float
            ``(nan, nan)`` when the value is NaN, ``n_boot`` is 0 (no intervals, either method),
            or the metric has no interval (constants of the run such as ε, or the temperature
            refit).

        References
        ----------
        B. Efron and R. J. Tibshirani, "An Introduction to the Bootstrap", 1993, Ch. 13;
        C. J. Clopper and E. S. Pearson, Biometrika 26 (1934) (:mod:`metrics.intervals`);
        T. Tango, Statistics in Medicine 17 (1998) 891–908 (:mod:`metrics.paired`).
        """
        statistic = resolve_statistic(metric, statistic)
        s = spec(metric)
        nan = (float("nan"), float("nan"))
        if not n_boot or s.interval is None:
            return nan
        rows = np.flatnonzero(self.rows(stratum))
        if s.interval == CLOPPER_PEARSON:
            events = self._array(s.events or metric)[rows]
            events = events[~np.isnan(events)]
            if events.size == 0:
                return nan
            low, high = clopper_pearson(int(events.sum()), events.size, confidence=confidence)
            return (low * events.size, high * events.size) if statistic == "count" else (low, high)
        if s.interval == TANGO_PAIRED:  # e.g. negative minus positive flips
            b, c = (self._array(col)[rows] for col in s.difference_of)
            known = ~np.isnan(b)
            if not known.any():
                return nan
            return tango_interval(int(b[known].sum()), int(c[known].sum()), int(known.sum()),
                                  confidence=confidence)
        if s.kind == SET:
            return bootstrap_ci(lambda idx: self._resampled(metric, stratum, rows, idx, seed),
                                rows.size, n_boot=n_boot, confidence=confidence, seed=seed,
                                vectorized=True)
        values = self._array(metric)[rows]
        values = values[~np.isnan(values)]
        if values.size == 0:
            return nan
        if statistic in ("max", "min") or np.isinf(values).any():
            return bootstrap_ci(lambda i: column_statistic(values[i], statistic), values.size,
                                n_boot=n_boot, confidence=confidence, seed=seed)
        return bootstrap_ci(lambda idx: column_statistic_rows(values[idx], statistic), values.size,
                            n_boot=n_boot, confidence=confidence, seed=seed, vectorized=True)

    def _resampled(self, metric, stratum, rows, idx, seed):
        """(B,) values of set metric ``metric`` on the resamples ``rows[idx]`` of ``stratum``,
        cached per (metric, stratum, resamples): a ``<figure>_delta`` reuses its ``_variant`` and
        ``_ref`` values (their difference, the same arithmetic as its own definition), so the
        calibration table and the clauses resample each figure once."""
        key = ("resampled", metric, stratum, idx.shape, repr(seed))
        if key not in self._cache:
            base = metric[:-len("_delta")] if metric.endswith("_delta") else None
            if base and f"{base}_variant" in REGISTRY and f"{base}_ref" in REGISTRY:
                self._cache[key] = (self._resampled(f"{base}_variant", stratum, rows, idx, seed)
                                    - self._resampled(f"{base}_ref", stratum, rows, idx, seed))
            elif metric.endswith("_ref") and f"{metric[:-4]}_delta" in REGISTRY:
                # a reference calibration figure: the same for every variant of a run (same
                # reference outputs, rows and resamples), so computed once per run
                ref_key = (metric, idx.shape, repr(seed), _digest(rows), _reference_digest(self))
                if ref_key not in _REFERENCE_RESAMPLED:
                    if len(_REFERENCE_RESAMPLED) >= 256:
                        _REFERENCE_RESAMPLED.clear()
                    values = np.asarray(spec(metric).compute(self, rows[idx]))
                    values.flags.writeable = False  # shared: never changed in place
                    _REFERENCE_RESAMPLED[ref_key] = values
                self._cache[key] = _REFERENCE_RESAMPLED[ref_key]
            else:
                self._cache[key] = spec(metric).compute(self, rows[idx])
        return self._cache[key]

    def skip_reason(self, metric, stratum="all"):
        """Why :meth:`value` of ``metric`` on ``stratum`` is NaN although the stratum has
        examples, or "" (a number, or an empty stratum: "no examples").

        When every eval row has NaN or inf outputs: "every row has NaN or inf outputs
        (finite-outputs)". A regression metric relative to a reference whose values are
        constant (:func:`metrics.regression.undefined_reason`). Else only
        ``temperature_refit_log_ratio`` has one: the reference's refit ran to a bound
        or did not converge, e.g. "temperature refit at bound (T=1000) on bucket K=3
        (reference)" (the variant's alone: :meth:`fail_reason`).
        """
        if self.nonfinite.get("eval") and len(self.per_example) == 0:
            return "every row has NaN or inf outputs (finite-outputs)"
        if spec(metric).outputs == "regression":  # metrics.regression: a constant reference
            from metrics.regression import undefined_reason

            return undefined_reason(self, metric, self.rows(stratum))
        refit = self._refit(metric, stratum)
        if refit is None or refit.fails or not np.isnan(refit.value):
            return ""
        return refit.reason

    @property
    def n_nonfinite(self):
        """Rows of the variant with NaN or inf outputs, eval and calibration (see
        ``nonfinite``)."""
        return sum(len(self.nonfinite.get(split, ())) for split in ("eval", "calibration"))

    def nonfinite_text(self):
        """"NaN or inf outputs on 3 eval rows (ids a, b, c) and 1 calibration row (id d)", or ""."""
        parts = []
        for split in ("eval", "calibration"):
            ids = list(self.nonfinite.get(split, ()))
            if ids:
                shown = ", ".join(map(str, ids[:5])) + (", …" if len(ids) > 5 else "")
                parts.append(f"{len(ids)} {split} row{'s' if len(ids) > 1 else ''} "
                             f"(id{'s' if len(ids) > 1 else ''} {shown})")
        return "NaN or inf outputs on " + " and ".join(parts) if parts else ""

    def fail_reason(self, metric, stratum="all"):
        """Why a clause on ``metric`` over ``stratum`` fails whatever its value, or "".

        ``nonfinite_rows`` (the ``finite-outputs`` clause) fails with :meth:`nonfinite_text`
        when the variant has rows with NaN or inf outputs; ``value_spearman`` when the
        variant's values are constant where the reference's vary
        (:func:`metrics.regression.failure_reason`). Else only
        ``temperature_refit_log_ratio`` has one: the variant's refit ran to a bound
        or did not converge where the reference's converged (the variant needs a temperature
        outside what the deployed ones can be), e.g. "the variant's temperature refit ran to
        the bound (T=1000) on bucket K=3 while the reference's converged (T=0.52): a shift of
        at least 7.56 there" (:func:`metrics.temperature_fit.refit_log_ratio`).
        """
        if metric == NONFINITE:
            return self.nonfinite_text()
        if spec(metric).outputs == "regression":  # metrics.regression: a constant variant
            from metrics.regression import failure_reason

            return failure_reason(self, metric, self.rows(stratum))
        refit = self._refit(metric, stratum)
        return refit.reason if refit is not None and refit.fails else ""

    def _refit(self, metric, stratum):
        """The :class:`metrics.temperature_fit.RefitLogRatio` behind ``metric`` on ``stratum``
        (None for other metrics and for an empty stratum)."""
        if metric != "temperature_refit_log_ratio":
            return None
        rows = np.flatnonzero(self.rows(stratum))
        if rows.size == 0:
            return None
        self.value(metric, stratum)  # computes and caches the refit
        return self._cache[("refit", rows.tobytes())]


#: Resampled reference calibration figures, shared by the evaluations of one run's variants
#: (keyed by the digest of everything they are computed from; bounded).
_REFERENCE_RESAMPLED = {}


def _digest(*arrays):
    """SHA-1 of arrays' dtypes, shapes and bytes: a cache key part."""
    h = hashlib.sha1()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _reference_digest(ev):
    """Digest of what the reference's set-level figures read: its per-example parts
    (:func:`metrics.set_metrics.parts`), the option mask, the targets and the bin count."""
    key = ("reference_digest",)
    if key not in ev._cache:
        from metrics.set_metrics import parts

        part = parts(ev, "ref")
        ev._cache[key] = _digest(*(part[k] for k in sorted(part)), ev.option_mask, ev.targets,
                                 np.asarray(ev.n_bins))
    return ev._cache[key]

"""The metric registry: one :class:`MetricSpec` per metric a contract clause can name.

Every fact about a metric lives here: its kind (per-example bool or float column, or set-level),
where its column lives, its set-level computation, the statistics it allows (the first is the
default), its interval method, whether higher is better, whether it needs labels, and where it is
undefined. :class:`metrics.evaluation.Evaluation`, :mod:`contracts.checker` and the reports read
this table; the old tuples (``BOOL_METRICS``, ``SET_METRICS``, ``METRIC_STATISTICS``, ...) are
views of it. Adding a metric is one line in ``_SPECS`` (plus its column in
:mod:`metrics.columns` or its function in :mod:`metrics.set_metrics`).

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; every other
metric's direction is its ``higher_is_better`` here (None: a property of the reference or a
signed quantity, no direction).
"""

from collections.abc import Callable
from dataclasses import dataclass

import metrics.multilabel as ml
import metrics.regression as rg
import metrics.set_metrics as sm
from metrics._checks import short_repr
from metrics.intervals import BOOTSTRAP_PERCENTILE, CLOPPER_PEARSON, TANGO_PAIRED
from metrics.statistics import BOOL_STATISTICS, FLOAT_STATISTICS, SET_STATISTICS

BOOL, FLOAT, SET = "bool", "float", "set"
KINDS = (BOOL, FLOAT, SET)
#: What a model's logits are (``variants.models.head_output``): a softmax over options (every
#: logits kind, and single-label classifier heads), one sigmoid per label (multi-label heads),
#: or one output value (regression heads). A metric measures one of them, or ``ANY``.
SOFTMAX, MULTI_LABEL, REGRESSION, ANY = "softmax", "multi_label", "regression", "any"
OUTPUT_KINDS = (SOFTMAX, MULTI_LABEL, REGRESSION)
#: Where a label-dependent metric is undefined.
UNKNOWN_LABEL = "unknown label (-1)"


@dataclass(frozen=True)
class MetricSpec:
    """Facts of one metric.

    Attributes
    ----------
    name : str
    kind : {'bool', 'float', 'set'}
        Per-example bool column (statistics ``rate``/``count``), per-example float column
        (``mean``, ``max``, percentiles...), or set-level (``value``, recomputed on a stratum).
    higher_is_better : bool or None
        None: no direction (a property of the reference, or signed).
    needs_labels : bool
        Defined on labeled examples only (its support is the labeled rows of the stratum).
    detail : bool
        Column of ``Evaluation.detail`` (the in-depth checks) rather than ``per_example``.
    compute : callable or None
        Set-level only: ``compute(ev, idx) -> (B,)`` for ``idx`` (B, n) int row indices
        (:mod:`metrics.set_metrics`); serves the point value (B = 1) and the bootstrap.
    point : callable or None
        Set-level only, rarely: the same quantity summed in another order for the point value
        (``ece_width_*``, ``ece_mass_*``: kept bit-identical to saved results, see
        :mod:`metrics.set_metrics`); None = ``compute``.
    events : str or None
        Set-level rate of this bool column (its interval is Clopper–Pearson on the column).
    difference_of : tuple of two str, or None
        Set-level difference of the rates of two bool columns on the same rows (``accuracy_drop``
        = negative minus positive flip rate); its interval is Tango's score interval for paired
        proportions (:func:`metrics.paired.tango_interval`).
    has_interval : bool
        False for constants of the run and the temperature refit (too costly to resample).
    undefined : str
        Where the metric is NaN / the rows it skips ("" = defined everywhere).
    outputs : str
        The outputs it measures (one of ``OUTPUT_KINDS``, or ``ANY``): a contract judging a
        model may only name metrics of that model's outputs (:func:`metrics_for`).
    """

    name: str
    kind: str
    higher_is_better: bool | None
    needs_labels: bool = False
    detail: bool = False
    compute: Callable | None = None
    point: Callable | None = None
    events: str | None = None
    difference_of: tuple | None = None
    has_interval: bool = True
    undefined: str = ""
    outputs: str = SOFTMAX

    @property
    def statistics(self):
        """Allowed statistics; the first is the default."""
        return {BOOL: BOOL_STATISTICS, FLOAT: FLOAT_STATISTICS, SET: SET_STATISTICS}[self.kind]

    @property
    def default_statistic(self):
        return self.statistics[0]

    def value(self, ev, rows):
        """Point value on ``rows`` (1-D int indices) of a set-level metric, a float."""
        return float((self.point or self.compute)(ev, rows[None, :])[0])

    @property
    def interval(self):
        """``"clopper-pearson"`` (bool columns and rates of one), ``"tango-paired-score"``
        (a difference of two such rates on the same rows), ``"bootstrap-percentile"`` or None
        (no interval)."""
        if not self.has_interval:
            return None
        if self.difference_of:
            return TANGO_PAIRED
        return CLOPPER_PEARSON if self.kind == BOOL or self.events else BOOTSTRAP_PERCENTILE


def _b(name, higher, **kw):
    return MetricSpec(name, BOOL, higher, **kw)


def _f(name, higher, **kw):
    return MetricSpec(name, FLOAT, higher, **kw)


def _s(name, higher, compute, **kw):
    return MetricSpec(name, SET, higher, compute=compute, **kw)


def _calibration(figure):
    """The ``_ref``, ``_variant`` and ``_delta`` specs of a calibration figure (lower is better)."""
    labels = figure in sm.LABELED_FIGURES
    point = figure in ("ece_width", "ece_mass")
    name = "ece" if figure == "ece_labels" else figure
    return [_s(f"{name}_{w}", False, sm.calibration_metric(figure, w),
               point=sm.calibration_metric(figure, w, point=True) if point else None,
               needs_labels=labels, undefined=UNKNOWN_LABEL if labels else "")
            for w in ("ref", "variant", "delta")]


_L = dict(needs_labels=True, undefined=UNKNOWN_LABEL)
_SPECS = (
    # per-example bool columns (label-dependent ones are NA where the label is unknown)
    _b("agreement", True), _b("flip", False), _b("negative_flip", False, **_L),
    _b("positive_flip", True, **_L), _b("action_agreement", True),
    _b("ref_correct", True, **_L), _b("var_correct", True, **_L), _b("near_tie", None),
    _b("certified", True),
    _b("epsilon_exceeded", False, detail=True), _b("within_conformal", True, detail=True),
    _b("certified_conformal", True, detail=True), _b("bound_violation", False, detail=True),
    _b("mask_mismatch", False, detail=True), _b("human_near_tie", None, detail=True),
    _b("numerical_tie", None, detail=True),
    _b("label_flip", False, detail=True, outputs=MULTI_LABEL),  # metrics.multilabel
    _b("within_tolerance", True, detail=True, outputs=REGRESSION,  # metrics.regression
       undefined="the reference's values do not vary (spread 0)"),
    # per-example float columns (NaN values are skipped by every statistic)
    _f("ref_margin", None), _f("max_abs_logit_diff", False), _f("kl", False),
    _f("abs_score_error", False, undefined="no score (expected_score NaN)"),
    _f("action_max_abs_diff", False),
    _f("kl_reverse", False, detail=True), _f("prob_tv", False, detail=True),
    _f("delta_top_prob", None, detail=True), _f("abs_delta_top_prob", False, detail=True),
    _f("confidence_drift", False, detail=True), _f("action_tv", False, detail=True),
    _f("log_ratio_max", False, detail=True), _f("action_log_ratio_max", False, detail=True),
    _f("label_prob_max_abs_diff", False, detail=True, outputs=MULTI_LABEL),
    _f("label_prob_mean_abs_diff", False, detail=True, outputs=MULTI_LABEL),
    _f("value_abs_error", False, detail=True, outputs=REGRESSION),
    _f("value_rel_error", False, detail=True, outputs=REGRESSION,
       undefined="the reference's values do not vary (spread 0)"),
    # set-level metrics, recomputed on the stratum's rows
    _s("accuracy_ref", True, sm.accuracy_ref, events="ref_correct", **_L),
    _s("accuracy_variant", True, sm.accuracy_variant, events="var_correct", **_L),
    _s("accuracy_drop", False, sm.accuracy_drop, difference_of=("negative_flip", "positive_flip"),
       **_L),
    *_calibration("ece_labels"), *_calibration("smece"),
    _s("certified_share", True, sm.rate_of("certified"), events="certified"),
    *(spec for figure in sm.CALIBRATION_FIGURES for spec in _calibration(figure)),
    _s("temperature_refit_log_ratio", False, sm.temperature_refit_log_ratio, has_interval=False,
       undefined="the reference's refit ran to a bound or did not converge"),
    _s("certified_share_conformal", True, sm.rate_of("certified_conformal"),
       events="certified_conformal"),
    _s("epsilon_max", False, sm.constant("epsilon"), has_interval=False),
    _s("epsilon_conformal", False, sm.constant("epsilon_conformal"), has_interval=False),
    # rows of the variant with NaN or inf outputs (both splits), left out of every metric above
    _s("nonfinite_rows", False, sm.constant("n_nonfinite"), has_interval=False, outputs=ANY),
    # multi-label heads: one sigmoid decision per label (metrics.multilabel)
    _s("label_flip_rate_max", False, ml.label_flip_rate_max, outputs=MULTI_LABEL),
    _s("label_brier_delta", False, ml.label_brier_delta, outputs=MULTI_LABEL),
    _s("label_ece_delta", False, ml.label_ece_delta, outputs=MULTI_LABEL),
    # regression heads: the output value (metrics.regression)
    _s("value_spearman", True, rg.value_spearman, outputs=REGRESSION,
       undefined="fewer than 2 rows, or constant values on one side"),
)
#: name -> MetricSpec, in the order above (the order of the "use one of" messages).
REGISTRY = {spec.name: spec for spec in _SPECS}
METRICS = tuple(REGISTRY)


def names(kind=None, **facts):
    """Names of the metrics of ``kind`` (any when None) whose attributes equal ``facts``, in
    registry order, e.g. ``names(BOOL, needs_labels=True)``."""
    return tuple(s.name for s in _SPECS if (kind is None or s.kind == kind)
                 and all(getattr(s, k) == v for k, v in facts.items()))


def spec(metric):
    """The :class:`MetricSpec` of ``metric``.

    Raises
    ------
    ValueError
        If ``metric`` is not a registered name (the message lists them).
    """
    if not isinstance(metric, str) or metric not in REGISTRY:  # a TOML list: unhashable
        raise ValueError(f"unknown metric {short_repr(metric)}; use one of {', '.join(METRICS)}.")
    return REGISTRY[metric]


def metrics_for(outputs):
    """Names of the metrics that measure ``outputs`` (one of ``OUTPUT_KINDS``), in registry
    order: its own and those of ``ANY``."""
    return tuple(s.name for s in _SPECS if s.outputs in (outputs, ANY))


def check_metric_statistic(metric, statistic):
    """Raise ValueError unless ``metric`` is known and ``statistic`` is allowed for it."""
    allowed = spec(metric).statistics
    if statistic not in allowed:
        raise ValueError(
            f"statistic {short_repr(statistic)} is not allowed for metric {metric!r}; use one of "
            f"{', '.join(allowed)}."
        )


def resolve_statistic(metric, statistic):
    """``statistic``, or the metric's default when None; checked (ValueError as
    :func:`check_metric_statistic`)."""
    if statistic is None and isinstance(metric, str) and metric in REGISTRY:
        statistic = REGISTRY[metric].default_statistic
    check_metric_statistic(metric, statistic)
    return statistic


# -- views kept for code that imports the old constants ----------------------------------------
BOOL_METRICS = names(BOOL)
FLOAT_METRICS = names(FLOAT)
SET_METRICS = names(SET)
LABELED_METRICS = names(BOOL, needs_labels=True)
NO_CI_METRICS = names(has_interval=False)
BINOMIAL_SET_METRICS = {s.name: s.events for s in _SPECS if s.kind == SET and s.events}
DETAIL_METRICS = names(detail=True)
METRIC_STATISTICS = {s.name: s.statistics for s in _SPECS}

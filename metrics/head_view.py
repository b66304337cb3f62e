"""What the run's tables and reports show of a multi-label or regression head (no MLX; read by
runs.report, contracts.report, runs.html and the export's model card): the
columns of the outputs the run judges (:mod:`metrics.head_summary`) in place of the softmax ones
(agreement, certified share, ECE, Δscore, Δaction), which mean nothing for those outputs.

A softmax run (every run before heads were read) shows exactly what it showed before: each
function here says so by returning None or the softmax columns unchanged.
"""

import math

SOFTMAX = "softmax"

#: quality columns of the main table per non-softmax output kind: (summary key, header, format)
QUALITY = {
    "regression": (
        ("value_abs_error_max", "max abs Δvalue", "{:.4g}"),
        ("value_rel_error_max", "max rel. error", "{:.4f}"),
        ("value_rel_error_mean", "mean rel. error", "{:.4f}"),
        ("within_tolerance", "within tol.", "{:.3f}"),
        ("value_spearman", "Spearman ρ", "{:.4f}"),
    ),
    "multi_label": (
        ("label_flips", "label flips", "{:.0f}"),
        ("label_set_change_rate", "rows changed", "{:.3f}"),
        ("label_flip_rate_max", "label flip rate max", "{:.3f}"),
        ("label_prob_drift_max", "max abs Δprob", "{:.4f}"),
        ("label_brier_delta", "Brier Δ", "{:+.4f}"),
        ("label_ece_delta", "ECE Δ", "{:+.4f}"),
    ),
}

#: what each kind of output is, in sentences
DESCRIBED = {"regression": "one output value per row (regression)",
             "multi_label": "one sigmoid yes/no per label (multi-label classification)"}


def summary_outputs(summary):
    """The output kind of a summary table (summary.csv's ``outputs`` column, written only for
    non-softmax heads); ``softmax`` when absent."""
    if "outputs" not in getattr(summary, "columns", ()):
        return SOFTMAX
    kinds = [k for k in summary["outputs"].tolist() if isinstance(k, str) and k]
    return kinds[0] if kinds else SOFTMAX


def _fmt(x, f):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f.format(x)


def figures_text(s, outputs):
    """The one-paragraph figures of a non-softmax variant (report.md, after its verdict
    heading) from its summary dict ``s``; None for a softmax head."""
    if outputs == "regression":
        return (f"Output value: |Δvalue| mean {_fmt(s.get('value_abs_error_mean'), '{:.4g}')} / "
                f"max {_fmt(s.get('value_abs_error_max'), '{:.4g}')} (output units); relative "
                f"to the reference's spread s = {_fmt(s.get('value_spread'), '{:.4g}')}: mean "
                f"{_fmt(s.get('value_rel_error_mean'), '{:.4f}')} / max "
                f"{_fmt(s.get('value_rel_error_max'), '{:.4f}')}; within tolerance "
                f"(|Δ| <= {_fmt(s.get('value_tolerance'), '{:g}')} s) "
                f"{_fmt(s.get('within_tolerance'), '{:.1%}')} of rows; Spearman ρ "
                f"{_fmt(s.get('value_spearman'), '{:.4f}')}. " + not_applicable(outputs))
    if outputs == "multi_label":
        return (f"Labels (sigmoid >= 0.5): {_fmt(s.get('label_flips'), '{:.0f}')} label "
                f"decisions changed, on {_fmt(s.get('label_set_changes'), '{:.0f}')} rows "
                f"({_fmt(s.get('label_set_change_rate'), '{:.1%}')}); largest per-label flip "
                f"rate {_fmt(s.get('label_flip_rate_max'), '{:.3f}')}; |Δprob| per row max "
                f"{_fmt(s.get('label_prob_drift_max'), '{:.4f}')} / p95 "
                f"{_fmt(s.get('label_prob_drift_p95'), '{:.4f}')}, mean "
                f"{_fmt(s.get('label_prob_drift_mean'), '{:.4f}')}; worst per-label Brier Δ "
                f"{_fmt(s.get('label_brier_delta'), '{:+.4f}')}, ECE Δ "
                f"{_fmt(s.get('label_ece_delta'), '{:+.4f}')}. " + not_applicable(outputs))
    return None


def not_applicable(outputs):
    """The sentence saying which softmax figures do not apply to ``outputs`` ("" for a
    softmax)."""
    if outputs == SOFTMAX:
        return ""
    return (f"The model outputs {DESCRIBED.get(outputs, outputs)}: agreement, top-2 margin "
            "certificates, flips of the top option, ECE, KL and temperatures are softmax figures "
            "and do not apply (not shown).")


def run_outputs(meta):
    """What the run's model outputs (``softmax``, ``multi_label`` or ``regression``): run.json's
    ``model.outputs`` (:meth:`variants.models.configured.ModelSource.describe`), ``softmax``
    when absent (every run before heads were read, and every model but a classifier head's
    that says otherwise)."""
    model = (meta or {}).get("model") or {}
    return model.get("outputs", "softmax") if isinstance(model, dict) else "softmax"

"""Pareto view: measured speed-up against the key contract figures, one point per variant."""

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from metrics.defaults import N_BINS
from metrics.registry import spec
from runs.plots.data import SkipPlot
from runs.plots.style import (VERDICT_MARKERS, _contract_threshold, _figure, _palette,
                              _style)

#: Pareto panels: (summary column, axis label, higher is better, reference value column or number).
#: Higher-is-better comes from the metric registry (summary column -> its registered metric).
PARETO_METRICS = (
    ("agreement", "agreement (share of eval examples)", spec("agreement").higher_is_better, 1.0),
    ("certified_share", "certified share (ref. margin > 2ε)",
     spec("certified_share").higher_is_better, 1.0),
    ("ece_variant", f"ECE (top label, {N_BINS} bins)", spec("ece_variant").higher_is_better,
     "ece_ref"),
    ("action_max_abs_diff_max", "max action drift |Δp| (probability)",
     spec("action_max_abs_diff").higher_is_better, 0.0),
)


#: Pareto panels of a head that is not a softmax (run.json ``model.outputs``), as
#: PARETO_METRICS with the contract clause (metric, statistic) each panel's figure is judged by
#: (:mod:`metrics.head_summary`; the threshold line): the softmax panels are constant there
HEAD_PARETO_METRICS = {
    "regression": (
        ("value_rel_error_max", "max rel. value error (× ref. spread)", False,
         0.0, ("value_rel_error", "max")),
        ("value_rel_error_mean", "mean rel. value error (× ref. spread)", False,
         0.0, ("value_rel_error", "mean")),
        ("within_tolerance", "rows within tolerance (share)", True, 1.0,
         ("within_tolerance", "rate")),
        ("value_spearman", "Spearman ρ of values", True, 1.0,
         ("value_spearman", "value")),
    ),
    "multi_label": (
        ("label_set_change_rate", "rows whose label set changed (share)", False, 0.0,
         ("label_flip", "rate")),
        ("label_flip_rate_max", "largest per-label flip rate", False, 0.0,
         ("label_flip_rate_max", "value")),
        ("label_prob_drift_p95", "p95 of row max |Δ sigmoid|", False, 0.0,
         ("label_prob_max_abs_diff", "p95")),
        ("label_brier_delta", "worst per-label Brier Δ", False, 0.0,
         ("label_brier_delta", "value")),
    ),
}


def _clause_threshold(run, metric, statistic):
    """(op, threshold) of the contract clause on ``metric`` · all · ``statistic``, or None."""
    for name in run.variants:
        for c in run.json(name, "verdict.json").get("clauses", []):
            if (c.get("metric"), c.get("stratum"), c.get("statistic")) == (metric, "all",
                                                                           statistic):
                return c.get("op"), c.get("threshold")
    return None


def _panels(run):
    """(summary column, axis label, higher is better, reference value, threshold thunk) of each
    panel: the softmax figures, or the head's own (:data:`HEAD_PARETO_METRICS`)."""
    from metrics.head_view import run_outputs

    outputs = run_outputs(run.meta)
    if outputs in HEAD_PARETO_METRICS:
        return [(m, label, higher, ref, lambda c=clause: _clause_threshold(run, *c))
                for m, label, higher, ref, clause in HEAD_PARETO_METRICS[outputs]]
    return [(m, label, higher, ref, lambda m=m: _contract_threshold(run, m))
            for m, label, higher, ref in PARETO_METRICS]


def _pareto_front(x, y, higher):
    """Indices of points not dominated (higher x better; y higher or lower better), by x."""
    order = np.argsort(-x, kind="stable")
    front, best = [], -np.inf
    for i in order:
        v = y[i] if higher else -y[i]
        if v > best:
            front.append(i)
            best = v
    return np.array(sorted(front, key=lambda i: x[i]))


def pareto_view(run, batch_size):
    """Speed-up at ``batch_size`` (x, with its 95% CI) against the key contract figures.

    One point per variant, coloured by family, marker by verdict; the reference is a star at
    speed-up 1; the Pareto front (variants + reference) is drawn as a step line; a contract
    threshold on the same metric over all examples is a dashed line.

    Raises
    ------
    SkipPlot
        If ``batch_size`` was not timed.
    """
    col = f"b{batch_size}_speedup"
    s = run.summary
    if col not in s.columns:
        raise SkipPlot(f"batch size {batch_size} was not timed (no {col} column)")
    families = sorted(s["family"].astype(str).unique())
    colors = _palette(families)
    with _style():
        timed = s.loc[s[col].notna()] if s[col].notna().any() else s  # not an outputs file's
        fig = _figure(run, f"Pareto view at batch size {batch_size} "
                           f"({timed.get('speed_mode', pd.Series(['?'])).iloc[0]} speed)",
                      2, 2, width=5.0, height=3.4)
        axes = fig.subplots(2, 2).ravel()
        for ax, (metric, ylabel, higher, ref_value, threshold) in zip(axes, _panels(run)):
            if metric not in s.columns:
                ax.set_axis_off()
                ax.set_title(f"{metric}: not in summary.csv", fontsize=9)
                continue
            ref_y = float(s[ref_value].iloc[0]) if isinstance(ref_value, str) else ref_value
            x = np.append(s[col].to_numpy(float), 1.0)
            y = np.append(s[metric].to_numpy(float), ref_y)
            ok = np.isfinite(x) & np.isfinite(y)
            if ok.sum() >= 2:
                f = np.flatnonzero(ok)[_pareto_front(x[ok], y[ok], higher)]
                ax.step(x[f], y[f], where="post" if higher else "pre", color="0.2", lw=1.6,
                        ls="-.", alpha=0.7, zorder=1, label="Pareto front")
            lo = s[f"b{batch_size}_speedup_ci_low"].to_numpy(float)
            hi = s[f"b{batch_size}_speedup_ci_high"].to_numpy(float)
            side = np.empty(len(s), dtype=int)  # labels alternate right / left, by y order
            side[np.argsort(y[:-1], kind="stable")] = np.arange(len(s)) % 2
            for i, r in enumerate(s.itertuples(index=False)):
                c = colors[str(r.family)]
                ax.errorbar(x[i], y[i], xerr=[[x[i] - lo[i]], [hi[i] - x[i]]], fmt="none",
                            ecolor=c, alpha=0.5, lw=1, zorder=2)
                ax.scatter(x[i], y[i], color=c, marker=VERDICT_MARKERS.get(r.verdict, "o"),
                           s=60, edgecolor="k", linewidth=0.5, zorder=3)
                ax.annotate(r.variant, (x[i], y[i]), textcoords="offset points",
                            xytext=(-6, 3) if side[i] else (6, 3),
                            ha="right" if side[i] else "left", fontsize=7)
            ax.scatter([1.0], [ref_y], marker="*", s=160, color="gold", edgecolor="k",
                       zorder=4)
            ax.axvline(1.0, color="0.7", ls=":", lw=1)
            thr = threshold()
            if thr and thr[1] is not None:
                ax.axhline(thr[1], color="crimson", ls="--", lw=1,
                           label=f"contract: {metric} {thr[0]} {thr[1]:g}")
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.margins(x=0.1)
            ax.set_xlabel(f"speed-up vs reference at B={batch_size} (log scale, 95% CI)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{ylabel.split(' (')[0]} ({'higher' if higher else 'lower'} is better)",
                         fontsize=9)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="best", framealpha=0.8)
        handles = [Line2D([], [], marker="s", ls="", color=colors[f], label=f"family: {f}")
                   for f in families]
        handles.append(Line2D([], [], marker="*", ls="", color="gold", markeredgecolor="k",
                              markersize=12, label="reference (speed-up 1)"))
        handles += [Line2D([], [], marker=m, ls="", color="0.3", label=f"variant {v}")
                    for v, m in VERDICT_MARKERS.items()]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8,
                   frameon=False)
        if len(s) == 1:
            fig.text(0.5, 0.005, "Only one variant in this run: no trade-off to compare beyond "
                     "the reference.", ha="center", fontsize=8, color="crimson")
    return fig

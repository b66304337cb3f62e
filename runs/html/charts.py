"""The report's charts as inline SVG strings (matplotlib's SVG backend, text kept as text).

Each chart is drawn from the report dict alone (:func:`runs.html.build.report_data`), so the
HTML shows exactly the numbers report.json holds. The SVG is stripped of its XML prolog, DTD,
namespace URIs and metadata, so the page holds no URL and its ids are unique per chart.
"""

import io
import math
import re

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

#: Pareto panels: (summary key, axis label, higher is better).
PARETO_Y = (("agreement", "agreement", True),
            ("ece_variant", "ECE (top label)", False),
            ("action_max_abs_diff_max", "max action drift |Δp|", False))
#: Pareto panels of a head that is not a softmax (run.json ``model.outputs``), as PARETO_Y
HEAD_PARETO_Y = {
    "regression": (("value_rel_error_max", "max relative value error", False),
                   ("within_tolerance", "rows within tolerance", True),
                   ("value_spearman", "Spearman ρ of values", True)),
    "multi_label": (("label_set_change_rate", "rows whose label set changed", False),
                    ("label_flip_rate_max", "largest per-label flip rate", False),
                    ("label_brier_delta", "worst per-label Brier Δ", False)),
}
#: the reference's own value of each panel's figure (the star); ECE: the summary's ``ece_ref``
REFERENCE_Y = {"agreement": 1.0, "action_max_abs_diff_max": 0.0, "value_rel_error_max": 0.0,
               "within_tolerance": 1.0, "value_spearman": 1.0, "label_set_change_rate": 0.0,
               "label_flip_rate_max": 0.0, "label_brier_delta": 0.0}
#: summary key -> the metric of the contract clause judging it, where the names differ
CLAUSE_OF = {"value_rel_error_max": "value_rel_error", "label_set_change_rate": "label_flip"}
#: Verdict → (marker, face colour) of a variant's point.
VERDICT_STYLE = {"pass": ("o", "#1a7f37"), "fail": ("X", "#cf222e"), "untested": ("s", "#9a6700"),
                 "undecided": ("D", "#bc4c00")}
RC = {"svg.fonttype": "none", "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8,
      "legend.fontsize": 7, "font.family": "sans-serif"}


def to_svg(fig, salt):
    """``fig`` as an inline-able ``<svg>`` element: no prolog, DTD, xmlns URIs or metadata; ids
    salted with ``salt`` (unique per chart on the page)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({**RC, "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None,
                                                 "Type": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    return svg.replace("<svg ", f'<svg role="img" aria-label="{salt}" ', 1)


def _figure(ncols, nrows, width, height):
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    return fig


def _clause_ci(v, metric):
    """(low, high) of the variant's clause on ``metric`` over all examples, else of its
    calibration figure; (None, None) when the report has none."""
    for c in v["clauses"]:
        if c["metric"] == metric and c["stratum"] == "all" and c["ci_low"] is not None:
            return c["ci_low"], c["ci_high"]
    cal = v.get("calibration", {}).get("ece_width", {}).get("variant", {})
    if metric == "ece_variant" and cal.get("ci"):
        return tuple(cal["ci"])
    return None, None


def _threshold(v, metric):
    for c in v["clauses"]:
        if c["metric"] == metric and c["stratum"] == "all" and c["statistic"] in ("rate", "value",
                                                                                   "max"):
            return c["op"], c["threshold"]
    return None


def pareto_svg(data, batch_size):
    """Speed-up at ``batch_size`` (top row, 95% CI) and model size (bottom row) against
    agreement, ECE and action drift (a regression or multi-label head: its own figures,
    :data:`HEAD_PARETO_Y`); passing variants filled green, the reference a star.
    Returns None when no variant was timed at that batch size."""
    import matplotlib

    vs = data["variants"]
    pts = []
    for v in vs:
        t = next((e for e in v["timing"]["forward"] if e["B"] == batch_size), None)
        pts.append(t)
    if not any(pts):
        return None
    with matplotlib.rc_context(RC):
        fig = _figure(3, 2, 3.0, 2.5)
        axes = fig.subplots(2, 3)
        ref_mb = (data["reference"].get("model_bytes") or math.nan) / 1e6
        for col, (key, label, higher) in enumerate(HEAD_PARETO_Y.get(data.get("outputs"),
                                                                      PARETO_Y)):
            for row, axis in enumerate(("speed", "size")):
                ax = axes[row][col]
                for v, t in zip(vs, pts):
                    y = v["summary"].get(key)
                    if y is None:
                        continue
                    if axis == "speed":
                        if not t or t["speedup"] is None:
                            continue
                        x, (lo, hi) = t["speedup"], t["speedup_ci"]
                        if lo is not None and hi is not None:
                            ax.hlines(y, lo, hi, color="0.55", lw=0.8)
                    else:
                        x = (v["summary"].get("model_bytes") or math.nan) / 1e6
                    ylo, yhi = _clause_ci(v, CLAUSE_OF.get(key, key))
                    if ylo is not None and yhi is not None:  # a percentile CI may miss y
                        ax.vlines(x, ylo, yhi, color="0.55", lw=0.8)
                    m, c = VERDICT_STYLE[v["verdict"]]
                    ax.scatter([x], [y], marker=m, s=40, color=c, edgecolor="k", lw=0.4,
                               zorder=3)
                    ax.annotate(v["name"], (x, y), textcoords="offset points", xytext=(4, 3),
                                fontsize=6.5)
                ref_y = REFERENCE_Y.get(key, vs[0]["summary"].get("ece_ref"))
                ref_x = 1.0 if axis == "speed" else ref_mb
                if ref_y is not None and math.isfinite(ref_x):
                    ax.scatter([ref_x], [ref_y], marker="*", s=110, color="gold",
                               edgecolor="k", lw=0.5, zorder=4)
                thr = _threshold(vs[0], CLAUSE_OF.get(key, key))
                if thr:
                    ax.axhline(thr[1], color="#cf222e", ls="--", lw=0.8)
                ax.set_ylabel(label + (" ↑" if higher else " ↓"))
                ax.set_xlabel(f"speed-up at B={batch_size} (95% CI)" if axis == "speed"
                              else "model size, MB")
                ax.grid(alpha=0.25)
        handles = [Line2D([], [], marker=m, ls="", color=c, markeredgecolor="k",
                          label=f"variant {w}") for w, (m, c) in VERDICT_STYLE.items()]
        handles += [Line2D([], [], marker="*", ls="", color="gold", markeredgecolor="k",
                           markersize=10, label="reference"),
                    Line2D([], [], color="#cf222e", ls="--", label="contract threshold")]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
                   frameon=False)
        return to_svg(fig, f"pareto-b{batch_size}")


def _rel_panel(ax, rel, ref, title, color):
    conf, acc, count = rel["confidence"], rel["accuracy"], rel["count"]
    lo, hi = rel["lower"], rel["upper"]
    widths = [h - l for l, h in zip(lo, hi)]
    ax.bar(lo, [a if a is not None else 0 for a in acc], width=widths, align="edge",
           color=color, alpha=0.7, edgecolor="k", lw=0.3)
    pts = [(c, a) for c, a in zip(ref["confidence"], ref["accuracy"])
           if c is not None and a is not None]
    if pts:
        ax.plot(*zip(*pts), "o-", color="#0969da", ms=2.5, lw=0.8, label="reference")
    ax.plot([0, 1], [0, 1], color="0.4", ls="--", lw=0.8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.set_xlabel(f"confidence (n={sum(count)})")


def reliability_svg(v):
    """The variant's reliability diagram at the deployed temperature and at its own refitted
    one, the reference's curve on both (top label, equal-width bins)."""
    import matplotlib

    cal = v.get("calibration", {}).get("ece_width", {})
    ece = (cal.get("variant") or {}).get("value")
    refit = [t.get("ece_variant_refit") for t in v["temperatures"]]
    t_dep = ", ".join(f"{t['T_deployed']:.2f}" for t in v["temperatures"]
                      if t.get("T_deployed") is not None)
    t_fit = ", ".join(f"{t['T_refit_variant']:.2f}" for t in v["temperatures"]
                      if t.get("T_refit_variant") is not None)
    with matplotlib.rc_context(RC):
        fig = _figure(2, 1, 2.6, 2.5)
        a, b = fig.subplots(1, 2, sharey=True)
        _rel_panel(a, v["reliability"]["deployed"], v["reliability"]["reference"],
                   f"deployed T={t_dep}" + (f", ECE {ece:.3f}" if ece is not None else ""),
                   "#fb8500")
        _rel_panel(b, v["reliability"]["refit"], v["reliability"]["reference"],
                   f"refit T={t_fit}" + (f", ECE {refit[0]:.3f}" if len(refit) == 1
                                         and refit[0] is not None else ""), "#8250df")
        a.set_ylabel("accuracy")
        a.legend(loc="upper left")
        return to_svg(fig, f"reliability-{v['name']}")


def charts(data):
    """Every chart of the report: {"pareto": [(B, svg)], "reliability": {variant: svg}}."""
    sizes = sorted({e["B"] for v in data["variants"] for e in v["timing"]["forward"]})
    pareto = [(b, s) for b in sizes if (s := pareto_svg(data, b)) is not None]
    return {"pareto": pareto,
            "reliability": {v["name"]: reliability_svg(v) for v in data["variants"]
                            if v.get("reliability")}}  # none for a head that is not a softmax

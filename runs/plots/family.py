"""One plot per variant family, registered in :data:`FAMILY_PLOTS` (family -> function).

A new family's plot is one function here and one line in ``FAMILY_PLOTS``; its caption in
report.md is the first line of its docstring, kept in :data:`runs.plots.markdown.FAMILY_CAPTIONS`
(``tests/runs/test_plots.py`` checks the two agree).
"""

import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D

from runs.plots.data import SkipPlot
from runs.plots.style import VERDICT_MARKERS, _contract_threshold, _figure, _style, _verdict_legend


def _family_rows(run, family, columns):
    s = run.summary[run.summary["family"].astype(str) == family]
    missing = [c for c in columns if c not in s.columns or s[c].isna().all()]
    if missing:
        raise SkipPlot(f"family {family!r}: summary.csv has no {', '.join(missing)}")
    return s


def quant_bits_agreement(run, family="quant"):
    """Quantization: bits per weight (x) vs agreement (y), one point per variant."""
    from metrics.head_view import run_outputs

    outputs = run_outputs(run.meta)
    if outputs in HEAD_Y:  # a multi-label or regression head: its own figure on y
        return _quant_bits_head(run, family, *HEAD_Y[outputs])
    s = _family_rows(run, family, ["bits_per_weight", "agreement"])
    with _style():
        fig = _figure(run, "Quantization: bits per weight vs agreement", 1, width=6.0, height=4.0)
        ax = fig.subplots()
        groups = sorted(s["group_size"].dropna().unique()) if "group_size" in s else [None]
        colors = dict(zip(groups, sns.color_palette("tab10", len(groups))))
        for r in s.itertuples(index=False):
            ax.scatter(r.bits_per_weight, r.agreement, s=70, edgecolor="k", linewidth=0.5,
                       marker=VERDICT_MARKERS.get(r.verdict, "o"),
                       color=colors.get(getattr(r, "group_size", None), "tab:blue"))
            ax.annotate(r.variant, (r.bits_per_weight, r.agreement), textcoords="offset points",
                        xytext=(5, 4), fontsize=7)
        ordered = s.sort_values("bits_per_weight")
        ax.plot(ordered["bits_per_weight"], ordered["agreement"], color="0.6", lw=1, zorder=0)
        thr = _contract_threshold(run, "agreement")
        extra = []
        if thr and thr[1] is not None:
            extra.append(ax.axhline(thr[1], color="crimson", ls="--", lw=1,
                                    label=f"contract: agreement {thr[0]} {thr[1]:g}"))
        extra += [Line2D([], [], marker="s", ls="", color=c, label=f"group size {g:g}")
                  for g, c in colors.items() if g is not None]
        ax.set_xlabel("bits per quantized weight (incl. scale and bias)")
        ax.set_ylabel("agreement with reference (share of eval examples)")
        _verdict_legend(ax, extra)
    return fig


#: quant plot's y of a head that is not a softmax: (summary column, axis label)
HEAD_Y = {"regression": ("value_rel_error_max",
                         "max relative value error (units of the reference's spread)"),
          "multi_label": ("label_set_change_rate", "rows whose label set changed (share)")}


def _quant_bits_head(run, family, column, label):
    """The quantization plot of a multi-label or regression head: bits per weight (x) vs the
    head's ``column`` (y), one point per variant."""
    s = _family_rows(run, family, ["bits_per_weight", column])
    with _style():
        fig = _figure(run, f"Quantization: bits per weight vs {label.split(' (')[0]}", 1,
                      width=6.0, height=4.0)
        ax = fig.subplots()
        for r in s.itertuples(index=False):
            y = getattr(r, column)
            ax.scatter(r.bits_per_weight, y, s=70, edgecolor="k", linewidth=0.5,
                       marker=VERDICT_MARKERS.get(r.verdict, "o"), color="tab:blue")
            ax.annotate(r.variant, (r.bits_per_weight, y), textcoords="offset points",
                        xytext=(5, 4), fontsize=7)
        ordered = s.sort_values("bits_per_weight")
        ax.plot(ordered["bits_per_weight"], ordered[column], color="0.6", lw=1, zorder=0)
        ax.set_xlabel("bits per quantized weight (incl. scale and bias)")
        ax.set_ylabel(label)
        _verdict_legend(ax, [])
    return fig


def prune_keep_ratio_speedup(run, family="prune"):
    """Pruning: keep ratio (x) vs speed-up at each timed batch size (y)."""
    s = _family_rows(run, family, ["keep_ratio"] + [f"b{b}_speedup" for b in run.batch_sizes])
    with _style():
        fig = _figure(run, "Pruning: keep ratio vs speed-up", 1, width=6.0, height=4.0)
        ax = fig.subplots()
        for b in run.batch_sizes:
            o = s.sort_values("keep_ratio")
            ax.plot(o["keep_ratio"], o[f"b{b}_speedup"], marker="o", label=f"B={b}")
        ax.axhline(1.0, color="0.6", ls=":")
        ax.set_xlabel("keep ratio (share of tokens kept)")
        ax.set_ylabel("speed-up vs reference (×)")
        ax.legend(fontsize=7)
    return fig


def lowrank_profile(run, family="lowrank"):
    """Low rank: rank and retained energy per layer, from ``build.json["layers"]`` (list of
    ``{"name", "rank", "retained_energy"}``), one line per variant."""
    rows = []
    for name in _family_rows(run, family, [])["variant"]:
        for i, layer in enumerate(run.json(name, "build.json").get("layers", [])):
            rows.append({"variant": name, "layer": i, **layer})
    df = pd.DataFrame(rows)
    if df.empty or not {"rank", "retained_energy"} <= set(df.columns):
        raise SkipPlot(f"family {family!r}: build.json has no layers with rank and retained_energy")
    with _style():
        fig = _figure(run, "Low rank: rank and retained energy per layer", 2, width=5.0)
        a, b = fig.subplots(1, 2)
        sns.lineplot(data=df, x="layer", y="rank", hue="variant", marker="o", ax=a)
        sns.lineplot(data=df, x="layer", y="retained_energy", hue="variant", marker="o", ax=b)
        a.set_xlabel("layer index")
        b.set_xlabel("layer index")
        a.set_ylabel("rank kept")
        b.set_ylabel("retained energy (share of squared singular values)")
    return fig


def exit_layer_histogram(run, family="exit"):
    """Early exit: histogram of the exit layer per eval example (``exit_layer`` in outputs.npz)."""
    rows = []
    for name in _family_rows(run, family, [])["variant"]:
        o = run.outputs(name)
        if "exit_layer" in o:
            rows.append(pd.DataFrame({"variant": name, "exit_layer": o["exit_layer"]}))
    if not rows:
        raise SkipPlot(f"family {family!r}: outputs.npz has no exit_layer array")
    df = pd.concat(rows)
    with _style():
        fig = _figure(run, "Early exit: exit layer per eval example", 1, width=6.0, height=4.0)
        ax = fig.subplots()
        sns.histplot(data=df, x="exit_layer", hue="variant", discrete=True, multiple="dodge",
                     ax=ax)
        ax.set_xlabel("exit layer (encoder layers run; the last = no early exit)")
        ax.set_ylabel("eval examples (count)")
    return fig


FAMILY_PLOTS = {
    "quant": quant_bits_agreement,
    "lowrank": lowrank_profile,
    "prune": prune_keep_ratio_speedup,
    "exit": exit_layer_histogram,
}

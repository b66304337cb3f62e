"""Flips per stratum: negative / positive flip counts per reference-margin bin, option count and
human near tie (Yan et al. 2021, "Positive-congruent training")."""

import seaborn as sns

from metrics.defaults import NEAR_TIE_MARGIN
from runs.plots.data import HUMAN_NEAR_TIE_GAP, SkipPlot
from runs.plots.style import _figure, _style


def flip_strata(run):
    """Negative / positive flip counts per reference-margin bin, option count and human near tie.

    Rows: negative flips (reference right, variant wrong) and positive flips; columns: the three
    stratifications; bars: variants. Tick labels give each stratum's labelled example count.

    Raises
    ------
    SkipPlot
        If no eval example has a label (flips cannot be negative or positive).
    """
    per = run.per_example()
    per = per[per["label"] >= 0]
    if per.empty:
        raise SkipPlot("no eval example has a label, so no flip is negative or positive")
    per = per.assign(
        options=per["n_options"].astype(str) + " options",
        human=per["human_near_tie"].map({True: "near tie", False: "clear"}).fillna("no raters"),
        negative=per["negative_flip"].astype(bool), positive=per["positive_flip"].astype(bool))
    strata = (("margin_bin", f"reference top-2 margin bin (raw logits; near tie < "
                             f"{run.config.get('near_tie_margin', NEAR_TIE_MARGIN):g})"),
              ("options", "option count K"),
              ("human", f"human raters (near tie: top-2 shares within {HUMAN_NEAR_TIE_GAP:g})"))
    first = per[per["variant"] == run.variants[0]]
    with _style():
        fig = _figure(run, "Flips per stratum: negative = reference right → variant wrong; "
                           "positive = wrong → right (labelled eval examples)", 3, 2,
                      width=4.4, height=3.0)
        axes = fig.subplots(2, 3, squeeze=False)
        for c, (col, xlabel) in enumerate(strata):
            order = [str(v) for v in (first[col].cat.categories if col == "margin_bin"
                                      else sorted(first[col].unique()))]
            n = first[col].astype(str).value_counts()
            ticks = [f"{o}\nn={n.get(o, 0)}" for o in order]
            counts = (per.assign(key=per[col].astype(str))
                      .groupby(["variant", "key"], observed=True)[["negative", "positive"]].sum()
                      .reset_index())
            for r, what in enumerate(("negative", "positive")):
                ax = axes[r, c]
                sns.barplot(data=counts, x="key", y=what, hue="variant", order=order,
                            hue_order=run.variants, ax=ax, palette="viridis",
                            legend=(r == 0 and c == 0))
                ax.set_xticks(range(len(order)), ticks, fontsize=7)
                ax.set_xlabel(xlabel if r == 1 else "", fontsize=8)
                ax.set_ylabel(f"{what} flips (count)")
                ax.yaxis.get_major_locator().set_params(integer=True)
                for container in ax.containers:
                    ax.bar_label(container, fmt="%d", fontsize=6, padding=1)
                ax.margins(y=0.12)
        leg = axes[0, 0].get_legend()
        if leg is not None:
            leg.set_title("variant")
    return fig

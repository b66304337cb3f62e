"""Shared look of every plot: seaborn style, the figure with its run label, family colours,
verdict markers and the contract's threshold on a metric (matplotlib imported on first use)."""

from contextlib import contextmanager

VERDICT_MARKERS = {"PASS": "o", "FAIL": "X"}
FLIP_COLORS = {"agree": "#9e9e9e", "negative flip": "#d62728", "positive flip": "#2ca02c",
               "other flip": "#ff7f0e"}


@contextmanager
def _style():
    import seaborn as sns

    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        yield


def _figure(run, title, ncols, nrows=1, *, width=4.6, height=3.6):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows + 0.7), layout="constrained")
    label = run.label if width * ncols >= 13 else run.label.replace(" · quality:", "\nquality:")
    fig.suptitle(f"{title}\n{label}", fontsize=10 if width * ncols >= 9 else 9)
    return fig


def _palette(families):
    import seaborn as sns

    return dict(zip(families, sns.color_palette("tab10", len(families))))


def _verdict_legend(ax, extra=()):
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker=m, ls="", color="0.3", label=v)
               for v, m in VERDICT_MARKERS.items()]
    ax.legend(handles=list(extra) + handles, fontsize=7, loc="best", framealpha=0.8)


def _contract_threshold(run, metric):
    """(op, threshold) of the contract clause on ``metric`` over all examples, or None."""
    for name in run.variants:
        for c in run.json(name, "verdict.json").get("clauses", []):
            if c.get("metric") == metric and c.get("stratum") == "all":
                return c.get("op"), c.get("threshold")
    return None

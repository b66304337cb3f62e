"""Reliability diagrams: accuracy against top-label confidence per bin, reference and variants
(Guo et al. 2017, Fig. 1; equal-width bins as ``metrics.calibration``'s ECE)."""

import math

import numpy as np
import pandas as pd

from runs.plots.data import N_BINS, SkipPlot
from runs.plots.style import _figure, _style


def _reliability_table(probs, labels, mask, n_bins=N_BINS):
    """Per equal-width bin ``((m-1)/M, m/M]`` of top-label confidence (as
    ``metrics.calibration.expected_calibration_error``): count, mean confidence, accuracy."""
    known = labels >= 0
    z = np.where(mask, probs, -np.inf)[known]
    pred = np.argmax(z, axis=1)
    conf = np.minimum(z[np.arange(len(pred)), pred], 1.0)
    hit = (pred == labels[known]).astype(float)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    b = np.clip(np.digitize(conf, edges, right=True) - 1, 0, n_bins - 1)
    count = np.bincount(b, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(b, weights=conf, minlength=n_bins) / count
        acc = np.bincount(b, weights=hit, minlength=n_bins) / count
    return pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "count": count,
                         "confidence": mean_conf, "accuracy": acc})


def reliability_diagrams(run, *, max_cols=4):
    """Reliability diagram of the reference and of each variant side by side, bin counts below.

    Raises
    ------
    SkipPlot
        If no eval example has a label.
    """
    ref = run.outputs("reference")
    labels = ref["labels"]
    if not (labels >= 0).any():
        raise SkipPlot("no eval example has a label, so accuracy per bin is undefined")
    models = ["reference"] + run.variants
    ece = {"reference": run.summary["ece_ref"].iloc[0]} if "ece_ref" in run.summary else {}
    ece.update(dict(zip(run.variants, run.summary.get("ece_variant", [math.nan] * len(models)))))
    ncols = min(len(models), max_cols)
    nrows = math.ceil(len(models) / ncols)
    with _style():
        fig = _figure(run, f"Reliability diagrams (top label, {N_BINS} equal-width bins, "
                           f"labelled eval examples)", ncols, nrows, width=3.4, height=3.9)
        grid = fig.add_gridspec(2 * nrows, ncols, height_ratios=[3, 1] * nrows)
        for j, name in enumerate(models):
            o = run.outputs(name)
            t = _reliability_table(o["probs"], labels, ref["option_mask"])
            r, c = divmod(j, ncols)
            ax = fig.add_subplot(grid[2 * r, c])
            axc = fig.add_subplot(grid[2 * r + 1, c], sharex=ax)
            width = 1.0 / N_BINS
            ax.bar(t["lo"], t["accuracy"].fillna(0), width=width, align="edge",
                   color="tab:blue" if name == "reference" else "tab:orange", alpha=0.75,
                   edgecolor="k", linewidth=0.4, label="accuracy")
            ax.plot([0, 1], [0, 1], color="0.4", ls="--", lw=1, label="perfect calibration")
            ax.plot(t["confidence"], t["accuracy"], "k.", ms=5, label="(mean conf., acc.)")
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_ylabel("accuracy")
            e = ece.get(name, math.nan)
            ax.set_title(f"{name}: ECE {e:.3f}" if pd.notna(e) else name, fontsize=9)
            if j == 0:
                ax.legend(fontsize=6, loc="upper left")
            axc.bar(t["lo"], t["count"], width=width, align="edge", color="0.6",
                    edgecolor="k", linewidth=0.4)
            for lo, n in zip(t["lo"], t["count"]):
                if n:
                    axc.text(lo + width / 2, n, str(n), ha="center", va="bottom", fontsize=5.5)
            axc.set_ylim(0, max(t["count"].max(), 1) * 1.35)
            axc.set_ylabel("examples")
            axc.set_xlabel("confidence (top-label probability)")
    return fig

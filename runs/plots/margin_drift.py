"""Margin vs drift: each eval example's reference top-2 margin against its largest logit drift."""

import math

import numpy as np

from metrics.defaults import NEAR_TIE_MARGIN
from runs.plots.style import FLIP_COLORS, _figure, _style


def margin_vs_drift(run, *, max_cols=3):
    """Per eval example: reference top-2 margin (x) vs max |Δlogit| (y), one panel per variant.

    The dashed diagonal is drift = margin / 2 (a flip needs drift above it); the vertical line is
    2ε (examples to its right are certified); the shaded band is the near-tie band. Examples with
    a single option (margin +inf) are left out and counted in the panel title.
    """
    per = run.per_example()
    near = run.config.get("near_tie_margin", NEAR_TIE_MARGIN)
    names = run.variants
    ncols = min(len(names), max_cols)
    nrows = math.ceil(len(names) / ncols)
    with _style():
        fig = _figure(run, "Reference top-2 margin vs largest logit drift, per eval example",
                      ncols, nrows, width=4.4, height=3.6)
        axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
        for ax, name in zip(axes, names):
            d = per[per["variant"] == name]
            eps = run.evaluation(name).epsilon
            # ε = inf: a calibration row answered with NaN or inf (metrics.finite), no line
            bounded = bool(np.isfinite(eps))
            eps_axis = eps if bounded else 0.0
            finite = np.isfinite(d["ref_margin"])
            d = d[finite]
            kind = np.where(~d["flip"], "agree",
                            np.where(d["negative_flip"].fillna(False), "negative flip",
                                     np.where(d["positive_flip"].fillna(False), "positive flip",
                                              "other flip")))
            xmax = max(float(d["ref_margin"].max()) if len(d) else 1.0, 2 * eps_axis, near) * 1.05
            ymax = (max(float(d["max_abs_logit_diff"].max()) if len(d) else 0.0, eps_axis) * 1.25
                    or 1)
            ax.axvspan(0, near, color="khaki", alpha=0.35, lw=0,
                       label=f"near tie (margin < {near:g})")
            xs = np.linspace(0, xmax, 50)
            ax.plot(xs, xs / 2, color="0.35", ls="--", lw=1, label="drift = margin / 2")
            if bounded:
                ax.axvline(2 * eps, color="crimson", lw=1.2, label=f"2ε = {2 * eps:.3g}")
                ax.axhline(eps, color="crimson", lw=0.8, ls=":", label=f"ε = {eps:.3g}")
            for k, color in FLIP_COLORS.items():
                m = kind == k
                if m.any():
                    ax.scatter(d["ref_margin"][m], d["max_abs_logit_diff"][m], s=14 if k == "agree"
                               else 36, color=color, alpha=0.6 if k == "agree" else 0.95,
                               marker="o" if k == "agree" else "D", edgecolor="none"
                               if k == "agree" else "k", linewidth=0.4,
                               label=f"{k} ({int(m.sum())})", zorder=3)
            ax.set_xlim(0, xmax)
            ax.set_ylim(0, ymax)
            ax.set_xlabel("reference top-2 margin (raw logits)")
            ax.set_ylabel("max |Δlogit| (raw logits)")
            dropped = int((~finite).sum())
            ax.set_title(f"{name}: {int(d['flip'].sum())} flips"
                         + (f" ({dropped} single-option examples not shown)" if dropped else "")
                         + ("" if bounded else " (ε = inf: NaN or inf on calibration)"),
                         fontsize=9)
            ax.legend(fontsize=6, loc="upper right", framealpha=0.85)
        for ax in axes[len(names):]:
            ax.set_axis_off()
    return fig

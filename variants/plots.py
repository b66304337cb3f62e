"""Plots of a finished sweep folder: Pareto view, reliability, margin vs drift, flip strata, families.

Reads only the run folder (``run.json``, ``summary.csv``, ``*/metrics.json``, ``*/verdict.json``,
``*/build.json``, ``reference/*.npz``, ``<variant>/*.npz``) and never imports MLX, so it runs on
saved results anywhere. Figures are ``matplotlib.figure.Figure`` objects (no pyplot state) drawn
with seaborn and rendered by Agg; :func:`plot_run` writes them to ``<run>/plots/*.png``
atomically (temp file + rename). Per-example quantities come from :func:`metrics.evaluate.evaluate`.
"""

import argparse
import logging
import math
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from metrics._checks import short_path
from metrics.evaluate import evaluate
from metrics.ties import human_near_tie, human_top2_gap
from variants.io import _atomic
from variants.runfiles import (CorruptFileError, check_same_ids, read_build, read_metrics,
                               read_outputs, read_run_json, read_summary, read_timing,
                               read_verdict)

log = logging.getLogger(__name__)

from contracts.exit_codes import EXIT_USER_ERROR  # noqa: E402
#: Equal-width confidence bins of the reliability diagrams (as ``metrics.calibration``'s ECE).
from metrics.defaults import N_BINS  # noqa: E402
#: Reference top-2 margin bins (raw-logit units) of the flip-strata plot.
MARGIN_BINS = (0.0, 0.5, 1.0, 2.0, 4.0, math.inf)
#: An example is a *human* near tie when its two most chosen options' rater shares differ by at
#: most this much (share units, 0..1; ``metrics.ties.human_near_tie``'s default).
from metrics.defaults import HUMAN_TIE_GAP as HUMAN_NEAR_TIE_GAP  # noqa: E402
#: Pareto panels: (summary column, axis label, higher is better, reference value column or number).
PARETO_METRICS = (
    ("agreement", "agreement (share of eval examples)", True, 1.0),
    ("certified_share", "certified share (ref. margin > 2ε)", True, 1.0),
    ("ece_variant", "ECE (top label, 15 bins)", False, "ece_ref"),
    ("action_max_abs_diff_max", "max action drift |Δp| (probability)", False, 0.0),
)
VERDICT_MARKERS = {"PASS": "o", "FAIL": "X"}
FLIP_COLORS = {"agree": "#9e9e9e", "negative flip": "#d62728", "positive flip": "#2ca02c",
               "other flip": "#ff7f0e"}
#: Caption of each plot file (by name prefix), used by :func:`plots_markdown`.
CAPTIONS = {
    "pareto": "Pareto view: measured speed-up (x) against the contract figures, one point per "
              "variant (★ = reference); front = variants no other beats on both axes",
    "reliability": "Reliability diagrams: accuracy vs confidence per bin, reference and variants, "
                   "with bin counts",
    "margin_drift": "Margin vs drift: reference top-2 margin against max |Δlogit| per eval "
                    "example; flips highlighted, near-tie band shaded, 2ε line",
    "flip_strata": "Negative / positive flips per reference-margin bin, option count and human "
                   "near tie",
}


class PlotError(ValueError):
    """A results folder that cannot be plotted (missing, not a finished sweep, no variant)."""


class SkipPlot(Exception):
    """Raised by a plot function when the run lacks what it draws; the message says what."""


# ---------------------------------------------------------------------------------------------
# Reading a run folder
# ---------------------------------------------------------------------------------------------

#: The validating reader of each per-variant JSON file :meth:`Run.json` reads.
JSON_READERS = {"build.json": read_build, "metrics.json": read_metrics,
                "verdict.json": read_verdict, "timing.json": read_timing}


class Run:
    """A finished sweep folder, read lazily. Build it with :func:`load_run`.

    Attributes
    ----------
    path : Path
    meta : dict
        ``run.json``.
    summary : pandas.DataFrame
        ``summary.csv``, one row per variant (at least one).
    """

    def __init__(self, path, meta, summary):
        self.path = Path(path)
        self.meta = meta
        self.summary = summary
        self._outputs = {}
        self._json = {}
        self._evaluations = {}

    @property
    def name(self):
        return self.meta.get("config", {}).get("run", self.path.name)

    @property
    def variants(self):
        """Variant names in summary order."""
        return self.summary["variant"].astype(str).tolist()

    @property
    def config(self):
        return self.meta.get("config", {})

    @property
    def batch_sizes(self):
        """Timed batch sizes (from ``b<B>_speedup`` columns), ascending."""
        return sorted(int(c[1:-len("_speedup")]) for c in self.summary.columns
                      if c.startswith("b") and c.endswith("_speedup") and c[1:-8].isdigit())

    @property
    def label(self):
        """One line naming the model, data split and execution modes, for every plot."""
        cfg = self.config
        n_eval = self.meta.get("data", {}).get("splits", {}).get("eval", {}).get("n", "?")
        return (f"{cfg.get('model', '?')} · run {self.name} · eval split n={n_eval} (VADER) · "
                f"quality: {cfg.get('quality_mode', '?')} mode, speed: "
                f"{cfg.get('speed_mode', '?')} mode on {self.meta.get('device', '?')}")

    def outputs(self, name, split="eval"):
        """Arrays of ``<name>/outputs.npz`` (``split='eval'``) or ``calibration_outputs.npz``.

        ``name`` is a variant or ``"reference"``. Returns a dict of ndarrays (cached); raises
        PlotError when the file is missing, ``variants.runfiles.CorruptFileError`` when it is not
        a valid outputs file.
        """
        key = (name, split)
        if key not in self._outputs:
            file = "outputs.npz" if split == "eval" else f"{split}_outputs.npz"
            path = self.path / name / file
            if not path.is_file():
                raise PlotError(f"{path} is missing; rerun the sweep to complete {self.path}.")
            self._outputs[key] = read_outputs(path)
        return self._outputs[key]

    def json(self, name, file):
        """``<name>/<file>`` (a key of ``JSON_READERS``, e.g. ``build.json``) as a dict, read and
        validated once; {} when absent. Raises CorruptFileError when it is not valid."""
        key = (name, file)
        if key not in self._json:
            path = self.path / name / file
            self._json[key] = JSON_READERS[file](path) if path.is_file() else {}
        return self._json[key]

    def read_all(self):
        """Read and validate every file the plots use (outputs, metrics, verdict and build of
        each variant; the reference's outputs), so a corrupt one stops :func:`plot_run` before
        any PNG is written. Raises PlotError or CorruptFileError."""
        ref = self.outputs("reference")
        for name in self.variants:
            o = self.outputs(name)
            if len(o["ids"]) != len(ref["ids"]) or o["logits"].shape != ref["logits"].shape:
                raise CorruptFileError(
                    self.path / name / "outputs.npz", "outputs file",
                    f"logits {o['logits'].shape}, the reference's {ref['logits'].shape}")
            check_same_ids(self.path / name / "outputs.npz", o["ids"], ref["ids"])
            for file in ("verdict.json", "build.json"):
                self.json(name, file)
            self.evaluation(name)

    def evaluation(self, name):
        """:func:`metrics.evaluate.evaluate` of variant ``name`` against the reference, with the
        sweep's ε (``metrics.json``) and near-tie margin (``run.json``)."""
        if name not in self._evaluations:
            eps = self.json(name, "metrics.json").get("epsilon")
            if eps is None:
                raise PlotError(f"{self.path / name / 'metrics.json'} has no epsilon; rerun the "
                                f"sweep to rewrite it.")
            self._evaluations[name] = evaluate(
                self.outputs("reference"), self.outputs(name), epsilon=eps,
                near_tie_margin=self.config.get("near_tie_margin", 1.0), n_bins=N_BINS)
        return self._evaluations[name]

    def per_example(self):
        """All variants' per-example tables stacked, with ``variant``, ``human_near_tie`` (bool,
        NA without raters) and ``margin_bin`` columns added."""
        ref = self.outputs("reference")
        human = _human_near_tie(ref["human_dist"], ref["option_mask"])
        frames = []
        for name in self.variants:
            df = self.evaluation(name).per_example.copy()
            df.insert(0, "variant", name)
            df["human_near_tie"] = human
            frames.append(df)
        out = pd.concat(frames, ignore_index=True)
        out["margin_bin"] = pd.cut(out["ref_margin"], MARGIN_BINS, right=False,
                                   labels=_bin_labels(MARGIN_BINS))
        return out


def _bin_labels(edges):
    return [f"{lo:g}–{hi:g}" if math.isfinite(hi) else f"≥ {lo:g}"
            for lo, hi in zip(edges[:-1], edges[1:])]


def _human_near_tie(human_dist, option_mask):
    """(N,) pandas boolean: raters split (``metrics.ties``, gap <= ``HUMAN_NEAR_TIE_GAP``); NA
    where an example has no raters."""
    gap = human_top2_gap(human_dist, option_mask)
    out = pd.array(human_near_tie(gap, tie_gap=HUMAN_NEAR_TIE_GAP), dtype="boolean")
    out[np.isnan(gap)] = pd.NA
    return out


def load_run(run_dir):
    """Read a sweep folder written by ``variants sweep``.

    Parameters
    ----------
    run_dir : path-like
        ``results/<run>`` holding ``run.json`` and ``summary.csv``.

    Returns
    -------
    Run

    Raises
    ------
    PlotError
        If the folder is missing, is not a finished sweep (no ``summary.csv``/``run.json``), or
        its ``summary.csv`` lists no variant. The message says what to pass instead.
    variants.runfiles.CorruptFileError
        If ``run.json`` or ``summary.csv`` does not parse or has the wrong shape.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise PlotError(f"results folder {short_path(path)} does not exist; pass a sweep folder "
                        "such as results/minilm-sentiment-quant-g64.")
    if not (path / "summary.csv").is_file():
        runs = sorted(p.parent.name for p in path.glob("*/summary.csv"))
        hint = (f"it holds the runs {', '.join(runs)}: pass one of them, e.g. {path / runs[0]}"
                if runs else "run `variants sweep` first (it writes summary.csv at the end)")
        raise PlotError(f"{path} has no summary.csv, so it is not a finished sweep; {hint}.")
    if not (path / "run.json").is_file():
        raise PlotError(f"{path} has summary.csv but no run.json; rerun the sweep to finish it.")
    summary = read_summary(path / "summary.csv")
    if summary.empty:
        raise PlotError(f"{path}/summary.csv lists no variant, so there is nothing to plot; run "
                        f"a sweep with at least one variant (e.g. --bits 4).")
    return Run(path, read_run_json(path / "run.json"), summary)


# ---------------------------------------------------------------------------------------------
# Plot helpers
# ---------------------------------------------------------------------------------------------

@contextmanager
def _style():
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        yield


def _figure(run, title, ncols, nrows=1, *, width=4.6, height=3.6):
    fig = Figure(figsize=(width * ncols, height * nrows + 0.7), layout="constrained")
    label = run.label if width * ncols >= 13 else run.label.replace(" · quality:", "\nquality:")
    fig.suptitle(f"{title}\n{label}", fontsize=10 if width * ncols >= 9 else 9)
    return fig


def _palette(families):
    return dict(zip(families, sns.color_palette("tab10", len(families))))


def _verdict_legend(ax, extra=()):
    handles = [Line2D([], [], marker=m, ls="", color="0.3", label=v)
               for v, m in VERDICT_MARKERS.items()]
    ax.legend(handles=list(extra) + handles, fontsize=7, loc="best", framealpha=0.8)


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


def _contract_threshold(run, metric):
    """(op, threshold) of the contract clause on ``metric`` over all examples, or None."""
    for name in run.variants:
        for c in run.json(name, "verdict.json").get("clauses", []):
            if c.get("metric") == metric and c.get("stratum") == "all":
                return c.get("op"), c.get("threshold")
    return None


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------

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
        fig = _figure(run, f"Pareto view at batch size {batch_size} "
                           f"({run.summary.get('speed_mode', pd.Series(['?'])).iloc[0]} speed)",
                      2, 2, width=5.0, height=3.4)
        axes = fig.subplots(2, 2).ravel()
        for ax, (metric, ylabel, higher, ref_value) in zip(axes, PARETO_METRICS):
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
            thr = _contract_threshold(run, metric)
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


def margin_vs_drift(run, *, max_cols=3):
    """Per eval example: reference top-2 margin (x) vs max |Δlogit| (y), one panel per variant.

    The dashed diagonal is drift = margin / 2 (a flip needs drift above it); the vertical line is
    2ε (examples to its right are certified); the shaded band is the near-tie band. Examples with
    a single option (margin +inf) are left out and counted in the panel title.
    """
    per = run.per_example()
    near = run.config.get("near_tie_margin", 1.0)
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
            finite = np.isfinite(d["ref_margin"])
            d = d[finite]
            kind = np.where(~d["flip"], "agree",
                            np.where(d["negative_flip"].fillna(False), "negative flip",
                                     np.where(d["positive_flip"].fillna(False), "positive flip",
                                              "other flip")))
            xmax = max(float(d["ref_margin"].max()) if len(d) else 1.0, 2 * eps, near) * 1.05
            ymax = max(float(d["max_abs_logit_diff"].max()) if len(d) else 0.0, eps) * 1.25 or 1
            ax.axvspan(0, near, color="khaki", alpha=0.35, lw=0,
                       label=f"near tie (margin < {near:g})")
            xs = np.linspace(0, xmax, 50)
            ax.plot(xs, xs / 2, color="0.35", ls="--", lw=1, label="drift = margin / 2")
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
                         + (f" ({dropped} single-option examples not shown)" if dropped else ""),
                         fontsize=9)
            ax.legend(fontsize=6, loc="upper right", framealpha=0.85)
        for ax in axes[len(names):]:
            ax.set_axis_off()
    return fig


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
                             f"{run.config.get('near_tie_margin', 1.0):g})"),
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


# --- per family: one small function each, registered in FAMILY_PLOTS --------------------------

def _family_rows(run, family, columns):
    s = run.summary[run.summary["family"].astype(str) == family]
    missing = [c for c in columns if c not in s.columns or s[c].isna().all()]
    if missing:
        raise SkipPlot(f"family {family!r}: summary.csv has no {', '.join(missing)}")
    return s


def quant_bits_agreement(run, family="quant"):
    """Quantization: bits per weight (x) vs agreement (y), one point per variant."""
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


def exit_summaries(run, family="exit"):
    """Per early-exit variant of ``run``: :func:`variants.builders.exit_rules.exit_summary` of the
    eval split (histogram, expected cost, near ties by the reference's raw-logit margin below the
    sweep's ``near_tie_margin``), from ``exit_layer`` in ``<variant>/outputs.npz``.

    Returns
    -------
    dict {variant: summary dict}; variants without ``exit_layer`` are left out.
    """
    from variants.builders.exit_rules import exit_summary  # NumPy only, no MLX

    if "family" not in run.summary.columns:
        return {}
    ref = run.outputs("reference")
    out = {}
    for name in run.summary.loc[run.summary["family"].astype(str) == family, "variant"]:
        o = run.outputs(str(name))
        if "exit_layer" not in o:
            continue
        build = run.json(str(name), "build.json")
        n_layers = int(build.get("n_layers", int(o["exit_layer"].max())))
        out[str(name)] = exit_summary(o["exit_layer"], n_layers, ref["logits"],
                                      ref["option_mask"],
                                      run.config.get("near_tie_margin", 1.0),
                                      build.get("exit_layers"))
    return out


def exit_markdown(run_dir, family="exit"):
    """Markdown table of :func:`exit_summaries` (eval split) for a run folder; "" when no variant
    has an ``exit_layer`` array."""
    try:
        sums = exit_summaries(load_run(run_dir), family)
    except (PlotError, OSError, ValueError, KeyError):
        return ""
    if not sums:
        return ""
    lines = ["====== Early exit on the eval split ======", "",
             "Exit histogram = eval examples per exit layer (the last = ran every layer); cost = "
             "mean fraction of layers run; near ties = reference top-2 raw-logit margin below "
             "the sweep's near-tie margin.", "",
             "| variant | exit histogram | cost | ideal | exited early | near ties | mean exit "
             "layer near ties / others | ran every layer near ties / others |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    f = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
    for name, s in sums.items():
        hist = "/".join(str(v) for v in s["exit_histogram"].values())
        lines.append(
            f"| {name} | {hist} | {s['expected_cost']:.3f} | {s['ideal_speedup']:.2f}× | "
            f"{s['exited_early_share']:.0%} | {s['n_near_tie']} | "
            f"{f(s['near_tie_mean_exit_layer'], '.2f')} / {f(s['other_mean_exit_layer'], '.2f')}"
            f" | {f(s['near_tie_ran_all_share'], '.0%')} / {f(s['other_ran_all_share'], '.0%')} |")
    return "\n".join(lines) + "\n\n"


#: Family name (``summary.csv`` ``family``, as in ``variants.builders.FAMILIES``) -> plot function.
FAMILY_PLOTS = {
    "quant": quant_bits_agreement,
    "lowrank": lowrank_profile,
    "prune": prune_keep_ratio_speedup,
    "exit": exit_layer_histogram,
}


# ---------------------------------------------------------------------------------------------
# Whole run, report snippet, CLI
# ---------------------------------------------------------------------------------------------

def figures(run):
    """Yield ``(file stem, thunk)`` for every plot of ``run``; a thunk returns a Figure or raises
    :class:`SkipPlot`."""
    for b in run.batch_sizes:
        yield f"pareto_b{b}", lambda b=b: pareto_view(run, b)
    yield "reliability", lambda: reliability_diagrams(run)
    yield "margin_drift", lambda: margin_vs_drift(run)
    yield "flip_strata", lambda: flip_strata(run)
    for family in sorted(run.summary["family"].astype(str).unique()):
        fn = FAMILY_PLOTS.get(family)
        if fn is None:
            log.info("no family plot for %r; add one to variants.plots.FAMILY_PLOTS", family)
            continue
        yield f"family_{family}", lambda fn=fn, family=family: fn(run, family)


def _save(fig, path, dpi):
    _atomic(path, lambda f: fig.savefig(f, format="png", dpi=dpi), "wb")
    return path


def plot_run(run_dir, *, dpi=110):
    """Write every plot of a sweep folder to ``<run_dir>/plots/<name>.png``.

    Parameters
    ----------
    run_dir : path-like
        A finished sweep folder (``results/<run>``).
    dpi : int, default=110

    Returns
    -------
    paths : list of Path
        The PNG files written, in report order. A plot the run cannot provide (e.g. a family
        plot whose columns are absent) is skipped with a logged note (logger ``variants.plots``).

    Raises
    ------
    PlotError
        If the folder is missing, not a finished sweep, or lists no variant.
    variants.runfiles.CorruptFileError
        If a file the plots read is corrupt; raised before any PNG is written.
    """
    run = load_run(run_dir)
    run.read_all()
    if len(run.variants) == 1:
        log.warning("%s holds a single variant (%s): plots show it against the reference only",
                    run.path, run.variants[0])
    out = run.path / "plots"
    paths = []
    for stem, make in figures(run):
        try:
            fig = make()
        except SkipPlot as e:
            log.info("skipped %s.png: %s", stem, e)
            continue
        paths.append(_save(fig, out / f"{stem}.png", dpi))
    return paths


def plots_markdown(paths, run_dir):
    """Markdown section embedding ``paths`` (PNG files) with links relative to ``run_dir``.

    Returns
    -------
    str
        ``"====== Plots ======"`` then one ``![caption](plots/x.png)`` per file; "" for no paths.
        With an early-exit histogram among ``paths``, :func:`exit_markdown`'s eval-split table
        follows.
    """
    if not paths:
        return ""
    lines = ["====== Plots ======", ""]
    for p in paths:
        p = Path(p)
        key = next((k for k in CAPTIONS if p.stem.startswith(k)), None)
        caption = CAPTIONS.get(key, p.stem)
        if p.stem.startswith("pareto_b"):
            caption += f" (batch size {p.stem[len('pareto_b'):]})"
        elif p.stem.startswith("family_"):
            fn = FAMILY_PLOTS.get(p.stem[len("family_"):])
            caption = fn.__doc__.strip().splitlines()[0].rstrip(".") if fn else p.stem
        try:
            rel = p.resolve().relative_to(Path(run_dir).resolve()).as_posix()
        except ValueError:
            raise ValueError(f"plot {p} is not inside run_dir {run_dir}; pass the paths "
                             f"plot_run(run_dir) returned.") from None
        lines += [f"![{caption}]({rel})", ""]
    text = "\n".join(lines) + "\n"
    if any(Path(p).stem == "family_exit" for p in paths):
        text += "\n" + exit_markdown(run_dir)
    return text


def main(args):
    """``variants plot RESULTS_DIR``: write the plots; returns the exit code (2 on bad input)."""
    logging.basicConfig(level=logging.INFO, format="variants plot: %(message)s",
                        stream=sys.stderr)
    from contextlib import nullcontext

    from variants import runlock

    # plot_run writes into the folder: hold its lock, so a running sweep refuses us and we it
    lock = (runlock.hold(args.results_dir, log=log.info,
                         fix="wait for it to finish (the sweep writes the plots itself)")
            if Path(args.results_dir).is_dir() else nullcontext())
    try:
        with lock:
            paths = plot_run(args.results_dir, dpi=args.dpi)
    except (PlotError, CorruptFileError, runlock.RunLocked) as e:
        print(f"variants: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    for p in paths:
        print(p)
    return 0


def configure_parser(subparsers):
    """Add the ``plot`` subcommand to an argparse ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "plot", help="write PNG plots of a finished sweep folder to RESULTS_DIR/plots/",
        description="Read a sweep folder (run.json, summary.csv, per-variant outputs and metrics; "
                    "no model is loaded) and write plots/*.png: Pareto view per timed batch size, "
                    "reliability diagrams, margin vs drift, flip strata, and per-family views. "
                    "It holds the folder's lock while writing: while a sweep writes that run it "
                    "refuses (exit 2, naming the sweep).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("results_dir", metavar="RESULTS_DIR",
                   help="a sweep folder, e.g. results/minilm-sentiment-quant-g64")
    p.add_argument("--dpi", type=int, default=110, help="resolution of the PNG files")
    p.set_defaults(func=main)
    return p

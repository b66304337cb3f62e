"""The plots section of a run's report.md: captions, links, the early-exit table (no matplotlib).

Captions come from :data:`CAPTIONS` (per plot kind) and :data:`FAMILY_CAPTIONS` (per family
plot: the first line of its function's docstring in :mod:`runs.plots.family`), so writing the
report never imports matplotlib or seaborn.
"""

from metrics.defaults import NEAR_TIE_MARGIN
from pathlib import Path

from runs.exits import exit_summary
from runs.folder import RunFolder
from runs.plots.data import PlotError, load_run

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



#: Caption of each family plot (``family_<name>.png``): the first line of the docstring of
#: ``runs.plots.family.FAMILY_PLOTS[name]``, without its final full stop.
FAMILY_CAPTIONS = {
    "quant": "Quantization: bits per weight (x) vs agreement (y), one point per variant",
    "lowrank": "Low rank: rank and retained energy per layer, from ``build.json[\"layers\"]`` (list of",
    "prune": "Pruning: keep ratio (x) vs speed-up at each timed batch size (y)",
    "exit": "Early exit: histogram of the exit layer per eval example (``exit_layer`` in outputs.npz)",
}


def exit_summaries(run, family="exit"):
    """Per early-exit variant of ``run``: :func:`runs.exits.exit_summary` of the
    eval split (histogram, expected cost, near ties by the reference's raw-logit margin below the
    sweep's ``near_tie_margin``), from ``exit_layer`` in ``<variant>/outputs.npz``.

    Returns
    -------
    dict {variant: summary dict}; variants without ``exit_layer`` are left out.
    """
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
                                      run.config.get("near_tie_margin", NEAR_TIE_MARGIN),
                                      build.get("exit_layers"))
    return out


def exit_markdown(run_dir, family="exit"):
    """Markdown table of :func:`exit_summaries` (eval split) for a run folder (path-like or
    :class:`runs.folder.RunFolder`); "" when no variant has an ``exit_layer`` array."""
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


#: Family name (``summary.csv`` ``family``, as in ``variants.families.FAMILIES``) -> plot function.


#: plots (file stem prefixes) that draw softmax figures only: not linked for a run whose model
#: outputs something else (a file left from an older write of the folder included)
SOFTMAX_ONLY = ("reliability", "margin_drift", "flip_strata")
#: the quantization plot's caption of a head that is not a softmax (runs.plots.family.HEAD_Y)
HEAD_QUANT_CAPTIONS = {
    "regression": "Quantization: bits per weight (x) vs max relative value error (y), one point "
                  "per variant",
    "multi_label": "Quantization: bits per weight (x) vs share of rows whose label set changed "
                   "(y), one point per variant",
}


def _run_outputs(run_dir):
    """run.json's ``model.outputs`` of ``run_dir`` (``softmax`` when it cannot be read)."""
    from metrics.head_view import run_outputs

    try:
        return run_outputs(RunFolder(run_dir).meta)
    except (OSError, ValueError):  # an unreadable run.json: judged as a softmax, as before
        return "softmax"


def plots_markdown(paths, run_dir, *, run=None, outputs=None):
    """Markdown section embedding ``paths`` (PNG files) with links relative to ``run_dir``.

    ``run`` (a :class:`runs.folder.RunFolder` of ``run_dir``), when given, is what the
    early-exit table reads (sharing its reads); default ``run_dir`` itself. ``outputs`` (what
    the model outputs, :func:`metrics.head_view.run_outputs`; default: ``run_dir``'s run.json):
    for a multi-label or regression run the :data:`SOFTMAX_ONLY` plots are not linked and the
    quantization plot is captioned with the head's figure.

    Returns
    -------
    str
        ``"====== Plots ======"`` then one ``![caption](plots/x.png)`` per file; "" for no paths.
        With an early-exit histogram among ``paths``, :func:`exit_markdown`'s eval-split table
        follows.
    """
    if not paths:
        return ""
    if outputs is None:
        outputs = _run_outputs(run.path if run is not None else run_dir)
    if outputs != "softmax":
        paths = [p for p in paths if not Path(p).stem.startswith(SOFTMAX_ONLY)]
    lines = ["====== Plots ======", ""]
    for p in paths:
        p = Path(p)
        key = next((k for k in CAPTIONS if p.stem.startswith(k)), None)
        caption = CAPTIONS.get(key, p.stem)
        if p.stem.startswith("pareto_b"):
            caption += f" (batch size {p.stem[len('pareto_b'):]})"
        elif p.stem == "family_quant" and outputs in HEAD_QUANT_CAPTIONS:
            caption = HEAD_QUANT_CAPTIONS[outputs]
        elif p.stem.startswith("family_"):
            caption = FAMILY_CAPTIONS.get(p.stem[len("family_"):], p.stem)
        try:
            rel = p.resolve().relative_to(Path(run_dir).resolve()).as_posix()
        except ValueError:
            raise ValueError(f"plot {p} is not inside run_dir {run_dir}; pass the paths "
                             f"plot_run(run_dir) returned.") from None
        lines += [f"![{caption}]({rel})", ""]
    text = "\n".join(lines) + "\n"
    if any(Path(p).stem == "family_exit" for p in paths):
        text += "\n" + exit_markdown(run_dir if run is None else run)
    return text


#: Order of the plots in report.md, as :func:`runs.plots.render.plot_run` writes them.
_PLOT_ORDER = ("pareto_b", "reliability", "margin_drift", "flip_strata", "family_")


def _plot_key(path):
    stem = Path(path).stem
    rank = next((i for i, p in enumerate(_PLOT_ORDER) if stem.startswith(p)), len(_PLOT_ORDER))
    num = stem[len("pareto_b"):] if stem.startswith("pareto_b") else ""
    return (rank, int(num) if num.isdigit() else 0, stem)


def report_tail(run_dir, out_dir):
    """The plots section (and the early-exit table) of a run's report.md written to ``out_dir``.

    The run's ``plots/*.png`` are embedded in the order the sweep writes them; with ``out_dir``
    other than ``run_dir`` they are copied to ``out_dir/plots`` first, so the links resolve. The
    "Early exit on the eval split" table (:func:`exit_markdown`, read from the run's saved
    outputs) is added whenever the run has early-exit variants.

    Parameters
    ----------
    run_dir : path-like or runs.folder.RunFolder
        The run (a RunFolder shares the outputs the judge already read).
    out_dir : path-like

    Returns
    -------
    str (Markdown; "" without plots and early-exit variants)
    """
    import shutil

    run = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
    run_dir, out_dir = run.path, Path(out_dir)
    outputs = _run_outputs(run.path)
    plots = sorted((run_dir / "plots").glob("*.png"), key=_plot_key)
    if outputs != "softmax":  # softmax-only plots (an older write's files too): not linked
        plots = [p for p in plots if not p.stem.startswith(SOFTMAX_ONLY)]
    same = out_dir.resolve() == run_dir.resolve()
    if plots and not same:
        (out_dir / "plots").mkdir(parents=True, exist_ok=True)
        copied = []
        for p in plots:
            shutil.copyfile(p, out_dir / "plots" / p.name)
            copied.append(out_dir / "plots" / p.name)
        plots = copied
    text = plots_markdown(plots, out_dir, run=run if same else None, outputs=outputs)
    if "====== Early exit on the eval split" not in text:
        table = exit_markdown(run)
        if table:
            text += "\n" + table
    return text

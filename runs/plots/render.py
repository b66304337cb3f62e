"""Write every plot of a sweep folder to ``<run>/plots/*.png`` (matplotlib Agg, no pyplot state;
each file written atomically through :func:`runs.io.atomic_write`)."""

from runs import io as rio
from runs.plots.data import DPI_RANGE, PlotError, SkipPlot, load_run, log
from runs.plots.family import FAMILY_PLOTS
from runs.plots.flip_strata import flip_strata
from runs.plots.margin_drift import margin_vs_drift
from runs.plots.pareto import pareto_view
from runs.plots.reliability import reliability_diagrams


def check_dpi(dpi, flag="dpi"):
    """Raise PlotError, naming ``flag``, unless ``dpi`` is an integer within ``DPI_RANGE``."""
    lo, hi = DPI_RANGE
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not lo <= dpi <= hi:
        raise PlotError(f"{flag} {dpi!r} is out of range; pass an integer in [{lo}, {hi}], "
                        "e.g. 110")


def figures(run):
    """Yield ``(file stem, thunk)`` for every plot of ``run``; a thunk returns a Figure or raises
    :class:`SkipPlot`."""
    from metrics.head_view import run_outputs

    softmax = run_outputs(run.meta) == "softmax"
    for b in run.batch_sizes:  # a multi-label or regression head: its own figures' panels
        yield f"pareto_b{b}", lambda b=b: pareto_view(run, b)
    if softmax:  # top-option confidence, top-2 margin and flips: softmax figures only
        yield "reliability", lambda: reliability_diagrams(run)
        yield "margin_drift", lambda: margin_vs_drift(run)
        yield "flip_strata", lambda: flip_strata(run)
    else:
        log.info("no reliability, margin_drift or flip_strata plot: the model outputs %s, not "
                 "a softmax", run_outputs(run.meta))
    for family in sorted(run.summary["family"].astype(str).unique()):
        fn = FAMILY_PLOTS.get(family)
        if fn is None:
            log.info("no family plot for %r; add one to runs.plots.family.FAMILY_PLOTS", family)
            continue
        yield f"family_{family}", lambda fn=fn, family=family: fn(run, family)


def _save(fig, path, dpi):
    rio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi), "wb")
    return path


def plot_run(run_dir, *, dpi=110, evaluations=None):
    """Write every plot of a sweep folder to ``<run_dir>/plots/<name>.png``.

    Parameters
    ----------
    run_dir : path-like
        A finished sweep folder (``results/<run>``).
    dpi : int, default=110
        Within :data:`runs.plots.data.DPI_RANGE`.
    evaluations : dict of str -> metrics.evaluate.Evaluation, optional
        The judge's evaluations of the variants (the sweep hands them over): not recomputed.

    Returns
    -------
    paths : list of Path
        The PNG files written, in report order. A plot the run cannot provide (e.g. a family
        plot whose columns are absent) is skipped with a logged note (logger ``runs.plots``).

    Raises
    ------
    PlotError
        If ``dpi`` is not an integer in ``DPI_RANGE``, or the folder is missing, not a
        finished sweep, or lists no variant.
    runs.readers.CorruptFileError
        If a file the plots read is corrupt; raised before any PNG is written.
    """
    check_dpi(dpi)
    run = load_run(run_dir, evaluations=evaluations)
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

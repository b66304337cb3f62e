"""What the plots read from a finished sweep folder: :class:`Run` (run.json, summary.csv,
outputs, per-variant JSON and evaluations) and :func:`load_run` (no MLX, no matplotlib).

A :class:`Run` is a view over a :class:`runs.folder.RunFolder` (every file read and validated
once) that adds what plots need: the variants in summary order, the timed batch sizes, a label
line, and each variant's :func:`metrics.evaluate.evaluate` against the reference, handed over by
the judge when it has just made them.
"""

import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from metrics._checks import short_path
from metrics.ties import human_near_tie, human_top2_gap
from runs.folder import OUTPUT_FILES, CheckError, RunFolder
from metrics.defaults import NEAR_TIE_MARGIN
from runs.npz_readers import check_same_ids
from runs.readers import CorruptFileError

#: Resolutions ``dpi`` may take: below 20 the text is unreadable; at 600 a figure is already
#: tens of millions of pixels (matplotlib's Agg raises MemoryError far beyond)
DPI_RANGE = (20, 600)


#: Logger of the plots (``variants plot`` prints its records as ``variants plot: ...``).
log = logging.getLogger("runs.plots")

#: Equal-width confidence bins of the reliability diagrams (as ``metrics.calibration``'s ECE).
from metrics.defaults import N_BINS  # noqa: E402
#: Reference top-2 margin bins (raw-logit units) of the flip-strata plot.
MARGIN_BINS = (0.0, 0.5, 1.0, 2.0, 4.0, math.inf)
#: An example is a *human* near tie when its two most chosen options' rater shares differ by at
#: most this much (share units, 0..1; ``metrics.ties.human_near_tie``'s default).
from metrics.defaults import HUMAN_TIE_GAP as HUMAN_NEAR_TIE_GAP  # noqa: E402


class PlotError(ValueError):
    """A results folder that cannot be plotted (missing, not a finished sweep, no variant)."""


class SkipPlot(Exception):
    """Raised by a plot function when the run lacks what it draws; the message says what."""


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

    def __init__(self, path, meta, summary, *, folder=None, evaluations=None):
        self.folder = folder if folder is not None else RunFolder(path)
        self.path = self.folder.path
        self.meta = meta
        self.summary = summary
        self._evaluations = dict(evaluations or {})

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
        data = self.meta.get("data", {})
        n_eval = data.get("splits", {}).get("eval", {}).get("n", "?")
        src = data.get("source", "")
        src = "VADER" if src.startswith("VADER") else (Path(src).name if src else "?")
        return (f"{cfg.get('model', '?')} · run {self.name} · eval split n={n_eval} ({src}) · "
                f"quality: {cfg.get('quality_mode', '?')} mode, speed: "
                f"{cfg.get('speed_mode', '?')} mode on {self.meta.get('device', '?')}")

    def outputs(self, name, split="eval"):
        """Arrays of ``<name>/outputs.npz`` (``split='eval'``) or ``calibration_outputs.npz``.

        ``name`` is a variant or ``"reference"``. Returns a dict of ndarrays (read once by the
        run's :class:`runs.folder.RunFolder`); raises PlotError when the file is missing,
        ``runs.readers.CorruptFileError`` when it is not a valid outputs file.
        """
        try:
            return self.folder.outputs(name, split)
        except CheckError:  # the folder's "missing" error, in the plots' words
            raise PlotError(f"{self.path / name / OUTPUT_FILES[split]} is missing; rerun the "
                            f"sweep to complete {self.path}.") from None

    def json(self, name, file):
        """``<name>/<file>`` (a key of ``runs.folder.JSON_READERS``, e.g. ``build.json``) as a
        dict, read and validated once; {} when absent. Raises CorruptFileError when invalid."""
        return self.folder.json(name, file)

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

    def evaluation(self, name, drop=None):
        """:func:`metrics.evaluate.evaluate` of variant ``name`` against the reference, with the
        sweep's ε (``metrics.json``), near-tie margin and numerical noise (``run.json``), unless the judge handed
        its own evaluation over (``evaluations`` of :func:`load_run`): the plots read only its
        per-example ``ref_margin``, ``max_abs_logit_diff``, ``flip``, ``negative_flip``,
        ``positive_flip``, ``label``, ``n_options`` and ``epsilon``, which are the same.

        Rows the variant answered with NaN or inf are left out, as the judge leaves them out
        (``nonfinite`` set as the judge sets it, :mod:`metrics.finite`); ``drop`` ((N,) bool,
        not cached) leaves out more rows (``variants compare``: the rows either side lost)."""
        if drop is None and name in self._evaluations:
            return self._evaluations[name]
        from metrics.evaluate import evaluate
        from metrics.finite import nonfinite_rows
        from runs.settings import numerical_noise

        eps = self.json(name, "metrics.json").get("epsilon")
        if eps is None:
            raise PlotError(f"{self.path / name / 'metrics.json'} has no epsilon; rerun the "
                            f"sweep to rewrite it.")
        ref, var = self.outputs("reference"), self.outputs(name)
        bad = nonfinite_rows(var)
        keep = ~bad if drop is None else ~(bad | np.asarray(drop, bool))
        if not keep.all():
            ref, var = ({k: v[keep] for k, v in o.items()} for o in (ref, var))
        # a regression verdict's tolerance (contract [settings] value_tolerance), as judged
        tol = (self.json(name, "verdict.json").get("settings") or {}).get("value_tolerance")
        ev = evaluate(ref, var, epsilon=eps,
                      near_tie_margin=self.config.get("near_tie_margin", NEAR_TIE_MARGIN),
                      n_bins=N_BINS, numerical_noise=numerical_noise(self.meta,
                                                                     self.path / "run.json"),
                      **({} if tol is None else {"value_tolerance": tol}))
        # the calibration split's count too, as the judge counts it (a variant folder without
        # its calibration outputs is not a judged variant: refused, as check refuses it)
        cal = self.folder.outputs(name, "calibration")
        ev.nonfinite = {"eval": self.outputs(name)["ids"].astype(str)[bad].tolist(),
                        "calibration": cal["ids"].astype(str)[nonfinite_rows(cal)].tolist(),
                        "rows": int(bad.size + len(cal["ids"]))}
        if drop is None:
            self._evaluations[name] = ev
        return ev

    def per_example(self):
        """All variants' per-example tables stacked, with ``variant``, ``human_near_tie`` (bool,
        NA without raters) and ``margin_bin`` columns added."""
        ref = self.outputs("reference")
        human = _human_near_tie(ref["human_dist"], ref["option_mask"])
        frames = []
        where = pd.Index(ref["ids"].astype(str))
        for name in self.variants:
            df = self.evaluation(name).per_example.copy()
            df.insert(0, "variant", name)
            # the evaluation's rows (rows with NaN or inf outputs are not among them)
            df["human_near_tie"] = human[where.get_indexer(df["id"].astype(str))]
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


def load_run(run_dir, *, evaluations=None):
    """Read a sweep folder written by ``variants sweep``.

    Parameters
    ----------
    run_dir : path-like or runs.folder.RunFolder
        ``results/<run>`` holding ``run.json`` and ``summary.csv`` (a RunFolder shares the
        files it already read).
    evaluations : dict of str -> metrics.evaluate.Evaluation, optional
        The judge's evaluations of the variants (the sweep hands them over), so the plots do
        not evaluate again.

    Returns
    -------
    Run

    Raises
    ------
    PlotError
        If the folder is missing, is not a finished sweep (no ``summary.csv``/``run.json``), or
        its ``summary.csv`` lists no variant. The message says what to pass instead.
    runs.readers.CorruptFileError
        If ``run.json`` or ``summary.csv`` does not parse or has the wrong shape.
    """
    folder = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
    path = folder.path
    if not path.is_dir():
        why = "is not a folder" if path.exists() else "does not exist"
        raise PlotError(f"results folder {short_path(path)} {why}; pass a sweep folder "
                        "such as results/minilm-sentiment-quant-g64.")
    if not (path / "summary.csv").is_file():
        runs = sorted(p.parent.name for p in path.glob("*/summary.csv"))
        hint = (f"it holds the runs {', '.join(runs)}: pass one of them, e.g. {path / runs[0]}"
                if runs else "run `variants sweep` first (it writes summary.csv at the end)")
        raise PlotError(f"{path} has no summary.csv, so it is not a finished sweep; {hint}.")
    if not (path / "run.json").is_file():
        raise PlotError(f"{path} has summary.csv but no run.json; rerun the sweep to finish it.")
    summary = folder.summary
    if summary.empty:
        raise PlotError(f"{path}/summary.csv lists no variant, so there is nothing to plot; run "
                        f"a sweep with at least one variant (e.g. --bits 4).")
    return Run(path, folder.meta, summary, folder=folder, evaluations=evaluations)

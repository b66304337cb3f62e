"""Plots of a finished sweep folder, one module per plot family (no MLX).

``data`` (the :class:`Run` view and :func:`load_run`), ``style`` (shared look), ``pareto``,
``reliability``, ``margin_drift``, ``flip_strata``, ``family`` (one plot per variant family,
``FAMILY_PLOTS``), ``render`` (:func:`plot_run`: every PNG) and ``markdown`` (the report's plots
section; imports no matplotlib). The names below are loaded on first use, so importing this
package stays cheap.
"""

import importlib

_WHERE = {
    "Run": "data", "load_run": "data", "PlotError": "data", "SkipPlot": "data", "N_BINS": "data",
    "MARGIN_BINS": "data", "HUMAN_NEAR_TIE_GAP": "data",
    "VERDICT_MARKERS": "style", "FLIP_COLORS": "style",
    "PARETO_METRICS": "pareto", "pareto_view": "pareto",
    "reliability_diagrams": "reliability", "margin_vs_drift": "margin_drift",
    "flip_strata": "flip_strata", "FAMILY_PLOTS": "family",
    "figures": "render", "plot_run": "render",
    "CAPTIONS": "markdown", "FAMILY_CAPTIONS": "markdown", "plots_markdown": "markdown",
    "exit_summaries": "markdown", "exit_markdown": "markdown", "report_tail": "markdown",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"runs.plots.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

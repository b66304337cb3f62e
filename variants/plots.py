"""Moved to :mod:`runs.plots` (issue 15; one module per plot family) and the ``plot`` command
to :mod:`runs.commands.plot`. This shim keeps the old import path working."""

from runs.commands import EXIT_USER_ERROR  # noqa: F401
from runs.commands.plot import configure_parser, main  # noqa: F401
from runs.io import _atomic  # noqa: F401
from runs.plots.data import (HUMAN_NEAR_TIE_GAP, MARGIN_BINS, N_BINS, PlotError, Run,  # noqa: F401
                             SkipPlot, _bin_labels, _human_near_tie, load_run, log)
from runs.plots.family import (FAMILY_PLOTS, exit_layer_histogram, lowrank_profile,  # noqa: F401
                               prune_keep_ratio_speedup, quant_bits_agreement)
from runs.plots.flip_strata import flip_strata  # noqa: F401
from runs.plots.margin_drift import margin_vs_drift  # noqa: F401
from runs.plots.markdown import (CAPTIONS, FAMILY_CAPTIONS, exit_markdown,  # noqa: F401
                                 exit_summaries, plots_markdown)
from runs.plots.pareto import PARETO_METRICS, _pareto_front, pareto_view  # noqa: F401
from runs.plots.reliability import _reliability_table, reliability_diagrams  # noqa: F401
from runs.plots.render import _save, figures, plot_run  # noqa: F401
from runs.plots.style import (FLIP_COLORS, VERDICT_MARKERS, _contract_threshold,  # noqa: F401
                              _figure, _palette, _style, _verdict_legend)

"""Moved to :mod:`runs.plots` (issue 15; one module per plot family) and the ``plot`` command
to :mod:`runs.commands.plot`. This shim keeps the old import path working; the plotting names
load on first use, so ``variants check`` (which builds the ``plot`` subcommand) does not import
matplotlib."""

import importlib

from runs.commands import EXIT_USER_ERROR  # noqa: F401
from runs.commands.plot import configure_parser, main  # noqa: F401

_PRIVATE = {"_atomic": "runs.io", "_bin_labels": "runs.plots.data",
            "_human_near_tie": "runs.plots.data", "log": "runs.plots.data",
            "_pareto_front": "runs.plots.pareto", "_reliability_table": "runs.plots.reliability",
            "_save": "runs.plots.render", "_contract_threshold": "runs.plots.style",
            "_figure": "runs.plots.style", "_palette": "runs.plots.style",
            "_style": "runs.plots.style", "_verdict_legend": "runs.plots.style",
            "exit_layer_histogram": "runs.plots.family", "lowrank_profile": "runs.plots.family",
            "prune_keep_ratio_speedup": "runs.plots.family",
            "quant_bits_agreement": "runs.plots.family"}


def __getattr__(name):
    if name in _PRIVATE:
        return getattr(importlib.import_module(_PRIVATE[name]), name)
    return getattr(importlib.import_module("runs.plots"), name)

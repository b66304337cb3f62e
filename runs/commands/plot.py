"""``variants plot RESULTS_DIR``: write the PNG plots of a finished sweep folder (no MLX)."""

import argparse
import logging
import sys

from metrics._checks import printable
from pathlib import Path

from runs.commands import EXIT_USER_ERROR
from runs.commands.args import folder, number
from runs.plots.data import DPI_RANGE, PlotError, log
from runs.readers import CorruptFileError


def main(args):
    """``variants plot RESULTS_DIR``: write the plots; returns the exit code (2 on bad input)."""
    logging.basicConfig(level=logging.INFO, format="variants plot: %(message)s",
                        stream=sys.stderr)
    from contextlib import nullcontext

    from runs import lock as runlock
    from runs.plots.render import plot_run

    # plot_run writes into the folder: hold its lock, so a running sweep refuses us and we it;
    # a folder without summary.csv is no finished sweep: plot_run refuses it, nothing written
    lock = (runlock.hold(args.results_dir, log=log.info,
                         fix="wait for it to finish (the sweep writes the plots itself)")
            if Path(args.results_dir, "summary.csv").is_file() else nullcontext())
    try:
        with lock:
            paths = plot_run(args.results_dir, dpi=args.dpi)
    except (PlotError, CorruptFileError, runlock.RunLocked) as e:
        print(f"variants: error: {printable(e)}", file=sys.stderr)
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
    p.add_argument("results_dir", metavar="RESULTS_DIR", type=folder,
                   help="a sweep folder, e.g. results/minilm-sentiment-quant-g64")
    p.add_argument("--dpi", type=number(int, low=DPI_RANGE[0], high=DPI_RANGE[1], example=110),
                   default=110, help=f"resolution of the PNG files, {DPI_RANGE[0]} to "
                                     f"{DPI_RANGE[1]}")
    p.set_defaults(func=main)
    return p

"""``variants check`` and ``variants selftest``: their argparse subcommands and handlers (no MLX).

``check`` judges a run folder's saved outputs against a contract (:func:`runs.judge.check_run`);
``selftest`` plants known faults in reference outputs and shows each is caught
(:func:`runs.selftest.run_selftest`). :func:`configure_check` and :func:`configure_selftest` add
them to the ``variants`` command line; :func:`main` runs them stand-alone.
"""

import argparse
import sys

from metrics._checks import printable
from pathlib import Path

from runs.commands import EXIT_OK, EXIT_USER_ERROR, EXIT_VIOLATION
from contracts.contract import MAX_BOOTSTRAP, MAX_NEAR_TIE_MARGIN
from runs.commands.args import Parser, folder, number


def _check_command(args):
    from contextlib import nullcontext

    from runs import lock as runlock
    from runs.io import make_out_dir
    from runs.judge import check_run

    if args.output_dir is not None:  # an unwritable --output-dir: refused before any work
        make_out_dir(args.output_dir, "--output-dir")
    # writing into the run folder: hold its lock (a running sweep refuses us, and we it); a
    # folder that is no run (no reference outputs) is refused by check_run, nothing written
    is_run = Path(args.run_dir, "reference", "outputs.npz").is_file()
    lock = (runlock.hold(args.run_dir, log=lambda m: print(m, file=sys.stderr),
                         fix="wait for it to finish, or pass --output-dir to write elsewhere")
            if args.output_dir is None and is_run else nullcontext())
    with lock:
        verdicts = check_run(args.run_dir, contract=args.contract, variants=args.variant,
                             output_dir=args.output_dir, near_tie_margin=args.near_tie_margin,
                             alpha=args.alpha, n_bootstrap=args.n_bootstrap, seed=args.seed,
                             worst_n=args.worst,
                             log=lambda m: print(m, file=sys.stderr))
    out = Path(args.output_dir or args.run_dir)
    width = max(map(len, verdicts))
    for name, v in verdicts.items():
        print(f"{name:<{width}}  {v.word}  "
              f"{len(v.results) - len(v.failed) - len(v.undecided) - len(v.untested)}/"
              f"{len(v.results)} clauses pass"
              + (f"; failed: {', '.join(v.failed)}" if v.failed else "")
              + "".join(f"; {r.id} {r.status}" for r in v.results if r.undecided)
              + "".join(f"; {r.id} {r.status}" for r in v.results if r.reason))
    print(f"\nreports: {out}/<variant>/report.md, {out}/check.json")
    if args.fail_on_violation and not all(v.passed for v in verdicts.values()):
        undecided = [n for n, v in verdicts.items() if v.outcome == "undecided"]
        if undecided:  # not a pass: more rows are needed to call it one
            print(f"--fail-on-violation: {', '.join(undecided)} undecided (the point value meets "
                  "the bound, its interval does not: judge more rows), which is not a pass",
                  file=sys.stderr)
        return EXIT_VIOLATION
    return EXIT_OK


def configure_check(sub):
    """Add the ``check`` subcommand to an argparse subparsers object; returns its parser."""
    p = sub.add_parser(
        "check", help="recompute every verdict and report of a run from its saved outputs",
        description=(
            "Judge each variant of a finished (or partial) sweep against a contract using only "
            "the saved outputs (no model is loaded): ε both ways (max and split-conformal), the "
            "2ε certificate and the bounds it implies, calibration with bootstrap CIs, drift, "
            "flips by stratum, and the worst examples of each failing clause. Writes "
            "<variant>/metrics.json, verdict.json, report.md, report.json, and the run's "
            "summary.csv, report.md and check.json. Without --output-dir it holds the run "
            "folder's lock, so it refuses (exit 2) while a sweep writes that run. Exit 0 = done "
            "(all pass, or failures without --fail-on-violation), 1 = a clause failed with "
            "--fail-on-violation (an undecided clause, whose point value meets the bound but its "
            "interval does not, is not a pass either), or an output could not be written, 2 = usage error or the "
            "run folder in use."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", metavar="RESULTS_DIR", type=folder, help="run folder, e.g. results/minilm-sentiment-quant-g64")
    p.add_argument("--contract", default=None,
                   help="contract TOML file, or default | strict | lenient (default: the packaged default)")
    p.add_argument("--variant", nargs="+", default=None, metavar="NAME",
                   help="check only these variants (the run's summary.csv and report.md are then left alone)")
    p.add_argument("--output-dir", default=None,
                   help="write reports here instead of into RESULTS_DIR")
    p.add_argument("--near-tie-margin", type=number(float, low=0, high=MAX_NEAR_TIE_MARGIN,
                                                    example=1.0), default=None,
                   help="reference top-2 margin below which an example is a near tie "
                        "(default: the contract's [settings], else run.json)")
    p.add_argument("--alpha", type=number(float, low=0, high=1, low_open=True, high_open=True,
                                          example=0.05), default=None,
                   help="miscoverage of the split-conformal ε (default: the contract's, 0.05)")
    p.add_argument("--n-bootstrap", type=number(int, low=0, high=MAX_BOOTSTRAP, example=1000),
                   default=None, help="bootstrap resamples per CI, 0 = none, at most "
                                      f"{MAX_BOOTSTRAP:,} (default: the contract's, 1000)")
    p.add_argument("--seed", type=number(int, low=0, example=0), default=None,
                   help="bootstrap seed (default: the contract's, 0)")
    p.add_argument("--worst", type=number(int, low=0, example=5), default=5,
                   help="worst examples listed per failing clause")
    p.add_argument("--fail-on-violation", action="store_true",
                   help="exit 1 when any clause of any variant fails or is undecided")
    p.set_defaults(func=_check_command)
    return p


def _selftest_command(args):
    from contracts.checker import load_contract
    from runs.selftest import run_selftest

    contract = load_contract(args.contract)
    table = run_selftest(args.run_dir, contract=contract, seed=args.seed)
    print(table.to_markdown(index=False))
    ok = bool(table["caught"].all())
    print("\nselftest: " + ("every planted fault was caught by its clause and the clean copy "
                            "passed every clause" if ok else "FAILED (see the table)"))
    return EXIT_OK if ok else EXIT_VIOLATION


def configure_selftest(sub):
    """Add the ``selftest`` subcommand (planted-fault suite); returns its parser."""
    from runs.selftest import FAULTS

    p = sub.add_parser(
        "selftest", help="plant known faults in reference outputs; show each is caught",
        description=(
            "Perturb saved reference outputs in known ways (" + "; ".join(
                f"{k}: {f.description}" for k, f in FAULTS.items()) + ") and check each "
            "perturbed copy against the contract: the clause meant to catch the fault must fail, "
            "and the unperturbed copy must pass every clause. Exit 0 = all caught, 1 = not, "
            "2 = usage error."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", metavar="RESULTS_DIR", nargs="?", default=None, type=folder,
                   help="run folder whose reference/ outputs are perturbed (default: synthetic "
                        "outputs with 2-5 options and temperatures down to 0.1)")
    p.add_argument("--contract", default=None,
                   help="contract TOML file, or default | strict | lenient")
    p.add_argument("--seed", type=number(int, low=0, example=0), default=0,
                   help="seed of the perturbations")
    p.set_defaults(func=_selftest_command)
    return p


def build_parser():
    """A stand-alone parser with ``check`` and ``selftest`` (as ``variants`` has them)."""
    parser = Parser(prog="variants")
    sub = parser.add_subparsers(dest="command", required=True)
    configure_check(sub)
    configure_selftest(sub)
    return parser


def main(argv=None):
    """Run ``check`` or ``selftest`` from ``argv``; returns the exit code (2 on usage errors)."""
    from contracts.checker import ContractError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, ContractError) as e:
        print(f"variants: error: {printable(e)}", file=sys.stderr)
        return EXIT_USER_ERROR

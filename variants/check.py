"""``variants check`` and ``variants selftest``: judge saved outputs against a contract, no model.

``check`` recomputes every variant's metrics, verdict and reports from a run folder's saved
outputs (``reference/`` and each ``<variant>/`` holding ``outputs.npz`` and
``calibration_outputs.npz``) in seconds; :func:`judge_variant` is the same code the sweep runs, so
both write identical files. ``selftest`` plants known faults in reference outputs and shows that
the clause meant to catch each one fails while the unperturbed copy passes everything
(:mod:`variants.selftest`). Neither imports ``mlx``.
"""

import argparse
import math
import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from metrics._checks import short_list, short_path, short_repr
from variants.runfiles import (OUTPUT_FIELDS, CorruptFileError, check_same_ids, read_build,
                               read_outputs, read_run_json, read_timing)

from contracts.exit_codes import EXIT_OK, EXIT_USER_ERROR, EXIT_VIOLATION  # noqa: F401
from metrics.defaults import NEAR_TIE_MARGIN as DEFAULT_NEAR_TIE_MARGIN


class CheckError(ValueError):
    """A run folder or a variant cannot be checked; the message names the fix."""


# -- loading ----------------------------------------------------------------------------------
def load_outputs(path):
    """Saved outputs (.npz) as a dict of arrays (fields of ``DecisionOutputs`` that are present).

    Raises
    ------
    CheckError
        If the file is missing.
    variants.runfiles.CorruptFileError
        If it is not an npz of outputs (:func:`variants.runfiles.read_outputs`).
    """
    path = Path(path)
    if not path.exists():
        raise CheckError(f"{path} not found; run `variants sweep` first or pass the run folder.")
    out = read_outputs(path)
    return {k: out[k] for k in OUTPUT_FIELDS}


def list_variants(run_dir):
    """Names of the variant folders of a run (those holding both outputs files), sorted."""
    run_dir = Path(run_dir)
    names = []
    for p in sorted(run_dir.iterdir()):
        if not p.is_dir() or p.name in ("reference", "plots") or p.name.startswith("."):
            continue
        have = [(p / f).exists() for f in ("outputs.npz", "calibration_outputs.npz")]
        if all(have):
            names.append(p.name)
        elif any(have) or (p / "build.json").exists() or (p / "verdict.json").exists():
            raise CheckError(f"variant folder {p} is incomplete (outputs.npz or "
                             "calibration_outputs.npz missing); rerun the sweep to rebuild it, or "
                             "delete the folder")
    return names


def _non_negative(value, flag):
    if value < 0:
        raise CheckError(f"{flag} must be >= 0, got {value}")
    return value


def read_run(run_dir):
    """run.json as a dict ({} when absent, e.g. a hand-made folder); CorruptFileError when it is
    not a valid run file (:func:`variants.runfiles.read_run_json`)."""
    path = Path(run_dir) / "run.json"
    if not path.exists():
        return {}
    return read_run_json(path)


def variant_files(run_dir, name):
    """Read and validate what judging variant ``name`` reads (outputs of the reference and of the
    variant, build.json and timing.json where present), before anything is written.

    Raises CheckError (a file missing) or CorruptFileError (a file unreadable or wrong-shaped).
    """
    run_dir = Path(run_dir)
    for f in ("calibration_outputs.npz", "outputs.npz"):
        ref = load_outputs(run_dir / "reference" / f)
        check_same_ids(run_dir / name / f, load_outputs(run_dir / name / f)["ids"], ref["ids"])
    for f, read in (("build.json", read_build), ("timing.json", read_timing)):
        if (run_dir / name / f).exists():
            d = read(run_dir / name / f)
            if f == "build.json" and (run_dir / name / "timing.json").exists():
                require_family(run_dir / name / f, d)


def require_family(path, build):
    """Raise CorruptFileError unless ``build`` (build.json at ``path``, as read) names its family:
    summary.csv's family column comes from it, and a row without one is corrupt."""
    if not (isinstance(build.get("family"), str) and build["family"].strip()):
        raise CorruptFileError(path, "build file", f"family is {short_repr(build.get('family'))}, "
                               "expected the family's name, e.g. 'quant'")


@lru_cache(maxsize=2)
def _vader_texts():
    from variants.data import load_vader

    frame = load_vader()
    return dict(zip(frame["id"].astype(str), frame["text"].astype(str)))


def example_texts(ids):
    """Text of each example id from the bundled VADER data (ids it lacks are left out).

    Ids of multiple-choice questions may carry a suffix after the VADER id (``tweet:2#domain``);
    the longest VADER id prefix is used. Returns {} if the data cannot be read.
    """
    try:
        texts = _vader_texts()
    except (OSError, ValueError):
        return {}
    out = {}
    for i in map(str, ids):
        if i in texts:
            out[i] = texts[i]
            continue
        for sep in ("#", "|", "/"):
            head = i.split(sep)[0]
            if head in texts:
                out[i] = texts[head]
                break
    return out


def _json_safe(summary):
    """NaN → None (null), so metrics.json is strict JSON and two writes compare equal."""
    def clean(v):
        if isinstance(v, float) and v != v:
            return None
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    return {k: clean(v) for k, v in summary.items()}


# -- judging ----------------------------------------------------------------------------------
def resolve_settings(contract, meta=None, *, near_tie_margin=None, alpha=None, n_bootstrap=None,
                     seed=None):
    """Settings in force: explicit arguments, else the contract's ``[settings]``, else run.json
    (``near_tie_margin``), else the defaults."""
    st = dict(contract.settings)
    if near_tie_margin is not None:
        st["near_tie_margin"] = float(near_tie_margin)
    elif st.get("near_tie_margin") is None:
        st["near_tie_margin"] = float((meta or {}).get("config", {}).get(
            "near_tie_margin", DEFAULT_NEAR_TIE_MARGIN))
    for key, value in (("alpha", alpha), ("n_bootstrap", n_bootstrap), ("seed", seed)):
        if value is not None:
            st[key] = value
    ci_clauses = [c.id for c in contract.clauses if c.compare == "ci"]
    if ci_clauses and not st["n_bootstrap"]:
        raise CheckError(f"clauses {short_list(ci_clauses)} compare a bootstrap CI with their bound, "
                         "so n_bootstrap must be > 0; drop --n-bootstrap 0 or those clauses' "
                         "compare = \"ci\"")
    return st


def check_calibration_size(n_calibration, alpha):
    """Raise CheckError when ``n_calibration`` examples cannot give a finite split-conformal ε."""
    need = math.ceil(1.0 / alpha) - 1
    if n_calibration < need:
        raise CheckError(
            f"alpha={alpha} needs at least {need} calibration examples for the split-conformal ε, "
            f"got {n_calibration}: raise --n-calibration or alpha (contract [settings] or --alpha)")


def check_strata(contract, ref_eval):
    """A task:/options: stratum naming something absent from the outputs is a contract error."""
    tasks = set(np.asarray(ref_eval["task"]).astype(str).tolist())
    counts = set(np.asarray(ref_eval["option_mask"]).sum(axis=1).astype(int).tolist())
    for c in contract.clauses:
        if c.stratum.startswith("task:") and c.stratum[5:] not in tasks:
            raise CheckError(f"clause {short_repr(c.id)}: stratum {short_repr(c.stratum)} "
                             f"matches no example; the outputs have tasks: "
                             f"{', '.join(sorted(tasks))}")
        if c.stratum.startswith("options:") and int(c.stratum[8:]) not in counts:
            raise CheckError(f"clause {short_repr(c.id)}: stratum {short_repr(c.stratum)} "
                             f"matches no example; the outputs have option counts: "
                             f"{', '.join(map(str, sorted(counts)))}")


def judge_outputs(ref_cal, ref_eval, var_cal, var_eval, contract, *, settings=None):
    """Metrics and verdict of one variant from its and the reference's outputs (pure, no files).

    Parameters
    ----------
    ref_cal, ref_eval, var_cal, var_eval : mapping of arrays
        ``DecisionOutputs`` fields on the calibration and eval splits.
    contract : contracts.checker.Contract
    settings : dict, optional
        As :func:`resolve_settings`; default the contract's (near-tie margin 1.0 if unset).

    Returns
    -------
    ev : metrics.evaluate.Evaluation
    verdict : contracts.checker.Verdict
    epsilons : dict
        :func:`metrics.conformal.epsilon_by_bucket` on the calibration split, plus ``alpha``.
    """
    from contracts.checker import check
    from metrics.conformal import epsilon_by_bucket
    from metrics.evaluate import evaluate
    from metrics.margin import epsilon_max, max_abs_logit_diff

    st = resolve_settings(contract) if settings is None else settings
    cal_diff = max_abs_logit_diff(ref_cal["logits"], var_cal["logits"], ref_cal["option_mask"])
    check_calibration_size(len(cal_diff), st["alpha"])
    check_strata(contract, ref_eval)
    eps = epsilon_max(cal_diff)
    epsilons = epsilon_by_bucket(cal_diff, ref_cal["option_mask"].sum(axis=1), alpha=st["alpha"])
    epsilons["alpha"] = st["alpha"]
    ev = evaluate(ref_eval, var_eval, epsilon=eps, near_tie_margin=st["near_tie_margin"],
                  n_bins=st["n_bins"], epsilon_conformal=epsilons["all"]["epsilon_conformal"],
                  alpha=st["alpha"], human_tie_gap=st["human_tie_gap"])
    verdict = check(contract, ev, n_bootstrap=st["n_bootstrap"], confidence=st["confidence"],
                    seed=st["seed"])
    verdict = replace(verdict, settings={**verdict.settings, **st})  # record what was in force
    return ev, verdict, epsilons


def judge_variant(run_dir, name, contract, *, near_tie_margin=None, alpha=None, n_bootstrap=None,
                  seed=None, output_dir=None, texts=None, worst_n=5, write=True):
    """Recompute metrics, verdict and reports of variant ``name`` of a run from saved outputs.

    This is the sweep's judging step (``Sweep.judge`` calls it), so ``variants sweep`` and
    ``variants check`` write identical files.

    Parameters
    ----------
    run_dir : path-like
        ``results/<run>`` with ``reference/`` and ``<name>/`` (outputs.npz,
        calibration_outputs.npz; build.json and timing.json are used when present).
    name : str
        Variant folder name.
    contract : contracts.checker.Contract
    near_tie_margin, alpha, n_bootstrap, seed : optional
        Override the contract's ``[settings]`` (near_tie_margin falls back to run.json).
    output_dir : path-like, optional
        Where ``<name>/metrics.json``, ``verdict.json``, ``report.md`` and ``report.json`` go;
        default ``run_dir`` (in place).
    texts : mapping of id -> str, optional
        Example texts for the worst-examples listing; default looked up in the VADER data.
    worst_n : int, default=5
    write : bool, default=True

    Returns
    -------
    row : dict or None
        :func:`contracts.report.summary_row` (None when build.json or timing.json is missing).
    ev : metrics.evaluate.Evaluation
    verdict : contracts.checker.Verdict

    Raises
    ------
    CheckError
        If an outputs file is missing or unreadable.
    ValueError
        If reference and variant outputs do not describe the same examples.
    """
    from contracts.report import render_variant_report, summary_row, variant_report_json
    from variants.io import write_json, write_text

    run_dir = Path(run_dir)
    out_dir = Path(output_dir) if output_dir is not None else run_dir
    vdir = run_dir / name
    ref_cal = load_outputs(run_dir / "reference" / "calibration_outputs.npz")
    ref_eval = load_outputs(run_dir / "reference" / "outputs.npz")
    var_cal = load_outputs(vdir / "calibration_outputs.npz")
    var_eval = load_outputs(vdir / "outputs.npz")
    meta = read_run(run_dir)
    st = resolve_settings(contract, meta, near_tie_margin=near_tie_margin, alpha=alpha,
                          n_bootstrap=n_bootstrap, seed=seed)
    try:
        ev, verdict, epsilons = judge_outputs(ref_cal, ref_eval, var_cal, var_eval, contract,
                                              settings=st)
    except ValueError as e:
        raise CheckError(f"{vdir}: {e}") from None
    row = None
    if (vdir / "build.json").exists() and (vdir / "timing.json").exists():
        build = read_build(vdir / "build.json")
        timing = read_timing(vdir / "timing.json")
        row = summary_row(name, build, ev.summary, verdict, timing)
    if write:
        if texts is None:
            texts = example_texts(ev.per_example["id"])
        odir = out_dir / name
        write_json(odir / "metrics.json", _json_safe(ev.summary))
        write_json(odir / "verdict.json", verdict.to_dict())
        write_text(odir / "report.md", render_variant_report(name, ev, verdict, contract, epsilons,
                                                             texts=texts, worst_n=worst_n))
        write_json(odir / "report.json", variant_report_json(name, ev, verdict, contract, epsilons,
                                                             texts=texts, worst_n=worst_n))
    return row, ev, verdict


def family_extras(run_dir, family_name, names, family=None):
    """{variant: markdown} written by the family's ``describe(build, timing)`` for the run's
    report.md (the per-variant blocks of the exit, prune and lowrank families); variants without
    build.json and timing.json, and families without ``describe``, give nothing.

    The sweep calls this for each variant it finishes (and saves the result in run.json,
    ``extras``); ``variants check`` reuses the saved blocks and calls this only for a run.json
    written before they were saved. Imports the family's builder (and so mlx) unless ``family``
    (the builder module) is given.
    """
    if family is None:
        import importlib.util

        from variants.builders import FAMILIES, get_family  # the package itself imports no mlx

        if family_name not in FAMILIES:
            return {}
        spec = importlib.util.find_spec(f"variants.builders.{FAMILIES[family_name]}")
        try:  # a family without describe() (quant) is not imported: check stays mlx-free
            if "\ndef describe(" not in Path(spec.origin).read_text():
                return {}
        except (AttributeError, TypeError, OSError):
            pass
        family = get_family(family_name)
    if not hasattr(family, "describe"):
        return {}
    run_dir = Path(run_dir)
    out = {}
    for name in names:
        vdir = run_dir / name
        if (vdir / "build.json").exists() and (vdir / "timing.json").exists():
            build = read_build(vdir / "build.json")
            try:
                out[name] = family.describe(build, read_timing(vdir / "timing.json"))
            except (KeyError, TypeError, IndexError) as e:  # a field the family wrote is absent
                raise CorruptFileError(vdir / "build.json", "build file",
                                       f"{family_name} field missing or of the wrong type: "
                                       f"{type(e).__name__} {e}") from None
    return out


#: Order of the plots in report.md, as ``variants.plots.plot_run`` writes them (stem prefixes).
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
    "Early exit on the eval split" table (:func:`variants.plots.exit_markdown`, read from the
    run's saved outputs) is added whenever the run has early-exit variants.
    """
    import shutil

    from variants.plots import exit_markdown, plots_markdown  # no mlx either

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    plots = sorted((run_dir / "plots").glob("*.png"), key=_plot_key)
    if plots and out_dir.resolve() != run_dir.resolve():
        (out_dir / "plots").mkdir(parents=True, exist_ok=True)
        copied = []
        for p in plots:
            shutil.copyfile(p, out_dir / "plots" / p.name)
            copied.append(out_dir / "plots" / p.name)
        plots = copied
    text = plots_markdown(plots, out_dir)
    if "====== Early exit on the eval split" not in text:
        table = exit_markdown(run_dir)
        if table:
            text += "\n" + table
    return text


def check_run(run_dir, *, contract=None, variants=None, output_dir=None, log=None, **kwargs):
    """``variants check``: judge every (or the named) variant of a run; rewrite the sweep files.

    Writes per variant what :func:`judge_variant` writes, and per run ``summary.csv`` and
    ``report.md`` (when every variant has build.json and timing.json and run.json exists) and
    ``check.json`` (verdict per variant, schema ``REPORT_SCHEMA_VERSION``).

    Returns
    -------
    verdicts : dict of str -> contracts.checker.Verdict
    """
    from contracts.checker import load_contract
    from contracts.report import REPORT_SCHEMA_VERSION, render_report
    from variants.io import write_csv, write_json, write_text

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckError(f"{short_path(run_dir)} is not a folder; pass a run folder such as "
                         "results/minilm-sentiment-quant-g64.")
    if not (run_dir / "reference" / "outputs.npz").exists():
        raise CheckError(f"{run_dir} has no reference/outputs.npz; pass a folder written by "
                         "`variants sweep`.")
    contract = load_contract(contract) if contract is None or isinstance(contract, (str, Path)) else contract
    names = list_variants(run_dir)
    if variants:
        unknown = sorted(set(variants) - set(names))
        if unknown:
            raise CheckError(f"no variant {short_list(unknown)} in {run_dir}; it has: "
                             f"{', '.join(names) or 'none'}.")
        names = [n for n in names if n in variants]
    if not names:
        raise CheckError(f"{run_dir} holds no variant with outputs.npz and calibration_outputs.npz.")
    out_dir = Path(output_dir) if output_dir is not None else run_dir
    read_run(run_dir)  # every file judged is read and validated before anything is written
    for name in names:
        variant_files(run_dir, name)
    rows, details, verdicts = [], {}, {}
    for name in names:
        row, ev, verdict = judge_variant(run_dir, name, contract, output_dir=out_dir, **kwargs)
        verdicts[name] = verdict
        details[name] = (ev, verdict)
        rows.append(row)
        if log:
            log(f"{name}: {'PASS' if verdict.passed else 'FAIL'}"
                + (f" ({', '.join(verdict.failed)})" if verdict.failed else ""))
    write_json(out_dir / "check.json", {
        "schema_version": REPORT_SCHEMA_VERSION, "run": str(run_dir), "contract": contract.name,
        "passed": all(v.passed for v in verdicts.values()),
        "variants": {n: v.to_dict() for n, v in verdicts.items()}})
    meta = read_run(run_dir)
    if meta and all(r is not None for r in rows) and not variants:
        summary = pd.DataFrame(rows)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(out_dir / "summary.csv", summary)
        meta = dict(meta, contract=contract.name)
        family = meta.get("config", {}).get("family")
        if isinstance(meta.get("extras"), dict):  # the sweep's describe() blocks
            extras = {n: meta["extras"][n] for n in names if n in meta["extras"]}
        else:  # a run.json from before they were saved: the same code the sweep runs
            extras = family_extras(run_dir, family, names) if family else {}
        write_text(out_dir / "report.md", render_report(meta, summary, details, contract, extras)
                   + report_tail(run_dir, out_dir))
    return verdicts


# -- command line -----------------------------------------------------------------------------
def _check_command(args):
    from contextlib import nullcontext

    from variants import runlock

    # writing into the run folder: hold its lock (a running sweep refuses us, and we it)
    lock = (runlock.hold(args.run_dir, log=lambda m: print(m, file=sys.stderr),
                         fix="wait for it to finish, or pass --output-dir to write elsewhere")
            if args.output_dir is None and Path(args.run_dir).is_dir() else nullcontext())
    with lock:
        verdicts = check_run(args.run_dir, contract=args.contract, variants=args.variant,
                             output_dir=args.output_dir, near_tie_margin=args.near_tie_margin,
                             alpha=args.alpha, n_bootstrap=args.n_bootstrap, seed=args.seed,
                             worst_n=_non_negative(args.worst, "--worst"),
                             log=lambda m: print(m, file=sys.stderr))
    out = Path(args.output_dir or args.run_dir)
    width = max(map(len, verdicts))
    for name, v in verdicts.items():
        print(f"{name:<{width}}  {'PASS' if v.passed else 'FAIL'}  "
              f"{len(v.results) - len(v.failed) - len(v.untested)}/{len(v.results)} clauses pass"
              + (f"; failed: {', '.join(v.failed)}" if v.failed else "")
              + "".join(f"; {r.id} {r.status}" for r in v.results if r.reason))
    print(f"\nreports: {out}/<variant>/report.md, {out}/check.json")
    if args.fail_on_violation and not all(v.passed for v in verdicts.values()):
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
            "--fail-on-violation, or an output could not be written, 2 = usage error or the "
            "run folder in use."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", metavar="RESULTS_DIR", help="run folder, e.g. results/minilm-sentiment-quant-g64")
    p.add_argument("--contract", default=None,
                   help="contract TOML file, or default | strict | lenient (default: the packaged default)")
    p.add_argument("--variant", nargs="+", default=None, metavar="NAME",
                   help="check only these variants (the run's summary.csv and report.md are then left alone)")
    p.add_argument("--output-dir", default=None,
                   help="write reports here instead of into RESULTS_DIR")
    p.add_argument("--near-tie-margin", type=float, default=None,
                   help="reference top-2 margin below which an example is a near tie "
                        "(default: the contract's [settings], else run.json)")
    p.add_argument("--alpha", type=float, default=None,
                   help="miscoverage of the split-conformal ε (default: the contract's, 0.05)")
    p.add_argument("--n-bootstrap", type=int, default=None,
                   help="bootstrap resamples per CI, 0 = none (default: the contract's, 1000)")
    p.add_argument("--seed", type=int, default=None, help="bootstrap seed (default: the contract's, 0)")
    p.add_argument("--worst", type=int, default=5, help="worst examples listed per failing clause")
    p.add_argument("--fail-on-violation", action="store_true",
                   help="exit 1 when any clause of any variant fails")
    p.set_defaults(func=_check_command)
    return p


def _selftest_command(args):
    from contracts.checker import load_contract
    from variants.selftest import run_selftest

    contract = load_contract(args.contract)
    table = run_selftest(args.run_dir, contract=contract, seed=args.seed)
    print(table.to_markdown(index=False))
    ok = bool(table["caught"].all())
    print("\nselftest: " + ("every planted fault was caught by its clause and the clean copy "
                            "passed every clause" if ok else "FAILED (see the table)"))
    return EXIT_OK if ok else EXIT_VIOLATION


def configure_selftest(sub):
    """Add the ``selftest`` subcommand (planted-fault suite); returns its parser."""
    from variants.selftest import FAULTS

    p = sub.add_parser(
        "selftest", help="plant known faults in reference outputs; show each is caught",
        description=(
            "Perturb saved reference outputs in known ways (" + "; ".join(
                f"{k}: {f.description}" for k, f in FAULTS.items()) + ") and check each "
            "perturbed copy against the contract: the clause meant to catch the fault must fail, "
            "and the unperturbed copy must pass every clause. Exit 0 = all caught, 1 = not, "
            "2 = usage error."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", metavar="RESULTS_DIR", nargs="?", default=None,
                   help="run folder whose reference/ outputs are perturbed (default: synthetic "
                        "outputs with 2-5 options and temperatures down to 0.1)")
    p.add_argument("--contract", default=None,
                   help="contract TOML file, or default | strict | lenient")
    p.add_argument("--seed", type=int, default=0, help="seed of the perturbations")
    p.set_defaults(func=_selftest_command)
    return p


def build_parser():
    """A stand-alone parser with ``check`` and ``selftest`` (as ``variants`` will have them)."""
    parser = argparse.ArgumentParser(prog="variants")
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
        print(f"variants: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())

"""``variants compare A B``: its argparse subcommand, handler and Markdown (no MLX).

The statistics are :mod:`runs.compare`'s; the HTML page is ``runs/html/templates/
compare.html.j2`` (self-contained, as report.html).
"""

import json
import math
import os
import sys

from metrics._checks import printable
import tempfile
from pathlib import Path

from runs.commands import EXIT_OK, EXIT_USER_ERROR, EXIT_VIOLATION


def _p(p):
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}"


def _ci(ci, f="{:+.4g}"):
    return "—" if ci[0] is None or ci[1] is None else f"[{f.format(ci[0])}, {f.format(ci[1])}]"


def markdown(results):
    """The comparison of every pair as Markdown (str)."""
    lines = []
    for r in results:
        a, b = r["a"], r["b"]
        lines += [f"## {b['variant']} (B, {b['run']}) vs {a['variant']} (A, {a['run']})", "",
                  f"{r['n_rows']} eval rows, the same ids in both ({r['n_labelled']} labelled"
                  + (f"; {r['n_nonfinite_dropped']} rows left out: NaN or inf outputs on one side "
                     "or both" if r.get("n_nonfinite_dropped") else "") + "); "
                  f"contract {r['contract']['name']} ({r['contract']['digest']}); "
                  f"verdicts A {r['verdicts']['a'].upper()}, B {r['verdicts']['b'].upper()}; "
                  + ("one reference" if r["same_reference"] else
                     "each side against its own run's reference"), ""]
        lines += head_lines(r)
        for key, what in (("mcnemar_correct", "right (labelled rows)"),
                          ("mcnemar_flips", "flipped against the reference"),
                          ("mcnemar_label_set", "label set changed against the reference "
                                                "(sigmoid >= 0.5 per label)")):
            m = r.get(key)
            if m is None:
                if key == "mcnemar_correct" and r.get("outputs", "softmax") == "softmax":
                    lines.append(f"- exact McNemar, {what}: not computed, no labelled row")
                continue
            lines.append(f"- exact McNemar, {what}: A only {m['a_only']}, B only "
                         f"{m['b_only']}, both {m['both']}, neither {m['neither']}; "
                         f"p = {_p(m['p_value'])}"
                         + (" (significant at 0.05)" if m["p_value"] < 0.05 else
                            " (no significant difference)"))
        if r.get("mcnemar_note"):
            lines.append(f"- {r['mcnemar_note']}")
        for s in r["speed"]:
            lines.append(f"- speed at B={s['batch_size']}: p50 {s['a_p50_ms']:.1f} ms (A) vs "
                         f"{s['b_p50_ms']:.1f} ms (B), A/B = {s['p50_ratio_a_over_b']:.2f}× "
                         f"{_ci(s['ci'], '{:.2f}')} (> 1: B faster; timed at different times); "
                         f"speed-ups against the reference timed alongside each (robust to "
                         f"load) {s['a_speedup']:.2f}× (A), {s['b_speedup']:.2f}× (B), B/A "
                         f"{s['speedup_ratio_b_over_a']:.2f}×")
        bs = r["bootstrap"]
        lines += ["", f"B − A per clause ({bs['method']}, {bs['n_boot']} resamples, "
                      f"{bs['confidence']:.0%} CI, seed {bs['seed']}):", "",
                  "| clause | metric · stratum · statistic | A | B | B − A | CI | better |",
                  "|---|---|---|---|---|---|---|"]
        for c in r["clauses"]:
            d, (lo, hi) = c["difference"], c["ci"]
            better = "—"
            if lo is not None and hi is not None and (lo > 0 or hi < 0):
                better = "B" if (lo > 0) == c["higher_is_better"] else "A"
            lines.append(f"| {c['clause']} | {c['metric']} · {c['stratum']} · {c['statistic']} "
                         f"| {_f(c['a'])} | {_f(c['b'])} | {_f(d, '{:+.4g}')} "
                         f"| {_ci(c['ci'])} | {better} |")
        allowed = f"margin {r['margin']:g}" + (
            f" or {r['relative_margin']:g} × |threshold|" if r["relative_margin"] else "")
        lines += ["", (f"B is worse than A beyond the {allowed} on: " + ", ".join(r["worse"]))
                  if r["worse"] else f"B is not worse than A beyond the {allowed} on any "
                  "clause (judged on the paired CI).", ""]
    return "\n".join(lines)


def head_lines(r):
    """The side-by-side figures of a multi-label or regression pair (``r["head_figures"]``,
    :func:`metrics.head_summary.head_summary` of each side) as a Markdown table, with the
    sentence saying the softmax figures do not apply; [] for a softmax pair."""
    from metrics.head_view import not_applicable

    figures = r.get("head_figures")
    if not figures:
        return []
    lines = [r.get("head_note") or not_applicable(r["outputs"]), "",
             "| figure | A | B | B − A |", "|---|---|---|---|"]
    for k, va in figures["a"].items():
        vb = figures["b"].get(k)
        d = None if va is None or vb is None else vb - va
        lines.append(f"| {k} | {_f(va)} | {_f(vb)} | {_f(d, '{:+.4g}')} |")
    return lines + [""]


def _f(x, f="{:.4g}"):
    return "—" if x is None else f.format(x)


def html(results):
    """The comparison as one self-contained HTML page (str), the results embedded as JSON."""
    from markupsafe import Markup

    from runs.html.render import TEMPLATES, _env, embedded_json

    css = (TEMPLATES / "report.css").read_text(encoding="utf-8")
    return _env().get_template("compare.html.j2").render(
        results=results, css=Markup(css), data_json=Markup(embedded_json(results)))


def unwritable(target):
    """Why the output file ``target`` (str) cannot be written, or None: an empty name, a
    folder, or a folder that cannot be made or written in (tried with a temp file there, so
    /proc and read-only file systems are caught). Leaves nothing behind."""
    if not target.strip():
        return "is empty; pass a file name"
    path = Path(target)
    if path.is_dir():
        return f"{target} is a folder; pass a file name"
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():  # mkdir would say "File exists"
        return f"{target}: {above} is a file, not a folder; pass a writable place"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return (f"{target}: cannot write there ({e.strerror or type(e).__name__}); pass a "
                "writable place")
    return None


def _compare_command(args):
    from runs.compare import CompareError, compare_pair, pairs
    from runs.io import write_text

    for flag, v in (("--margin", args.margin), ("--relative-margin", args.relative_margin)):
        if not math.isfinite(v) or v < 0:
            print(f"variants: error: {flag} must be a finite number >= 0, got {v}",
                  file=sys.stderr)
            return EXIT_USER_ERROR
    for flag, target in (("--markdown", args.markdown), ("--json", args.json),
                         ("--html", args.html)):
        problem = None if target is None else unwritable(target)
        if problem:  # refused before the comparison runs: nothing printed or half-written
            print(f"variants: error: {flag} {problem}", file=sys.stderr)
            return EXIT_USER_ERROR
    try:
        results = [compare_pair(a, b, n_boot=args.n_bootstrap, seed=args.seed,
                                margin=args.margin, relative_margin=args.relative_margin)
                   for a, b in pairs(args.a, args.b, log=lambda m: print(
                       f"variants compare: note: {m}", file=sys.stderr))]
    except CompareError as e:
        print(f"variants: error: compare refused: {printable(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    text = markdown(results)
    print(text)
    if args.markdown:
        write_text(Path(args.markdown), text)
    if args.json:
        write_text(Path(args.json), json.dumps(results, indent=1, allow_nan=False) + "\n")
    if args.html:
        write_text(Path(args.html), html(results))
    if args.fail_if_worse and any(r["worse"] for r in results):
        return EXIT_VIOLATION
    return EXIT_OK


def configure(sub):
    """Add the ``compare`` subcommand to an argparse subparsers object; returns its parser."""
    import argparse

    from runs.commands.args import folder, number

    p = sub.add_parser(
        "compare", help="paired statistics of two variants (two runs, or two of one run)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Compare variant B against variant A on the same eval rows: exact McNemar tests "
            "(scipy.stats.binomtest on the discordant pairs) on which rows each gets right and "
            "on which rows each flips against its reference, a paired bootstrap CI of B − A for "
            "every clause of the contract, and the speed ratio from each run's timing.json. "
            "Multi-label and regression runs show the head's own figures side by side instead "
            "(multi-label: McNemar on the rows whose label set changed; regression: none). "
            "A and B are RUN:VARIANT (a sweep folder and a variant in it) or RUN (every variant "
            "the two runs share by name; two runs of one variant each are compared with each "
            "other even when the names differ, and RUN:VARIANT against a run of one variant "
            "takes that one: a line on stderr says so when the two names differ). Two sides of different models, contracts or data, or "
            "whose eval rows differ, are refused in one line (exit 2). Prints Markdown; "
            "--markdown/--json/--html also write it. Exit 1 with --fail-if-worse when B is "
            "worse than A beyond --margin (or --relative-margin × |threshold|) on any clause "
            "(the whole paired CI past it)."))
    p.add_argument("a", metavar="A", type=folder, help="RUN or RUN:VARIANT, the baseline")
    p.add_argument("b", metavar="B", type=folder, help="RUN or RUN:VARIANT, the candidate")
    p.add_argument("--fail-if-worse", action="store_true",
                   help="exit 1 when B is worse than A beyond --margin on any clause metric "
                        "(a regression gate for CI)")
    p.add_argument("--margin", type=float, default=0.0,
                   help="how much worse B may be, in each clause metric's own units, before "
                        "--fail-if-worse fails")
    p.add_argument("--relative-margin", type=float, default=0.0,
                   help="how much worse B may be as a fraction of each clause's |threshold| "
                        "(the larger of the two margins applies)")
    p.add_argument("--n-bootstrap", type=number(int, low=1, high=100_000, example=1000),
                   default=1000, help="paired bootstrap resamples")
    p.add_argument("--seed", type=number(int, low=0, example=0), default=0,
                   help="seed of the bootstrap resamples")
    p.add_argument("--markdown", metavar="FILE", help="also write the Markdown here")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    p.add_argument("--html", metavar="FILE",
                   help="also write a self-contained HTML page here")
    p.set_defaults(func=_compare_command)
    return p

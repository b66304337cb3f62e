"""``variants judge RUN --outputs FILE``: judge logits made by any runtime against a sweep's
reference, as one more variant of the run (no MLX; :mod:`runs.judge_file`)."""

import argparse
import sys
import textwrap

from runs.commands import EXIT_OK, EXIT_VIOLATION
from runs.commands.args import folder

#: --help text: paragraphs wrapped to 88 columns, the format list kept as laid out
DESCRIPTION = "\n\n".join(textwrap.fill(p, 88) if not p.startswith("Formats") else p for p in (
    "Judge decision logits produced anywhere (a serving endpoint, Core ML, ONNX Runtime, a "
    "batch job) against RUN's reference with the same contract, as one more variant of RUN: "
    "RUN/<name>/ (family 'outputs') gets the files a sweep variant has, and RUN's summary.csv, "
    "report.md, report.html and check.json are rewritten (as `variants check` does), so "
    "`variants compare RUN:q8-g64 RUN:<name>` works.",
    "FILE answers every row of RUN's calibration and eval splits once (ids as in "
    "RUN/reference/*.npz); missing, extra or duplicated ids, or a row whose logit count is "
    "neither its options nor RUN's width K, are refused in one line (exit 2) before anything "
    "is written. The eval rows are judged; the calibration rows give ε, the logit drift the "
    "margin certificate rests on (a file of eval rows alone is refused: ε from the judged rows "
    "would certify in-sample). Temperatures, option masks, scores and the option -> action map "
    "are RUN's reference's, as for every variant of a sweep. Logits are raw (before "
    "temperature), in the reference's option order, stored as float32; a row with NaN or inf "
    "among its options fails the finite-outputs clause (as in a sweep), it is not refused.",
    "Formats, by suffix:\n"
    "  .jsonl    one object per line:\n"
    "            {\"id\": \"tweet:1\", \"logits\": [-0.4, 0.1, 1.3], \"latency_ms\": 3.2}\n"
    "  .parquet  columns id, and logits (a list per row) or logit_0 .. logit_{K-1}\n"
    "            (null = padding past a row's options); optional latency_ms\n"
    "  .npz      arrays ids (N,), logits (N, K), optional latency_ms (N,) (NaN = not timed)",
    "Speed: none is measured here. latency_ms (per row, as the runtime timed it) is summarised "
    "(p50, p95, mean) in RUN/<name>/timing.json, summary.csv and report.md, marked 'measured "
    "elsewhere'; the speed-up columns stay empty (no strict alternation with the reference).",
    "Rerunning with the same file rewrites the same files; another file under the same name is "
    "refused without --force; a sweep variant's name is always refused. Holds RUN's lock (a "
    "running sweep or check refuses it, exit 2). Exit 0 = judged (whatever the verdict), 1 = "
    "the file's variant fails or is undecided with --fail-on-violation, or an output could not "
    "be written, 2 = bad input."))



def _judge_command(args):
    from runs.judge_file import judge_file

    name, verdicts = judge_file(args.run_dir, args.outputs, name=args.name,
                                contract=args.contract, force=args.force,
                                log=lambda m: print(m, file=sys.stderr))
    v = verdicts[name]
    n = len(v.results)
    print(f"{name}  {v.word}  {n - len(v.failed) - len(v.undecided) - len(v.untested)}/{n} "
          "clauses pass" + (f"; failed: {', '.join(v.failed)}" if v.failed else "")
          + "".join(f"; {r.id} {r.status}" for r in v.results if r.undecided))
    print(f"\nreports: {args.run_dir}/{name}/report.md, {args.run_dir}/report.md; compare: "
          f"variants compare {args.run_dir}:<variant> {args.run_dir}:{name}")
    if args.fail_on_violation and not v.passed:
        return EXIT_VIOLATION
    return EXIT_OK


def configure(sub):
    """Add the ``judge`` subcommand to an argparse subparsers object; returns its parser."""
    p = sub.add_parser(
        "judge", help="judge logits made by any runtime against a sweep's reference",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=DESCRIPTION)
    p.add_argument("run_dir", metavar="RUN", type=folder,
                   help="run folder written by `variants sweep`, e.g. results/minilm-sentiment-quant-g64")
    p.add_argument("--outputs", metavar="FILE", required=True,
                   help="logits file: .jsonl, .parquet or .npz (formats above)")
    p.add_argument("--name", default=None,
                   help="variant folder name (default: outputs-<FILE's stem>)")
    p.add_argument("--contract", default=None,
                   help="contract TOML file, or default | strict | lenient (default: the "
                        "contract RUN was judged with, run.json's; every variant of RUN is "
                        "judged again with it)")
    p.add_argument("--force", action="store_true",
                   help="replace the outputs of another file judged under the same --name")
    p.add_argument("--fail-on-violation", action="store_true",
                   help="exit 1 when the file's variant fails a clause or is undecided")
    p.set_defaults(func=_judge_command)
    return p

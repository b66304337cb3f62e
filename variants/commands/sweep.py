"""``variants sweep``: its parser (every family's flags) and the command."""

import sys

from metrics._checks import printable
import textwrap

from variants.commands import EXIT_FAILURE, EXIT_OK, EXIT_USER_ERROR, HelpFormatter


def configure(sub):
    """Add the ``sweep`` subcommand (with every family's flag group) to ``sub``; returns it."""
    from variants.families import FAMILIES, get_family
    from variants.families.quant.family import MODES
    from variants.models import MODELS
    from variants.datasets.own import SCHEMA_HELP
    from variants.sweep.config import SweepConfig

    d = SweepConfig()
    p = sub.add_parser(
        "sweep", help="build variants of a real decision model, judge each against a contract",
        description=textwrap.fill(
            "Compute the reference model's outputs once (cached), then for each variant build it, "
            "run it on the calibration and eval splits of the bundled VADER data (or of your own "
            "--data FILE, schema below), compute the "
            "contract metrics, check the contract and time it against the reference (strict "
            "alternation, batch sizes 1 and 32, two timed regions: forward = prepared token ids "
            "-> logits, and end to end = texts -> tokenisation -> forward -> decision outputs), "
            "and measure cold starts in a fresh process. Writes results/<run>/ (run.json, "
            "per-variant outputs/metrics/verdict/timing, summary.csv, report.md) and prints "
            "where the sweep's own wall time went. Rerunning resumes (and times what an older "
            "run lacks). One sweep at a time per run folder: a second one on the same run exits "
            "2 naming the holder (RESULTS_DIR/RUN/.lock). Exit status: 0 the sweep completed "
            "(whatever the verdicts: they are in summary.csv and report.md), 1 a variant fails "
            "its contract with --fail-on-violation, or an output could not be written (disk "
            "full, permissions, a plot or report.html that could not be rendered: run.json "
            "then says incomplete; rerun to finish), 2 bad input, "
            "the run folder in use, or a variant that could not be built.", width=92),
        epilog=SCHEMA_HELP, formatter_class=HelpFormatter)
    p.add_argument("--model", default=None, metavar="NAME|package.module:factory",
                   help=f"decision model: a bundled one ({' | '.join(MODELS)}; None = "
                        f"{d.DEFAULT_MODEL}) or your own factory, called with the Checkpoint and "
                        "returning a DecisionModel (see examples/own_model.py)")
    p.add_argument("--model-config", default=None, metavar="FILE",
                   help="a model TOML: checkpoint, logits kind (classifier | linear-head | cosine "
                        "| marker), prompt, options, scores, actions, temperatures (examples/"
                        "model-*.toml; the bundled models are variants/models/*.toml)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="a local Hugging Face-format folder (config.json, model.safetensors, "
                        "tokenizer.json); overrides the model TOML's (None = the TOML's, or the "
                        "bundled all-MiniLM-L6-v2)")
    p.add_argument("--data", default=None, metavar="FILE",
                   help="your own data (JSONL, CSV or Parquet; None = the bundled VADER data)")
    p.add_argument("--max-length", type=int, default=d.max_length, metavar="TOKENS",
                   help="tokens per text, special tokens included (longer texts are cut; at "
                        "most the checkpoint's position table); None = the model TOML's "
                        "max_length, else the tokenizer files'. Recorded in run.json with its "
                        "source, and in every cache key")
    p.add_argument("--family", choices=list(FAMILIES), default=d.family,
                   help="variant family; its own flags are listed in its group below")
    p.add_argument("--contract", default=None,
                   help="contract TOML file, or a packaged one by name: default | strict | "
                        "lenient (None = default)")
    p.add_argument("--run", default=None,
                   help="run name: results go to RESULTS_DIR/RUN (None = <model>-<family>-<params>,"
                        " e.g. minilm-sentiment-quant-g64)")
    p.add_argument("--results-dir", default=d.results_dir, help="where run folders are written")
    p.add_argument("--n-fit", type=int, default=d.n_fit, help="fit-split examples (head fitting)")
    p.add_argument("--n-calibration", type=int, default=d.n_calibration,
                   help="calibration-split examples (temperatures and ε)")
    p.add_argument("--n-eval", type=int, default=d.n_eval, help="eval-split examples (metrics)")
    p.add_argument("--quality-mode", choices=MODES, default=d.quality_mode,
                   help="how quality is evaluated: simulated = dequantized dense weights; a "
                        "variant judged in a mode other than --speed-mode has its timed build "
                        "checked equal on every eval row (max |Δlogit| <= 1e-4 x max(1, max |logit|)) "
                        "or is refused; "
                        "W8A8 Linears (--family w8a8, --int8-layers) are always judged in the "
                        "speed mode, the model that runs")
    p.add_argument("--speed-mode", choices=MODES, default=d.speed_mode,
                   help="what is timed: native = the packed quantized weights (on the CPU the "
                        "compiled dequant-cpp+gemm kernel and layer ops, else MLX's "
                        "quantized_matmul); simulated = dequantized dense weights")
    p.add_argument("--timing-rounds", type=int, default=d.timing_rounds,
                   help="alternated timing rounds wanted per batch size (docs/method.md: 50); "
                        "fewer run when --timing-budget-s runs out (timing.json records rounds "
                        "requested, run and why it stopped)")
    p.add_argument("--timing-warmup", type=int, default=d.timing_warmup,
                   help="untimed warm-up calls of each model per batch size (docs/method.md: 5; "
                        "when >= 1 at least one per text of the B=1 cycle, so every timed "
                        "shape is warmed; after those, warm-ups stop once they used a quarter "
                        "of the budget). 0 is allowed: the first timed calls are then cold, "
                        "labelled so in timing.json (ref_cold / var_cold), and their speed-ups "
                        "flagged in report.md")
    p.add_argument("--timing-budget-s", type=float, default=d.timing_budget_s,
                   help="wall-clock seconds per measurement (one batch size, warm-ups included) "
                        "after which no new round starts, once --timing-min-rounds ran")
    p.add_argument("--timing-min-rounds", type=int, default=d.timing_min_rounds,
                   help="rounds run even past the budget (None = 3, or --timing-rounds when "
                        "that is fewer; must not exceed --timing-rounds)")
    p.add_argument("--cold-start", choices=("none", "reference", "all"), default=d.cold_start,
                   help="cold starts measured in a fresh process (import, weight load, build, "
                        "first forward at the smallest timed batch size): none, the reference "
                        "only (run.json), or also every variant (timing.json; about 3 s each "
                        "for quant, more for families whose build reads calibration data)")
    p.add_argument("--timing-batch-sizes", type=int, nargs="+", default=list(d.timing_batch_sizes),
                   metavar="B", help="batch sizes timed (one real eval batch each)")
    p.add_argument("--near-tie-margin", type=float, default=d.near_tie_margin,
                   help="reference top-2 logit margin below which an example is a near tie")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="batch size for the quality runs")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the data subsample")
    p.add_argument("--device", default=None, metavar="cpu|gpu",
                   help="where MLX computes: cpu, or gpu (Metal on macOS; CUDA on Linux with "
                        "mlx[cuda13]); None = $VARIANTS_DEVICE, else cpu. Recorded in run.json "
                        "and every cache key; a run folder is resumed only on the same device")
    p.add_argument("--dtype", default=d.dtype, metavar="float32|float16|bfloat16",
                   help="parameter dtype; float16/bfloat16 only with --device gpu (MLX's CPU "
                        "backend has no BLAS path for them)")
    from variants.commands import executor_flags

    executor_flags.add(p, "the variants' quality passes (build, outputs on both splits)",
                       note=". With process or ray the speed columns still come from this "
                            "process: after every quality pass, the workers stopped, each "
                            "variant is built in the speed mode and timed here against the "
                            "reference (strict A/B alternation) and cold-started, one at a "
                            "time, as with local")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars (shown by default)")
    p.add_argument("--fail-on-violation", action="store_true",
                   help="exit 1 when any variant fails its contract or is undecided (for CI gates; without it a "
                        "completed sweep exits 0)")
    for name in FAMILIES:
        before = len(p._actions)
        get_family(name).add_arguments(p)
        for action in p._actions[before:]:
            _record_use(action, name)
    p.set_defaults(func=run)
    return p


#: the namespace attribute listing the family flags given on the command line
_GIVEN = "family_flags_given"


def _record_use(action, family):
    """Make ``action`` (a family's flag) note on the namespace, when given, its option string
    and ``family``: a flag given with another ``--family`` is refused, not dropped
    (:func:`check_family_flags`). argparse calls an action only for a flag on the command
    line, so a default never counts."""
    base = type(action)

    def __call__(self, parser, namespace, values, option_string=None):
        given = dict(getattr(namespace, _GIVEN, None) or {})
        given[option_string] = family
        setattr(namespace, _GIVEN, given)
        base.__call__(self, parser, namespace, values, option_string)

    action.__class__ = type(f"Family{base.__name__}", (base,), {"__call__": __call__})


#: flags a family reads only under one setting of another flag: flag -> (dest, value, flag)
_ONLY_WITH = {"--ratios": ("rank_rule", "params", "--rank-rule"),
              "--energies": ("rank_rule", "energy", "--rank-rule"),
              "--ranks": ("rank_rule", "rank", "--rank-rule")}


def check_family_flags(args):
    """ValueError (exit 2) naming the first flag given that belongs to a family other than
    ``args.family``, or that its family reads only under another setting (``--energies``
    without ``--rank-rule energy``): it would be dropped silently."""
    for flag, family in (getattr(args, _GIVEN, None) or {}).items():
        if family != args.family:
            raise ValueError(f"{flag} is a flag of --family {family}, not of --family "
                             f"{args.family}; drop it, or pass --family {family} (variants "
                             f"sweep --help lists each family's flags)")
        dest, value, other = _ONLY_WITH.get(flag, (None, None, None))
        if dest is not None and getattr(args, dest, value) != value:
            raise ValueError(f"{flag} is read only with {other} {value} (this sweep has "
                             f"{other} {getattr(args, dest)}); add {other} {value} or drop "
                             f"{flag}")


def config_from_args(args):
    """The validated :class:`variants.sweep.config.SweepConfig` of parsed ``sweep`` arguments:
    the chosen family's flags go to ``params`` (another family's flag given is a ValueError,
    :func:`check_family_flags`; built and validated once per command). Raises SweepError on
    bad input."""
    from variants.families import FAMILIES, get_family
    from variants.sweep.config import SweepConfig

    check_family_flags(args)
    kwargs = {k: v for k, v in vars(args).items()
              if k not in ("func", "command", "fail_on_violation", _GIVEN, "executor", "workers",
                           "ray_address")}
    family_params = {p for f in FAMILIES for p in get_family(f).params}
    own = get_family(args.family).params
    kwargs["params"] = {k: kwargs[k] for k in own}
    for k in family_params:
        kwargs.pop(k, None)
    kwargs["timing_batch_sizes"] = tuple(kwargs["timing_batch_sizes"])
    return SweepConfig(**kwargs).validate()


def run(args):
    """``variants sweep``: run it, print the summary table and where report.md is."""
    from runs.report import format_table
    from variants.commands import executor_flags
    from variants.sweep.run import Sweep, VariantsFailed

    cfg = config_from_args(args)
    log = (lambda m: print(m, file=sys.stderr))
    executor = executor_flags.make(args, log)
    try:
        summary = Sweep(cfg, log=log, executor=executor).run()
    except VariantsFailed as e:  # some variants failed to build; the others are written
        if e.summary is not None and not e.summary.empty:
            print(format_table(e.summary).to_string(index=False))
            print(f"\nreport: {e.out}/report.md")
        print(f"variants: error: {printable(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(format_table(summary).to_string(index=False))
    print(f"\nreport: {args.results_dir}/{cfg.run}/report.md")
    if args.fail_on_violation and not (summary["verdict"] == "PASS").all():
        undecided = summary.loc[summary["verdict"] == "UNDECIDED", "variant"].tolist()
        print("variants: some variant fails its contract (--fail-on-violation)" if not undecided
              else f"variants: {', '.join(map(str, undecided))} undecided (the point value meets "
                   "a bound, its interval does not: judge more rows), which is not a pass"
                   + ("; others fail" if len(undecided) < (summary["verdict"] != "PASS").sum()
                      else "") + " (--fail-on-violation)", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK

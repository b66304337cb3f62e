"""``variants sensitivity``: each unit (encoder Linear, embedding table; the head with
--quantize-head) quantized alone at each candidate width; the change on the search split's
calibration rows (:mod:`variants.search.sensitivity`) as sensitivity.csv and a heat map. The rows
are cached per unit and shared with ``variants search`` (:mod:`variants.search.sens_cache`)."""

import re
import sys
import textwrap
from pathlib import Path

from runs.commands.args import number


def _regex(text):
    """argparse type of ``--layers``: a valid regular expression (checked before any work)."""
    import argparse

    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid regular expression ({e}), "
                                         "e.g. 'layers\\.0\\.'") from None
    return text


def configure(sub):
    """Add the ``sensitivity`` subcommand to ``sub``; returns its parser."""
    from variants import defaults
    from variants.commands import HelpFormatter, executor_flags
    from variants.families.quant.family import GROUP_SIZES
    from variants.sweep.config import SweepConfig

    d = SweepConfig()
    p = sub.add_parser(
        "sensitivity", help="per-layer quantization sensitivity (table + heat map)",
        description=textwrap.fill(
            "Quantize each unit alone (each encoder Linear and embedding table; the decision "
            "head's Linears with --quantize-head) at each candidate bit width and measure the "
            "change of the reference's logits on the first --n-examples rows of the search "
            "split's calibration part (the rows variants search measures on): max |dlogit|, "
            "mean KL, flip rate. Writes OUT/sensitivity.csv and OUT/sensitivity.png. Rows are "
            "cached per unit and width under RESULTS_DIR/.cache/sensitivity/, shared with "
            "variants search: with the same model, data, sizes and group size, either command "
            "measures only the rows the other has not.", width=92),
        formatter_class=HelpFormatter)
    p.add_argument("--model", default=None, metavar="NAME|package.module:factory",
                   help="decision model (as variants sweep; None = minilm-sentiment)")
    p.add_argument("--model-config", default=None, metavar="FILE",
                   help="a model TOML file (as variants sweep)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="checkpoint folder; overrides the TOML's (None = the TOML's, or the "
                        "bundled all-MiniLM-L6-v2)")
    p.add_argument("--data", default=None, metavar="FILE",
                   help="own data (JSONL/CSV/Parquet; None = the bundled VADER data)")
    p.add_argument("--max-length", type=int, default=d.max_length, metavar="TOKENS",
                   help="tokens per text (as variants sweep; None = the model TOML's "
                        "max_length, else the tokenizer files')")
    p.add_argument("--bits", type=int, nargs="+", choices=defaults.QUANT_BITS,
                   default=list(defaults.QUANT_BITS), metavar="B",
                   help="candidate bit widths (each unit alone)")
    p.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=defaults.GROUP_SIZE,
                   help="weights per group: 32, 64, 128")
    p.add_argument("--layers", type=_regex, default=None, metavar="REGEX",
                   help="only the units whose path matches (e.g. 'layers\\.0\\.'; None = all)")
    p.add_argument("--quantize-head", action="store_true",
                   help="measure the decision head's Linears too (as variants search)")
    p.add_argument("--n-examples", type=number(int, low=10, example=defaults.N_SENSITIVITY),
                   default=defaults.N_SENSITIVITY,
                   help="search-calibration rows compared on (as variants search "
                        "--n-sensitivity)")
    p.add_argument("--n-search", type=number(int, low=40, example=1600), default=None,
                   help="search-split rows, as variants search --n-search (its calibration "
                        "half holds the rows; None = as the search: 1600 on the bundled data, "
                        "else from the data file)")
    p.add_argument("--n-fit", type=int, default=None,
                   help="fit examples of the reference's head (None = as variants search: "
                        "2000 on the bundled data, else from the data file)")
    p.add_argument("--n-calibration", type=int, default=d.n_calibration,
                   help="calibration-split rows the reference's temperatures are fitted on (as "
                        "variants sweep / search, so the fitted head's cache is shared; the "
                        "table does not depend on it)")
    p.add_argument("--seed", type=number(int, low=0, example=0), default=d.seed,
                   help="seed of the data subsample")
    p.add_argument("--results-dir", default=d.results_dir, help="holds .cache/")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (None = RESULTS_DIR/sensitivity/<model>)")
    executor_flags.add(p, "units (a unit: one layer or table at every width asked)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=run)
    return p


def options(args):
    """(:class:`variants.search.options.SearchOptions` whose search reads the same rows, sizes
    resolved from the data as the search resolves them; the model's name)."""
    from variants.search import sizes
    from variants.search.options import SearchOptions
    from variants.sweep.config import SweepConfig

    o = SearchOptions(model=args.model, model_config=args.model_config,
                      checkpoint=args.checkpoint, data=args.data, max_length=args.max_length,
                      n_fit=args.n_fit, n_search=args.n_search, n_sensitivity=args.n_examples,
                      n_calibration=args.n_calibration, seed=args.seed,
                      bits=tuple(sorted(set(args.bits))), group_size=args.group_size,
                      quantize_head=args.quantize_head, results_dir=args.results_dir)
    source = SweepConfig(model=o.model, model_config=o.model_config).resolve_model()
    sizes.resolve(o, source, log=lambda m: print(m, file=sys.stderr))
    return o, source.name


def run(args):
    """Measure (or read) the table, write sensitivity.csv and the heat map; print the most
    sensitive units. Returns 0."""
    from runs.io import make_out_dir, missing_folders, remove_empty_folders
    from variants.commands import executor_flags
    from variants.families.quant.family import check_bits
    from variants.sweep.config import SweepConfig

    for b in args.bits:  # bad input: before anything is loaded or written
        check_bits(b, args.group_size, prefix="--")
    if args.n_examples < 10:
        raise ValueError(f"--n-examples {args.n_examples} is too small; use at least 10")
    log = (lambda m: print(m, file=sys.stderr))
    executor = executor_flags.make(args, log)
    o, model = options(args)
    sweep = o.sweep_kwargs()
    SweepConfig(**sweep).validate()  # the shared flags (e.g. --max-length), before any folder
    out = args.out if args.out is not None else Path(args.results_dir) / "sensitivity" / model
    cache = Path(args.results_dir) / ".cache"
    created = missing_folders(out) + missing_folders(cache)
    make_out_dir(out, "--out" if args.out is not None else "--results-dir")  # before the work
    try:
        return _measure(args, o, sweep, Path(out), log, executor)
    except BaseException:  # a bad checkpoint, ...: the folders made above are taken back
        remove_empty_folders(sorted(set(created), key=lambda p: -len(p.parts)), cache=cache)
        raise


def _measure(args, o, sweep, out, log, executor):
    """The table measured (or read), written to ``out``; the most sensitive units printed."""
    from tqdm.auto import tqdm

    from runs.io import write_csv
    from variants.search import sens_cache, sensitivity
    from variants.search.units import search_units

    for k in ("results_dir", "contract", "model_config", "checkpoint", "data"):
        if sweep.get(k) is not None and Path(sweep[k]).exists():  # a Ray worker's cwd differs
            sweep[k] = str(Path(sweep[k]).resolve())
    remote = {"sweep": sweep, "n_search": o.n_search, "n_rows": o.n_sensitivity}
    reference, rows = sens_cache.load_rows(dict(remote, log=log))
    if len(rows) < args.n_examples:
        raise ValueError(f"--n-examples {args.n_examples} is more than the {len(rows)} rows of "
                         f"the search split's calibration half (--n-search {o.n_search}); pass "
                         f"--n-examples {len(rows)} or less, or raise --n-search")
    paths = search_units(reference.module, reference, group_size=args.group_size,
                         quantize_head=args.quantize_head).paths
    if args.layers:
        paths = [p for p in paths if re.search(args.layers, p)]
        if not paths:
            raise ValueError(f"--layers {args.layers!r} matches no unit; paths look like "
                             "encoder.layers.0.attention.value")
    with tqdm(total=len(paths) * len(set(args.bits)), desc="sensitivity", unit="layer-width",
              disable=not args.progress) as bar, executor:
        table = sens_cache.measure_cached(
            reference, rows, Path(args.results_dir) / ".cache", paths=paths, bits=args.bits,
            group_size=args.group_size, executor=executor, remote=remote, progress=bar.update,
            log=log)
    frame = table.frame
    write_csv(out / "sensitivity.csv", frame)
    sensitivity.plot(frame, out / "sensitivity.png",
                     title=f"{reference.name}: mean KL, one unit quantized (g{args.group_size}, "
                           f"{len(rows)} search-calibration rows)")
    for b in sorted(set(args.bits)):
        top = frame[frame["bits"] == b].nlargest(5, "kl_mean")
        print(f"most sensitive at {b} bits:")
        print(top.to_string(index=False))
    print(f"\nwrote {out / 'sensitivity.csv'} and {out / 'sensitivity.png'} (cache: "
          f"{table.folder})")
    return 0

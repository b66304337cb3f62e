"""``variants sensitivity``: each encoder Linear quantized alone at each candidate width; the
change on a calibration subset (:mod:`variants.search.sensitivity`) as sensitivity.csv and a heat map."""

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
    from variants.families.quant.family import GROUP_SIZES
    from variants.commands import HelpFormatter
    from variants.sweep.config import SweepConfig

    d = SweepConfig()
    p = sub.add_parser(
        "sensitivity", help="per-layer quantization sensitivity (table + heat map)",
        description=textwrap.fill(
            "Quantize each encoder Linear alone at each candidate bit width and measure "
                    "the change of the reference's logits on a calibration subset: max |dlogit|, "
                    "mean KL, flip rate. Writes OUT/sensitivity.csv and OUT/sensitivity.png; "
                    "cached under RESULTS_DIR/.cache/sensitivity/.", width=92),
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
                   help="candidate bit widths (each layer alone)")
    p.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=defaults.GROUP_SIZE,
                   help="weights per group: 32, 64, 128")
    p.add_argument("--layers", type=_regex, default=None, metavar="REGEX",
                   help="only the layers whose path matches (e.g. 'layers\\.0\\.'; None = all)")
    p.add_argument("--n-examples", type=number(int, low=10, example=defaults.N_SENSITIVITY),
                   default=defaults.N_SENSITIVITY,
                   help="calibration examples compared on (a subset of the calibration split; "
                        "as variants search --n-sensitivity)")
    p.add_argument("--n-fit", type=int, default=d.n_fit,
                   help="fit examples of the reference's head (as the sweep's, so its cache is "
                        "shared)")
    p.add_argument("--seed", type=number(int, low=0, example=0), default=d.seed,
                   help="seed of the data subsample")
    p.add_argument("--results-dir", default=d.results_dir, help="holds .cache/")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (None = RESULTS_DIR/sensitivity/<model>)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=run)
    return p


def run(args):
    """Measure (or load) the table, write sensitivity.csv and the heat map; print the most
    sensitive layers. Returns 0."""
    from tqdm.auto import tqdm

    from runs.io import make_out_dir, write_csv
    from variants.search import sensitivity
    from variants.families.quant.family import check_bits
    from variants.models import fitted_reference
    from variants.sweep.config import SweepConfig
    from variants.sweep.inputs import cache_parts, load_inputs

    for b in args.bits:  # bad input: before anything is loaded or written
        check_bits(b, args.group_size, prefix="--")
    if args.n_examples < 10:
        raise ValueError(f"--n-examples {args.n_examples} is too small; use at least 10")
    cfg = SweepConfig(model=args.model, model_config=args.model_config,
                      checkpoint=args.checkpoint, data=args.data, max_length=args.max_length,
                      n_fit=args.n_fit,
                      n_calibration=args.n_examples, n_eval=10, seed=args.seed,
                      timing_batch_sizes=(1,), results_dir=args.results_dir).validate()
    out = args.out if args.out is not None else Path(args.results_dir) / "sensitivity" / cfg.model
    make_out_dir(out, "--out" if args.out is not None else "--results-dir")  # before the work
    out = Path(out)
    try:
        _, checkpoint, tasksets = load_inputs(cfg)
    except ValueError as e:  # this verb's calibration size is --n-examples (the sweep's flags)
        raise ValueError(str(e).replace("--n-calibration", "--n-examples")) from None
    cache = Path(args.results_dir) / ".cache"
    log = (lambda m: print(m, file=sys.stderr))
    reference, _ = fitted_reference(cfg.resolve_model(), checkpoint, tasksets, cache, log=log,
                                    extra_key=cache_parts(cfg))
    cal = tasksets["calibration"]
    paths = sensitivity.quantizable_layers(reference.module, args.layers)
    with tqdm(total=len(paths) * len(set(args.bits)), desc="sensitivity", unit="layer-width",
              disable=not args.progress) as bar:
        frame, path, _ = sensitivity.cached_measure(
            reference, cal, cache, bits=sorted(set(args.bits)), group_size=args.group_size,
            layers=args.layers, progress=bar.update, log=log)
    write_csv(out / "sensitivity.csv", frame)
    sensitivity.plot(frame, out / "sensitivity.png",
                     title=f"{cfg.model}: mean KL, one layer quantized (g{args.group_size}, "
                           f"{len(cal)} calibration examples)")
    for b in sorted(set(args.bits)):
        top = frame[frame["bits"] == b].nlargest(5, "kl_mean")
        print(f"most sensitive at {b} bits:")
        print(top.to_string(index=False))
    print(f"\nwrote {out / 'sensitivity.csv'} and {out / 'sensitivity.png'} (cache: {path})")
    return 0

"""``variants search``: the cheapest quant configuration (per-layer bits) that passes a contract
(:mod:`variants.search`)."""

import sys
import textwrap


def configure(sub):
    """Add the ``search`` subcommand to ``sub``; returns its parser."""
    from variants.search.costs import COSTS
    from variants.search.options import FAMILIES, SearchOptions
    from variants.commands import HelpFormatter
    from variants.defaults import COLD_STARTS, QUANT_BITS
    from variants.search.strategies import STRATEGIES

    d = SearchOptions()
    p = sub.add_parser(
        "search", help="cheapest per-layer quant configuration that passes the contract",
        description=textwrap.fill(
            "Search per-tensor bit widths (embedding tables, encoder Linears, the head with "
            "--quantize-head; quant family, one group "
                    "size) for the cheapest configuration that passes the contract. Candidates "
                    "are judged on a search split carved from fit rows the head was not fitted "
                    "on (never the calibration or eval split), with exact sequential stopping; "
                    "the winner is then judged on the real calibration + eval splits as a sweep "
                    "variant (OUT/final/). Writes OUT/search.json, search.md, search.png; "
                    "resumes from OUT/candidates/.", width=92),
        formatter_class=HelpFormatter)
    p.add_argument("--contract", default=None,
                   help="contract TOML file, or a packaged one by name (None = default)")
    p.add_argument("--cost", default=d.cost, help=f"what to minimise: {', '.join(COSTS)}")
    p.add_argument("--strategy", default=d.strategy,
                   help=f"{' or '.join(STRATEGIES)} (None = latency for --cost latency-b1 / "
                        "latency-b32, else bisect; latency: W8A8, quantized embeddings, token "
                        "pruning and early exit composed, walked by a latency model measured on "
                        "this machine, the finalists timed; optuna: a seeded TPE study over "
                        "composed cross-family candidates; pip install 'mlx-variants[search]')")
    p.add_argument("--families", nargs="+", default=list(d.families),
                   help=f"families searched ({', '.join(FAMILIES)}; beyond quant with "
                        "--strategy optuna, composed)")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="data sampling seed (and the optuna sampler's)")
    p.add_argument("--max-candidates", type=int, default=d.max_candidates,
                   help="stop after this many distinct candidates")
    p.add_argument("--budget", type=float, default=None,
                   help="largest acceptable cost, in the --cost's unit (None = no limit)")
    p.add_argument("--bits", type=int, nargs="+", default=list(d.bits), metavar="B",
                   help=f"candidate widths per layer, from {', '.join(map(str, QUANT_BITS))} "
                        "(the lowest is the start; not a sweep's --bits, which builds every "
                        "width: starting at 2 bits would spend --max-candidates on raising "
                        "layers out of 2 and 3 bits)")
    p.add_argument("--group-size", type=int, default=d.group_size,
                   help="weights per quantization group (as variants sweep --group-size)")
    p.add_argument("--quant-method", nargs="+", default=list(d.quant_methods),
                   metavar="METHOD", dest="quant_methods",
                   help="quantizers searched, one per candidate beside its per-layer map (rtn, "
                        "awq, gptq, dwq; the strategy is walked once per method, each with "
                        "its own --max-candidates; learned methods read the fit split; dwq "
                        "trains per candidate and is slow)")
    p.add_argument("--scale-dtype", default=d.scale_dtype,
                   choices=("float32", "float16", "bfloat16"),
                   help="precision every affine unit stores its scales and biases in, priced "
                        "exactly (4-bit g64: 4.5 bits per weight at float16, 5.0 at float32; "
                        f"default: {d.scale_dtype})")
    p.add_argument("--modes", nargs="+", default=list(d.modes), metavar="MODE",
                   help="microscaling formats each unit may take beside the widths (mxfp4 "
                        "4.25, nvfp4 4.5, mxfp8 8.25 bits per weight); a mode less accurate "
                        "(in weight error) than a cheaper option is dropped; 'none' for widths "
                        "only; --cost bytes / bits / flops with rtn (default: "
                        f"{' '.join(d.modes) or 'none'})")
    p.add_argument("--no-unseen-rows", dest="unseen_rows", action="store_false",
                   help="keep the word table one unit (default: after the walk, the winner's "
                        "word-table rows unseen in the fit split's texts are tried narrower "
                        "alone, 2 bits up)")
    p.add_argument("--embedding-texts", default="", metavar="FILE",
                   help="your own unlabelled texts, one per line: their word-table rows count "
                        "as used beside the fit split's (so they are not among the unseen rows "
                        "stored narrower)")
    p.add_argument("--method-sensitivity", action="store_true",
                   help="awq and gptq walk on their own per-layer sensitivity (each encoder "
                        "Linear quantized alone by the method) instead of round-to-nearest's "
                        "(default: every method walks on round-to-nearest's; dwq always does)")
    p.add_argument("--w8a8", action="store_true",
                   help="each Linear may also run as W8A8 (int8 weights and per-token int8 "
                        "activations on oneDNN's integer GEMM), priced by --cost; meant for "
                        "--cost latency-b1 / latency-b32 with --strategy bisect or greedy, "
                        "where it is the fastest option (the winner re-runs with variants sweep "
                        "--int8-layers); the latency walk has W8A8 in its own space")
    p.add_argument("--no-quantize-embeddings", dest="quantize_embeddings",
                   action="store_false",
                   help="keep the embedding tables fp32 (by default each table is a unit of the "
                        "search, stored as a quantized embedding)")
    p.add_argument("--quantize-head", action="store_true",
                   help="search the decision head's Linears too (by role: the model's declared "
                        "head_modules, else everything outside the encoder; default: kept fp32)")
    p.add_argument("--batch", type=int, default=d.batch,
                   help="candidates evaluated together per strategy step")
    p.add_argument("--chunk-size", type=int, default=d.chunk_size,
                   help="search-eval rows per sequential-stopping chunk")
    p.add_argument("--no-stop", dest="stop", action="store_false",
                   help="evaluate every candidate on the whole search-eval part")
    p.add_argument("--select", default=d.select, choices=("bound", "value"),
                   help="on the search split a clause passes when its confidence bound (bound: "
                        "Clopper-Pearson for rates, bootstrap for the rest, the temperature refit "
                        "included; counts on the observed count) or its point value (value) "
                        "clears the threshold (variants.search.bounds)")
    p.add_argument("--search-margin", type=float, default=d.search_margin,
                   help="on the search split, hold max-statistic clauses to threshold x (1 - "
                        "M): headroom for the eval split (variants.search.margin)")
    p.add_argument("--n-search", type=int, default=d.n_search,
                   help="search-split rows (from unused fit rows), halved into calibration and "
                        "eval parts (default: 1600 on the bundled data; with --data, half the "
                        "file's fit-split rows, or all of them for a model that fits nothing); "
                        "too few eval rows for a clause's confidence bound to pass at all (the "
                        "default contract's agreement: 122) stop the search before it starts "
                        "(exit 2)")
    p.add_argument("--n-sensitivity", type=int, default=d.n_sensitivity,
                   help="search-calibration rows the per-layer sensitivity is measured on (as "
                        "variants sensitivity --n-examples)")
    p.add_argument("--n-fit", type=int, default=d.n_fit,
                   help="fit rows for the head (None = 2000 on the bundled data; with --data, "
                        "the fit-split rows the search split leaves, 0 for a model that fits "
                        "nothing)")
    for flag, v, what in (("--n-calibration", d.n_calibration,
                           "calibration-split examples the winner is judged on"),
                          ("--n-eval", d.n_eval, "eval-split examples the winner is judged on")):
        p.add_argument(flag, type=int, default=v, help=f"{what} (as variants sweep)")
    p.add_argument("--model", default=None, metavar="NAME|package.module:factory",
                   help="decision model (as variants sweep; None = minilm-sentiment)")
    p.add_argument("--model-config", default=None, metavar="FILE",
                   help="a model TOML (as variants sweep)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="a local Hugging Face-format folder; overrides the model TOML's (None "
                        "= the TOML's, or the bundled all-MiniLM-L6-v2)")
    p.add_argument("--data", default=None, metavar="FILE",
                   help="your own data (JSONL, CSV or Parquet; None = the bundled VADER data)")
    p.add_argument("--max-length", type=int, default=d.max_length, metavar="TOKENS",
                   help="tokens per text (as variants sweep; None = the model TOML's "
                        "max_length, else the tokenizer files')")
    p.add_argument("--results-dir", default=d.results_dir, help="holds .cache/")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (None = RESULTS_DIR/search/<model>-<cost>-<strategy>); "
                        "one search at a time per folder: a second exits 2 naming the holder "
                        "(OUT/.lock)")
    p.add_argument("--executor", default=d.executor,
                   help="where candidates run: local (this process), process (--workers "
                        "spawned processes) or ray (--workers Ray actors; needs the ray extra). "
                        "Results are the same whichever is chosen")
    p.add_argument("--workers", type=int, default=d.workers,
                   help="candidates run at once (process / ray); use --batch > 1 so a strategy "
                        "step has several candidates to give them")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="a running Ray cluster (host:port, ray://host:10001 or auto); None = "
                        "RAY_ADDRESS, else a local Ray with --workers CPUs")
    p.add_argument("--timing-rounds", type=int, default=d.timing_rounds,
                   help="the finalists' alternated timing rounds per batch size (as variants "
                        "sweep)")
    p.add_argument("--timing-warmup", type=int, default=d.timing_warmup,
                   help="the finalists' untimed warm-up calls per batch size (as variants sweep)")
    p.add_argument("--timing-budget-s", type=float, default=d.timing_budget_s,
                   help="the finalists' seconds per timing measurement (as variants sweep)")
    p.add_argument("--timing-batch-sizes", type=int, nargs="+", metavar="B",
                   default=list(d.timing_batch_sizes),
                   help="the finalists' timed batch sizes (as variants sweep)")
    p.add_argument("--cold-start", default=d.cold_start, choices=COLD_STARTS,
                   help="the finalists' cold starts in a fresh process (as variants sweep)")
    p.add_argument("--no-finalize", dest="finalize", action="store_false",
                   help="do not judge the winner on the calibration + eval splits")
    p.add_argument("--fail-on-violation", action="store_true",
                   help="exit 1 when no configuration passes (without it a finished search "
                        "exits 0)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars (shown by default)")
    p.set_defaults(func=run)
    return p


def run(args):
    """Run the search; 0 when it finished (1 with --fail-on-violation and no passing
    configuration); bad input raises ValueError (exit 2 in :mod:`variants.cli`)."""
    from variants.commands import EXIT_FAILURE, EXIT_OK
    from variants.search.options import SearchOptions
    from variants.search.run import run_search

    opts = SearchOptions(
        contract=args.contract, cost=args.cost, strategy=args.strategy,
        families=tuple(args.families), seed=args.seed, max_candidates=args.max_candidates,
        budget=args.budget, bits=tuple(args.bits), group_size=args.group_size, batch=args.batch,
        quant_methods=tuple(args.quant_methods), w8a8=args.w8a8,
        method_sensitivity=args.method_sensitivity, scale_dtype=args.scale_dtype,
        modes=tuple(args.modes), unseen_rows=args.unseen_rows,
        embedding_texts=args.embedding_texts,
        quantize_embeddings=args.quantize_embeddings, quantize_head=args.quantize_head,
        chunk_size=args.chunk_size, stop=args.stop, select=args.select, search_margin=args.search_margin,
        n_search=args.n_search,
        n_sensitivity=args.n_sensitivity, n_fit=args.n_fit, n_calibration=args.n_calibration,
        n_eval=args.n_eval, model=args.model, model_config=args.model_config,
        checkpoint=args.checkpoint, data=args.data, max_length=args.max_length,
        results_dir=args.results_dir, out=args.out,
        executor=args.executor, workers=args.workers, ray_address=args.ray_address,
        timing_rounds=args.timing_rounds,
        timing_warmup=args.timing_warmup, timing_budget_s=args.timing_budget_s,
        timing_batch_sizes=tuple(args.timing_batch_sizes), cold_start=args.cold_start,
        finalize=args.finalize, progress=args.progress)
    res = run_search(opts, log=lambda m: print(m, file=sys.stderr))
    print(res.result["outcome"])
    if not res.found and args.fail_on_violation:
        return EXIT_FAILURE
    return EXIT_OK

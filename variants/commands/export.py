"""``variants export`` and ``variants verify``: ship a judged variant as an MLX checkpoint folder,
and prove a folder is the model that was judged (:mod:`variants.export`)."""

import sys


def configure(sub):
    """Add the ``export`` subcommand to ``sub``; returns its parser."""
    from runs.commands.args import folder
    from variants.export import EXPORTABLE, NOT_EXPORTABLE

    p = sub.add_parser(
        "export", help="write a judged variant as an MLX checkpoint folder",
        description="Write a judged variant as an MLX checkpoint folder: model.safetensors "
                    "(the original checkpoint's tensors under their transformers names, "
                    "quantized ones as packed weight / scales / biases as mlx.nn.quantize makes "
                    "them, factored Linears as two), config.json with mlx-lm's quantization "
                    "block keyed by those names, "
                    "the tokenizer files, model.toml, contract.toml, verdict.json, the judged "
                    "outputs and eval rows, manifest.json (SHA-256 of every file) and a "
                    f"README.md model card. Families: {', '.join(EXPORTABLE)} (not "
                    f"{', '.join(NOT_EXPORTABLE)}); a pruning or exit rule (and exit heads) "
                    "is stored beside the weights and only load_variant runs it. Load it with "
                    "variants.export.load.load_variant(DIR) or load_checkpoint(DIR) (the "
                    "weights alone).")
    p.add_argument("source", metavar="SOURCE", type=folder,
                   help="a run folder (with --variant NAME) or a search folder (its winner)")
    p.add_argument("--variant", default=None, metavar="NAME",
                   help="the variant of a run folder (default: a search folder's winner)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the folder to write (must not exist, or be empty)")
    p.add_argument("--allow-fail", action="store_true",
                   help="export a variant that FAILED its contract (the model card says so)")
    p.add_argument("--format", choices=("mlx", "onnx"), default="mlx",
                   help="mlx (default): the MLX checkpoint folder above; onnx: model.onnx, the "
                        "whole decision module as one ONNX graph built from the judged MLX "
                        "arrays (the reference with --variant reference, or a quant / w8a8 / "
                        "lowrank variant), judged again as ONNX Runtime runs it on the run's "
                        "calibration and eval rows (verdict.json; the run gains <variant>-onnx),"
                        " next to the MLX verdict and the largest |Δlogit| between them; needs "
                        "pip install 'mlx-variants[onnx]'")
    p.set_defaults(func=run)
    return p


def configure_verify(sub):
    """Add the ``verify`` subcommand to ``sub``; returns its parser."""
    from runs.commands.args import folder
    from variants.export.verify import TOLERANCE

    p = sub.add_parser(
        "verify", help="prove an exported folder is the model that was judged",
        description="Check every file of an exported folder against manifest.json (SHA-256), "
                    "load it packed, recompute its outputs on the judged eval rows and compare "
                    "them with the judged outputs.npz (max |Δlogit|) and the contract's verdicts. "
                    "An ONNX folder (export --format onnx) runs model.onnx in ONNX Runtime on the "
                    "judged eval batches instead. "
                    "Exit 0: all match; 1: outputs or a verdict differ; 2: bad input or a "
                    "changed file.")
    p.add_argument("folder", metavar="DIR", type=folder, help="a folder written by variants export")
    p.add_argument("--tolerance", type=float, default=TOLERANCE,
                   help=f"largest accepted max |Δlogit| per unit of the judged logits' scale, "
                        f"max(1, max |logit|) (default: {TOLERANCE:g})")
    p.add_argument("--cold-start", action="store_true",
                   help="also time a cold start from the folder (packed, nothing built) against "
                        "one from the fp32 checkpoint building the variant (quant exports; a "
                        "low-rank or w8a8 one times the folder alone), in fresh processes")
    p.set_defaults(func=run_verify)
    return p


def run(args):
    """Export; 0 when written. Bad input raises ExportError (exit 2)."""
    from variants.commands import EXIT_OK
    from variants.export.source import locate
    from variants.export.write import check_out, export

    check_out(args.out)
    if args.format == "onnx":
        from variants.export.onnx_export import export_onnx

        export_onnx(args.source, args.variant, args.out, allow_fail=args.allow_fail,
                    log=lambda m: print(m, file=sys.stderr))
        print(args.out)
        return EXIT_OK
    judged = locate(args.source, args.variant, allow_fail=args.allow_fail)
    export(judged, args.out, log=lambda m: print(m, file=sys.stderr))
    print(args.out)
    return EXIT_OK


def run_verify(args):
    """Verify; 0 / 1 (outputs or verdicts differ); bad input raises ExportError (exit 2)."""
    import math

    from variants.commands import EXIT_FAILURE, EXIT_OK
    from variants.export.verify import verify

    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise ValueError(f"--tolerance {args.tolerance} must be a finite number >= 0, e.g. 1e-5")
    from variants.export.onnx_verify import is_onnx_folder, verify_onnx

    onnx = is_onnx_folder(args.folder)
    if onnx and args.cold_start:
        raise ValueError("--cold-start times an MLX folder's load; an ONNX folder (export "
                         "--format onnx) has none to time: drop --cold-start")
    if args.cold_start:  # a moved fp32 checkpoint is refused before anything runs
        from variants.export import coldstart
        from variants.export.verify import check_files

        check_files(args.folder)
        modes, note = coldstart.plan(args.folder)
    check = verify_onnx if onnx else verify  # export --format onnx
    res = check(args.folder, tolerance=args.tolerance, log=print)
    if args.cold_start:
        if note:
            print(note)
        print(coldstart.table(coldstart.measure(args.folder, modes)))
    return EXIT_OK if res["ok"] else EXIT_FAILURE

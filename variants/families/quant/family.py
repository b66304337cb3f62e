"""The quant family (group-wise quantization): config, flags, ladder. No MLX.

The quantizers: round-to-nearest (``mx.quantize``, native or simulated) is
:mod:`variants.families.quant.build`; AWQ, GPTQ and distilled scales (DWQ), which learn from the
fit split and write the same packed format, are :mod:`variants.families.quant.learned`.
"""

from pathlib import Path

from variants import defaults
from variants.layer_maps import bits_map as bits_map_mod
from variants.families.family import BuildInputs, Family

from variants.families.quant.config import (BITS, GROUP_SIZES, METHODS, MODES,  # noqa: F401
                                         QuantConfig, check_bits)
from variants.layer_maps.formats import MODES as MODES_MX, MX_SHAPE, SCALE_DTYPES


PARAMS = ("bits", "group_size", "quantize_embeddings", "quantize_head", "bits_map",
          "quant_method", "int8_layers", "scale_dtype", "quant_mode", "embedding_texts")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("quant family (--family quant)")
    g.add_argument("--bits", type=int, nargs="+", default=None, metavar="B",
                   help=f"bit widths to sweep, from {BITS} (default: all; with a --bits-map "
                        "recipe: the recipe's low width)")
    g.add_argument("--group-size", type=int, default=defaults.GROUP_SIZE,
                   help=f"weights per quantization group, one of {GROUP_SIZES}")
    g.add_argument("--quantize-embeddings", action="store_true",
                   help="also quantize the embedding tables (kept fp32 by default)")
    g.add_argument("--quantize-head", action="store_true",
                   help="also quantize the decision head (kept fp32 by default)")
    g.add_argument("--bits-map", default="", metavar="PATTERN=BITS[:GROUP],...|RECIPE",
                   help="per-layer bits: regexes searched in layer paths, first match wins, "
                        "unmatched layers get --bits; or a recipe "
                        f"({', '.join(bits_map_mod.RECIPES)}: value and down projections of the "
                        "first, last and every third layer at the high width)")
    g.add_argument("--quant-method", nargs="+", default=None, metavar="METHOD",
                   help=f"quantizers, one variant per method and width, from {' '.join(METHODS)}"
                        ": rtn = round to nearest; awq = activation-aware channel scales and "
                        "clipping; gptq = Hessian error compensation; dwq = AWQ-scaled GPTQ "
                        "codes with scales, biases and LayerNorms distilled on the fit split (default: the model "
                        "TOML's [quant] method, else rtn)")
    g.add_argument("--scale-dtype", default=None, choices=SCALE_DTYPES,
                   help="precision the affine scales and biases are stored in: float16 or "
                        "bfloat16 halve their share (4-bit g64: 5.0 bits per weight at "
                        "float32, 4.5 at float16, mlx-lm's layout); the dequantized weight is "
                        "float32(scale) * q + float32(bias) (default: float32)")
    g.add_argument("--quant-mode", default=None, choices=MODES_MX,
                   help="affine (scale and bias per group, --bits / --group-size) or one of "
                        "MLX's microscaling formats: mxfp4 (FP4 E2M1 values, a power-of-two "
                        "scale per 32: 4.25 bits per weight), mxfp8 (FP8 E4M3 per 32: 8.25), "
                        "nvfp4 (FP4 with an FP8 scale per 16: 4.5); round-to-nearest only "
                        "(default: affine)")
    g.add_argument("--embedding-texts", default="", metavar="FILE",
                   help="your own unlabelled texts, one per line: their word-table rows count as "
                        "used beside the fit split's, for a --bits-map entry "
                        "'word_embeddings@unseen=B' that stores the rows no text uses at B bits")
    g.add_argument("--int8-layers", default="", metavar="REGEX",
                   help="Linears whose path matches run as W8A8 (int8 weights and per-token "
                        "int8 activations on integer GEMMs, as --family w8a8); the other layers "
                        "are quantized as --bits / --bits-map say (default: none)")


def ladder(*, bits=None, group_size=64, quantize_embeddings=False, quantize_head=False,
           bits_map="", quant_method=None, int8_layers="", scale_dtype="float32",
           quant_mode="affine", embedding_texts=""):
    """The variant configs of one sweep: one QuantConfig per method (``quant_method``, None =
    rtn) and bit width (``bits`` None: all of BITS), each with ``bits_map``; a recipe map
    gives one width; a microscaling ``quant_mode`` one variant at its own width and group
    size (ValueError if bad)."""
    extra = {"scale_dtype": scale_dtype or "float32", "quant_mode": quant_mode or "affine",
             "embedding_texts": embedding_texts or ""}
    if extra["embedding_texts"]:  # before anything is written: one line naming the flag
        from variants.families.quant.row_use import read_texts

        if bits_map_mod.UNSEEN not in (bits_map or ""):
            raise ValueError("--embedding-texts tells the word-table rows in use for a "
                             "--bits-map entry 'word_embeddings@unseen=B'; add one or drop "
                             "--embedding-texts")
        read_texts(extra["embedding_texts"])
    if extra["quant_mode"] in MX_SHAPE:
        mode = extra["quant_mode"]
        mb, mg = MX_SHAPE[mode]
        if bits is not None and list(bits) != [mb]:
            raise ValueError(f"--quant-mode {mode} stores {mb}-bit values; drop "
                             f"--bits {' '.join(map(str, bits))}")
        if group_size not in (mg, defaults.GROUP_SIZE):
            raise ValueError(f"--quant-mode {mode} has groups of {mg}; drop --group-size "
                             f"{group_size}")
        if extra["scale_dtype"] != "float32":
            raise ValueError(f"--quant-mode {mode} stores its own 8-bit scales; drop "
                             f"--scale-dtype {extra['scale_dtype']} (or [quant] scale_dtype)")
        methods = list(dict.fromkeys(quant_method or ["rtn"]))
        return [QuantConfig(mb, mg, quantize_embeddings, quantize_head, bits_map, m,
                            int8_layers or "", **extra) for m in methods]
    methods = list(dict.fromkeys(quant_method or ["rtn"]))
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"--quant-method {' '.join(bad)}: not known; choose from "
                         f"{' '.join(METHODS)}")
    recipe, _ = bits_map_mod.parse(bits_map, BITS, GROUP_SIZES)
    if recipe:
        low = bits_map_mod.RECIPES[recipe][0]
        if bits is not None and list(bits) != [low]:
            raise ValueError(f"--bits {' '.join(map(str, bits))} and --bits-map {recipe} both "
                             f"set the widths ({recipe}: {low} and "
                             f"{bits_map_mod.RECIPES[recipe][1]}); drop --bits, or write the "
                             "map as PATTERN=BITS entries")
        bits = [low]
    if bits is None:
        bits = BITS
    if not bits:
        raise ValueError("no bit widths given; pass e.g. --bits 4 8")
    return [QuantConfig(int(b), group_size, quantize_embeddings, quantize_head, bits_map, m,
                        int8_layers or "", **extra)
            for m in methods for b in dict.fromkeys(bits)]


def run_name(*, group_size=64, bits_map="", quant_method=None, int8_layers="",
             scale_dtype="float32", quant_mode="affine", **_):
    """Default run-folder suffix for these parameters."""
    from variants.layer_maps.formats import SCALE_SHORT

    mixed = bits_map_mod.tag(bits_map)
    methods = [m for m in dict.fromkeys(quant_method or []) if m != "rtn"]
    head = quant_mode if quant_mode and quant_mode != "affine" else f"g{group_size}"
    scale = f"-s{SCALE_SHORT[scale_dtype]}" if scale_dtype and scale_dtype != "float32" else ""
    return (head + scale + (f"-{mixed}" if mixed else "")
            + ("-" + "-".join(methods) if methods else "") + ("-int8" if int8_layers else ""))


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.families.quant.build.build` for rtn (needs no data),
    :func:`variants.families.quant.learned.build` for the others (fit split, cache); with
    ``int8``, :func:`variants.families.quant.int8.build` (those Linears as W8A8)."""
    if config.int8:
        from variants.families.quant import int8

        return int8.build(reference, config, inputs, mode)
    from variants.families.quant.dispatch import build_weights

    return build_weights(reference, config, inputs, mode)


def check_model(encoder, configs, model=None):
    """The family's model check: a ``--bits-map`` pattern that matches no layer
    (:func:`variants.families.quant.build.check_model`); DWQ on a model it cannot train
    (:func:`variants.families.quant.dwq.check_model`)."""
    from variants.families.quant import build as quantize

    quantize.check_model(encoder, configs)
    if any(cfg.method == "dwq" for cfg in configs):
        from variants.families.quant import dwq
        from variants.models.head_output import require_softmax

        require_softmax(model, "--quant-method dwq trains the quantization scales on KL between "
                        "the reference's and the variant's softmaxes over the options",
                        "use --quant-method rtn, gptq or awq (fitted on layer outputs, not on a "
                        "softmax)")

        dwq.check_model(encoder)
    for cfg in configs:
        if cfg.int8:
            from variants.families.quant.int8 import int8_paths

            int8_paths(encoder, cfg.int8)


def describe(info, timing=None):
    """Markdown for a learned quantizer (``build.json`` holds ``method``: its settings, the fit
    rows it read, its build time and the per-layer output error against RTN) and for a
    mixed-precision variant (``layer_bits``: bits per weight and a layer x Linear table of the
    stored widths, ``bits`` or ``bits:group``). None for a uniform RTN variant."""
    from variants.families.quant.report import method_lines

    learned = method_lines(info)
    layer_bits = info.get("layer_bits")
    if not layer_bits:
        return learned
    rows, cols = {}, []
    for path, (bits, group) in layer_bits.items():
        short = path.removeprefix("encoder.layers.")
        layer, _, name = short.partition(".") if short[:1].isdigit() else ("", "", short)
        rows.setdefault(layer, {})[name] = f"{bits}" + ("" if group == 64 else f":{group}")
        cols += [name] if name not in cols else []
    widths = [b for b, _ in layer_bits.values()]
    order = ("attention.query", "attention.key", "attention.value", "attention.out",
             "intermediate", "output")  # BERT's forward order; other names after, sorted
    cols.sort(key=lambda c: (order.index(c) if c in order else len(order), c))
    rows = dict(sorted(rows.items(), key=lambda kv: (not kv[0].isdigit(),
                                                      int(kv[0]) if kv[0].isdigit() else 0)))
    lines = [f"- per-layer widths (--bits-map): {len(layer_bits)} Linears, "
             f"{widths.count(max(widths))} at {max(widths)} bits, {widths.count(min(widths))} at "
             f"{min(widths)}; stored {info['bits_per_weight']:.3f} bits per weight, model "
             f"{info['model_bytes'] / 1e6:.1f} MB", "",
             "| layer | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for layer, cells in rows.items():
        lines.append(f"| {layer or '—'} | " + " | ".join(cells.get(c, "—") for c in cols) + " |")
    return (learned + "\n" if learned else "") + "\n".join(lines) + "\n"


FAMILY = Family(name="quant", config=QuantConfig, params=PARAMS, add_arguments=add_arguments,
                ladder=ladder, run_name=run_name, build=build, check_model=check_model,
                describe=describe, inputs=("calibration", "fit", "cache_dir"),
                # --int8-layers: W8A8 Linears are judged on the model that runs (family.py)
                judged_in_speed_mode=lambda vcfg: bool(vcfg.int8))

"""The quant family's shared settings: widths, group sizes, build modes and the config of one
quantized variant. No MLX; read by the family entry (:mod:`variants.families.quant.family`) and by
every builder that quantizes (:mod:`variants.families.quant.build` and the families that stack a
quantization on their own change).
"""

from dataclasses import dataclass

from variants import defaults
from variants.layer_maps import bits_map as bits_map_mod

BITS = defaults.QUANT_BITS
GROUP_SIZES = (32, 64, 128)
MODES = ("native", "simulated")
#: quantizers: round-to-nearest, AWQ (Lin et al. 2024), GPTQ (Frantar et al. 2023), distilled
#: scales (GPTQ codes, scales and biases trained on the fit split's KL to the reference)
METHODS = defaults.QUANT_METHODS


def check_bits(bits, group_size, prefix=""):
    """Raise ValueError unless ``bits`` (None = not quantized) is in ``BITS`` and ``group_size``
    in ``GROUP_SIZES``; ``prefix`` names the family's flags (``exit_`` -> ``--exit-bits``,
    ``--exit-group-size``; "" or "--" -> ``--bits``, ``--group-size``)."""
    name = prefix.strip("-_").replace("_", "-")
    stem = f"--{name}-" if name else "--"
    if bits is not None and bits not in BITS:
        raise ValueError(f"{stem}bits {bits} is not supported; choose one of {BITS}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"{stem}group-size {group_size} is not supported; "
                         f"choose one of {GROUP_SIZES}")


@dataclass(frozen=True)
class QuantConfig:
    """Parameters of one quantized variant (validated on creation)."""

    bits: int = 4
    group_size: int = 64
    quantize_embeddings: bool = False
    quantize_head: bool = False
    #: per-layer bits (:mod:`variants.layer_maps.bits_map`, normalised); "" = uniform ``bits``
    bits_map: str = ""
    #: the quantizer, one of METHODS
    method: str = "rtn"
    #: regex of the Linears run as W8A8 on integer GEMMs (:mod:`variants.families.quant.int8`);
    #: "" = none
    int8: str = ""
    #: precision the affine scales and biases are stored in (:mod:`.formats`)
    scale_dtype: str = "float32"
    #: "affine" or a microscaling mode (mxfp4, mxfp8, nvfp4: its own bits and group size)
    quant_mode: str = "affine"
    #: a file of the user's own texts whose word-table rows count as used, beside the fit
    #: split's (:mod:`.row_use`; read only by a map with a ``@unseen`` entry)
    embedding_texts: str = ""

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"--quant-method {self.method!r} is not known; choose from "
                             f"{' '.join(METHODS)}")
        if self.bits is None:
            raise ValueError(f"bits=None is not supported; choose one of {BITS}")
        from variants.layer_maps import formats

        formats.check_scale_dtype(self.scale_dtype)
        formats.check_mode(self.quant_mode)
        if self.quant_mode != "affine":
            bits, group = formats.MX_SHAPE[self.quant_mode]
            if (self.bits, self.group_size) != (bits, group):
                raise ValueError(f"--quant-mode {self.quant_mode} stores {bits}-bit values in "
                                 f"groups of {group}, not bits={self.bits} group "
                                 f"size={self.group_size}; drop --bits and --group-size")
            if self.method != "rtn":
                raise ValueError(f"--quant-method {self.method} learns affine codes, scales and "
                                 f"biases; --quant-mode {self.quant_mode} has no biases and "
                                 "power-of-two or fp8 scales: use --quant-method rtn with it")
        else:
            check_bits(self.bits, self.group_size)
        if self.int8:
            from variants.families.w8a8.family import check_skip

            check_skip(self.int8, flag="--int8-layers")
        recipe, rules = bits_map_mod.parse(self.bits_map, BITS, GROUP_SIZES)
        if self.method != "rtn" and any(r.mode != "affine" for r in rules):
            raise ValueError(f"--quant-method {self.method} learns affine codes; --bits-map "
                             f"entry {next(r for r in rules if r.mode != 'affine').text()} is "
                             "a microscaling mode: use --quant-method rtn with it")
        if recipe and self.bits != bits_map_mod.RECIPES[recipe][0]:
            raise ValueError(f"--bits-map {recipe} quantizes the other layers at "
                             f"{bits_map_mod.RECIPES[recipe][0]} bits, not bits={self.bits}; drop "
                             "--bits (a recipe sets both widths)")
        object.__setattr__(self, "bits_map", bits_map_mod.canonical(self.bits_map))

    @property
    def name(self):
        extra = (("-emb" if self.quantize_embeddings else "")
                 + ("-head" if self.quantize_head else ""))
        mixed = bits_map_mod.tag(self.bits_map)
        method = "" if self.method == "rtn" else f"-{self.method}"
        int8 = ""
        if self.int8:
            import hashlib

            int8 = "-int8-" + hashlib.sha1(self.int8.encode()).hexdigest()[:6]
        from variants.layer_maps.formats import SCALE_SHORT

        mode = "" if self.quant_mode == "affine" else f"-{self.quant_mode}"
        scale = "" if self.scale_dtype == "float32" else f"-s{SCALE_SHORT[self.scale_dtype]}"
        texts = ""
        if self.embedding_texts and bits_map_mod.UNSEEN in self.bits_map:
            import hashlib
            from pathlib import Path

            try:  # the texts' contents name the variant (an edited file is another variant)
                data = Path(self.embedding_texts).read_bytes()
            except OSError:
                data = self.embedding_texts.encode()
            texts = "-et" + hashlib.sha1(data).hexdigest()[:6]
        return (f"q{self.bits}-g{self.group_size}{extra}" + mode + scale
                + (f"-{mixed}" if mixed else "") + method + int8 + texts)

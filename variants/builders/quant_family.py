"""The quant family (round-to-nearest group-wise quantization): config, flags, ladder. No MLX.

The quantizer itself (``mx.quantize``, native or simulated) is :mod:`variants.builders.quantize`.
"""

from dataclasses import dataclass

from variants.builders.family import BuildInputs, Family

BITS = (2, 3, 4, 6, 8)
GROUP_SIZES = (32, 64, 128)
MODES = ("native", "simulated")


def check_bits(bits, group_size, prefix=""):
    """Raise ValueError unless ``bits`` (None = not quantized) is in ``BITS`` and ``group_size``
    in ``GROUP_SIZES``; ``prefix`` names the family's parameters (``exit_`` -> ``exit_bits``)."""
    if bits is not None and bits not in BITS:
        raise ValueError(f"{prefix}bits={bits} is not supported; choose one of {BITS}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"{prefix}group_size={group_size} is not supported; "
                         f"choose one of {GROUP_SIZES}")


@dataclass(frozen=True)
class QuantConfig:
    """Parameters of one quantized variant (validated on creation)."""

    bits: int = 4
    group_size: int = 64
    quantize_embeddings: bool = False
    quantize_head: bool = False

    def __post_init__(self):
        if self.bits is None:
            raise ValueError(f"bits=None is not supported; choose one of {BITS}")
        check_bits(self.bits, self.group_size)

    @property
    def name(self):
        extra = ("-emb" if self.quantize_embeddings else "") + ("-head" if self.quantize_head else "")
        return f"q{self.bits}-g{self.group_size}{extra}"


PARAMS = ("bits", "group_size", "quantize_embeddings", "quantize_head")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("quant family (--family quant)")
    g.add_argument("--bits", type=int, nargs="+", default=list(BITS), metavar="B",
                   help=f"bit widths to sweep, from {BITS}")
    g.add_argument("--group-size", type=int, default=64,
                   help=f"weights per quantization group, one of {GROUP_SIZES}")
    g.add_argument("--quantize-embeddings", action="store_true",
                   help="also quantize the embedding tables (kept fp32 by default)")
    g.add_argument("--quantize-head", action="store_true",
                   help="also quantize the decision head (kept fp32 by default)")


def ladder(*, bits=BITS, group_size=64, quantize_embeddings=False, quantize_head=False):
    """The variant configs of one sweep: one QuantConfig per bit width (ValueError if bad)."""
    if not bits:
        raise ValueError("no bit widths given; pass e.g. --bits 4 8")
    return [QuantConfig(int(b), group_size, quantize_embeddings, quantize_head)
            for b in dict.fromkeys(bits)]


def run_name(*, group_size=64, **_):
    """Default run-folder suffix for these parameters."""
    return f"g{group_size}"


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.builders.quantize.build` (needs no data)."""
    from variants.builders import quantize

    return quantize.build(reference, config, mode=mode, calibration=inputs.calibration)


FAMILY = Family(name="quant", config=QuantConfig, params=PARAMS, add_arguments=add_arguments,
                ladder=ladder, run_name=run_name, build=build)

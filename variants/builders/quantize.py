"""Group-wise affine weight quantization (MLX ``mx.quantize``), native or simulated.

Each group of ``group_size`` consecutive input weights of a row is stored as ``bits``-bit
integers q with one scale s and one bias b (w ~= s q + b); see MLX's ``mx.quantize`` docs and
mlx-lm's ``convert.py``. Two execution modes:

- ``native``: ``nn.QuantizedLinear`` (``mx.quantized_matmul``): what a deployment runs.
- ``simulated``: the same quantized weights dequantized into dense fp32 ``nn.Linear`` layers;
  same outputs to float round-off, and far faster on MLX's CPU backend, so quality is evaluated
  this way by default.
"""

import copy
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

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


def _is_head(path):
    return path == "head" or path.startswith("head.")


def make_predicate(cfg, skipped):
    """``(path, module) -> bool`` choosing the layers to quantize; appends skips (with the
    reason) to ``skipped``. Input sizes not divisible by the group size are skipped, as are the
    embeddings and the decision head unless ``cfg`` asks for them."""

    def predicate(path, module):
        if isinstance(module, nn.Embedding):
            if not cfg.quantize_embeddings:
                skipped.append((path, "embeddings kept full precision"))
                return False
            in_dims = module.weight.shape[1]
        elif isinstance(module, nn.Linear):
            if _is_head(path) and not cfg.quantize_head:
                skipped.append((path, "decision head kept full precision"))
                return False
            in_dims = module.weight.shape[1]
        else:
            return False
        if in_dims % cfg.group_size:
            skipped.append((path, f"input size {in_dims} not divisible by group size "
                                  f"{cfg.group_size}"))
            return False
        return True

    return predicate


def quantize_module(module, cfg, mode="simulated"):
    """A quantized copy of ``module`` (the input is not modified).

    Parameters
    ----------
    module : mlx.nn.Module
    cfg : QuantConfig
    mode : {'native', 'simulated'}, default='simulated'

    Returns
    -------
    qmodule : mlx.nn.Module
    info : dict
        ``quantized_layers``, ``skipped`` (path, reason), ``bits_per_weight`` (stored bits per
        quantized weight, scales and biases included), ``model_bytes`` (all parameters as stored
        by the native form), ``quantized_params``, ``total_params``.

    Raises
    ------
    ValueError
        Unknown mode, or no layer could be quantized.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; choose one of {MODES}")
    skipped = []
    predicate = make_predicate(cfg, skipped)
    native = copy.deepcopy(module)
    nn.quantize(native, group_size=cfg.group_size, bits=cfg.bits, class_predicate=predicate)
    qlayers = [p for p, m in native.named_modules()
               if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    if not qlayers:
        raise ValueError(f"no layer can be quantized with group_size={cfg.group_size}")
    q_bytes = q_params = 0
    for p, m in native.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            out_dims, packed = m.weight.shape
            q_params += out_dims * packed * 32 // cfg.bits
            q_bytes += m.weight.nbytes + m.scales.nbytes + m.biases.nbytes
    params = tree_flatten(native.parameters())
    total_bytes = sum(v.nbytes for _, v in params)
    dense_params = sum(v.size for _, v in tree_flatten(module.parameters()))
    info = {
        "quantized_layers": len(qlayers),
        "skipped": sorted(set(skipped)),
        "quantized_params": int(q_params),
        "total_params": int(dense_params),
        "bits_per_weight": 8.0 * q_bytes / q_params,
        "model_bytes": int(total_bytes),
        "mode": mode,
    }
    if mode == "native":
        return native, info
    sim = copy.deepcopy(module)
    chosen = set(qlayers)
    for path, m in sim.named_modules():
        if path in chosen:
            w = m.weight
            q, s, b = mx.quantize(w, group_size=cfg.group_size, bits=cfg.bits)
            m.weight = mx.dequantize(q, s, b, group_size=cfg.group_size, bits=cfg.bits).astype(w.dtype)
    mx.eval(sim.parameters())
    return sim, info


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


def build(reference, cfg, mode="simulated", calibration=None):
    """Registry entry: the reference DecisionModel with its module quantized.

    ``calibration`` is unused (round-to-nearest needs no data); kept for the builder signature.
    """
    qmodule, info = quantize_module(reference.module, cfg, mode)
    return reference.replace_module(qmodule), info

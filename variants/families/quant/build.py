"""Group-wise affine weight quantization (MLX ``mx.quantize``), native or simulated.

Each group of ``group_size`` consecutive input weights of a row is stored as ``bits``-bit
integers q with one scale s and one bias b (w ~= s q + b); see MLX's ``mx.quantize`` docs and
mlx-lm's ``convert.py``. Two execution modes:

- ``native``: the weights stay packed (``nn.QuantizedLinear`` parameters, so the model bytes are
  the quantized ones): :class:`variants.runtime.qlinear.CpuQuantizedLinear`, which on the CPU dequantizes
  each weight per call into a temporary fp32 buffer and runs the BLAS GEMM, and elsewhere
  (Metal, CUDA) is ``mx.quantized_matmul``: what a deployment runs.
- ``simulated``: the same quantized weights dequantized once into dense fp32 ``nn.Linear``
  layers (fp32 model bytes); same outputs to float round-off, so quality is evaluated this way
  by default.
"""

import copy

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from variants.runtime import qlinear
from variants.layer_maps import bits_map
from variants.families.quant.config import BITS, GROUP_SIZES, MODES, QuantConfig, check_bits


#: How a skip for an input size that the group size does not divide begins (build.json).
INDIVISIBLE = "input size"


def _is_head(path):
    return path == "head" or path.startswith("head.")


def make_predicate(cfg, skipped, settings=None):
    """``(path, module) -> bool or {"bits", "group_size"}`` choosing the layers to quantize;
    appends skips (with the reason) to ``skipped``. Input sizes not divisible by the group size
    are skipped, as are the embeddings and the decision head unless ``cfg`` asks for them.
    ``settings`` ({path: (bits, group_size)}, :func:`layer_settings`) gives per-layer widths."""

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
        bits, group_size = (settings or {}).get(path, (cfg.bits, cfg.group_size))
        if in_dims % group_size:
            skipped.append((path, f"{INDIVISIBLE} {in_dims} not divisible by group size "
                                  f"{group_size}"))
            return False
        return {"bits": bits, "group_size": group_size} if settings else True

    return predicate


def layer_settings(module, cfg):
    """``{path: (bits, group_size)}`` of every layer ``cfg`` may quantize (Linears, the head
    and embeddings only when asked), from ``cfg.bits_map`` (:func:`bits_map.resolve`); None
    without a map. Raises ValueError (naming ``--bits-map``) for a pattern that matches no
    such layer."""
    if not cfg.bits_map:
        return None
    paths = [p for p, m in module.named_modules()  # (group-size divisibility is checked per
             if isinstance(m, (nn.Linear, nn.Embedding))  # layer, with the map's size)
             and (cfg.quantize_embeddings or not isinstance(m, nn.Embedding))
             and (cfg.quantize_head or not _is_head(p))]
    return bits_map.resolve(cfg.bits_map, sorted(paths), cfg.bits, cfg.group_size)


def check_model(module, cfgs, model=None):
    """Raise ValueError, before anything is written, for a map pattern no layer matches."""
    for cfg in cfgs:
        layer_settings(module, cfg)


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
        ``quantized_layers``, ``skipped`` (path, reason), ``skipped_weights`` ({path: weight
        elements of each skipped layer}), ``indivisible_params`` / ``indivisible_param_share``
        (weight elements of the layers left unquantized because the group size does not divide
        their input size, and their share of all the module's parameters), ``bits_per_weight`` (stored bits per
        quantized weight, scales and biases included), ``model_bytes`` (all parameters as stored
        by the native form), ``quantized_params``, ``total_params``; with a ``bits_map``
        also ``layer_bits`` ({path: [bits, group_size]}). Both sums run over each layer's
        stored arrays (packed weight, scales, biases), so a mixed map counts each layer's
        own width.

    Raises
    ------
    ValueError
        Unknown mode, no layer could be quantized, a ``bits_map`` pattern matches no layer.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; choose one of {MODES}")
    skipped = []
    settings = layer_settings(module, cfg)
    predicate = make_predicate(cfg, skipped, settings)
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
            q_params += out_dims * packed * 32 // m.bits  # m.bits: per layer with a map
            q_bytes += m.weight.nbytes + m.scales.nbytes + m.biases.nbytes
    params = tree_flatten(native.parameters())
    total_bytes = sum(v.nbytes for _, v in params)
    dense_params = sum(v.size for _, v in tree_flatten(module.parameters()))
    skipped = sorted(set(skipped))
    sizes = {p: int(m.weight.size) for p, m in module.named_modules()
             if p in {path for path, _ in skipped}}
    indivisible = sum(sizes[p] for p, why in skipped if why.startswith(INDIVISIBLE))
    info = {
        "quantized_layers": len(qlayers),
        "skipped": skipped,
        "skipped_weights": sizes,
        "indivisible_params": int(indivisible),
        "indivisible_param_share": indivisible / dense_params,
        "quantized_params": int(q_params),
        "total_params": int(dense_params),
        "bits_per_weight": 8.0 * q_bytes / q_params,
        "model_bytes": int(total_bytes),
        "mode": mode,
    }
    if settings:
        info["layer_bits"] = {p: [m.bits, m.group_size] for p, m in native.named_modules()
                              if p in qlayers}
    if mode == "native":
        return qlinear.use_cpu_path(native), info
    sim = copy.deepcopy(module)
    chosen = {p: (m.bits, m.group_size) for p, m in native.named_modules() if p in qlayers}
    for path, m in sim.named_modules():
        if path in chosen:
            w = m.weight
            bits, gs = chosen[path]
            q, s, b = mx.quantize(w, group_size=gs, bits=bits)
            m.weight = mx.dequantize(q, s, b, group_size=gs, bits=bits).astype(w.dtype)
    mx.eval(sim.parameters())
    return sim, info


def build(reference, cfg, mode="simulated", calibration=None):
    """Registry entry: the reference DecisionModel with its module quantized.

    ``calibration`` is unused (round-to-nearest needs no data); kept for the builder signature.
    """
    qmodule, info = quantize_module(reference.module, cfg, mode)
    return reference.replace_module(qmodule), info

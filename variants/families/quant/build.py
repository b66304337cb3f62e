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
import re

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from variants.models import heads as heads_mod
from variants.runtime import qlinear
from variants.layer_maps import bits_map
from variants.families.quant.config import BITS, GROUP_SIZES, MODES, QuantConfig, check_bits


#: How a skip for an input size that the group size does not divide begins (build.json).
INDIVISIBLE = "input size"


def make_predicate(cfg, skipped, settings=None, heads=("head",), head_reason=heads_mod.DEFAULT):
    """``(path, module) -> bool or {"bits", "group_size"}`` choosing the layers to quantize;
    appends skips (with the reason) to ``skipped``. Input sizes not divisible by the group size
    are skipped, as are the embeddings and the decision head unless ``cfg`` asks for them.
    ``settings`` ({path: (bits, group_size)}, :func:`layer_settings`) gives per-layer widths;
    ``heads`` are the decision head's module paths (:func:`variants.models.heads.head_paths`), kept
    (with ``head_reason``) unless ``cfg.quantize_head``."""

    def predicate(path, module):
        if isinstance(module, (nn.Embedding, nn.Linear)) and heads_mod.in_head(path, heads):
            if not cfg.quantize_head:
                skipped.append((path, head_reason))
                return False
        if isinstance(module, nn.Embedding):
            if not cfg.quantize_embeddings and not heads_mod.in_head(path, heads) and \
                    path not in (settings or {}):
                skipped.append((path, "embeddings kept full precision"))
                return False
            in_dims = module.weight.shape[1]
        elif isinstance(module, nn.Linear):
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


def layer_settings(module, cfg, heads=("head",)):
    """``{path: (bits, group_size)}`` of every layer ``cfg`` may quantize (Linears; the head
    only when asked; the embedding tables when asked or when a map entry names them), from
    ``cfg.bits_map`` (:func:`bits_map.resolve`); None
    without a map. Raises ValueError (naming ``--bits-map``) for a pattern that matches no
    such layer."""
    if not cfg.bits_map:
        return None
    _, rules = bits_map.parse(cfg.bits_map)
    paths = [p for p, m in module.named_modules()  # (group-size divisibility is checked per
             if isinstance(m, (nn.Linear, nn.Embedding))  # layer, with the map's size)
             and (cfg.quantize_embeddings or not isinstance(m, nn.Embedding)
                  or heads_mod.in_head(p, heads)
                  # an embedding table a map entry names is quantized at that entry's width
                  or any(re.search(r.pattern, p) for r in rules))
             and (cfg.quantize_head or not heads_mod.in_head(p, heads))]
    return bits_map.resolve(cfg.bits_map, sorted(paths), cfg.bits, cfg.group_size)


def check_model(module, cfgs, model=None):
    """Raise ValueError, before anything is written, for a layer already quantized (a
    checkpoint folder written by ``variants export``: its packed weights cannot be quantized
    again) or a map pattern no layer matches."""
    qlinear.refuse_packed(module, "quant")
    heads, _ = heads_mod.head_paths(module, model)
    for cfg in cfgs:
        layer_settings(module, cfg, heads)


def quantize_module(module, cfg, mode="simulated", model=None):
    """A quantized copy of ``module`` (the input is not modified).

    Parameters
    ----------
    module : mlx.nn.Module
    cfg : QuantConfig
    mode : {'native', 'simulated'}, default='simulated'
    model : variants.models.decision.DecisionModel, optional
        Whose ``head_modules`` declares the head (:func:`variants.models.heads.head_paths`).

    Returns
    -------
    qmodule : mlx.nn.Module
    info : dict
        ``quantized_layers``, ``skipped`` (path, reason), ``skipped_weights`` ({path: weight
        elements of each skipped layer}), ``indivisible_params`` / ``indivisible_param_share``
        (weight elements of the layers left unquantized because the group size does not divide
        their input size, and their share of all the module's parameters), ``bits_per_weight`` (stored bits per
        quantized weight, scales and biases included), ``model_bytes`` (all parameters as stored
        by the native form), ``quantized_params``, ``total_params``, ``head`` (the head's
        paths and why they are the head, ``quantized``: whether it was); with a ``bits_map``
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
    heads, head_reason = heads_mod.head_paths(module, model)
    settings = layer_settings(module, cfg, heads)
    predicate = make_predicate(cfg, skipped, settings, heads, head_reason)
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
        "head": {"paths": list(heads), "why": head_reason.split(" kept")[0],
                 "quantized": bool(cfg.quantize_head)},
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
    qmodule, info = quantize_module(reference.module, cfg, mode, model=reference)
    return reference.replace_module(qmodule), info

"""Mixed quant + W8A8: the quant family's variant with some Linears on integer GEMMs.

``QuantConfig.int8`` (``--int8-layers REGEX``, searched in Linear paths) names the Linears that
run as :class:`variants.runtime.int8_linear.Int8Linear` (int8 weights per output channel, per-token
int8 activations, int32 accumulation); every other quantizable layer is quantized as the config
says (its ``--bits`` / ``--bits-map`` and ``--quant-method``). The quant build runs first on the
whole reference, then each matching Linear is replaced by an Int8Linear made from the
reference's own fp32 Linear (never from the quantized weights), so the W8A8 layers are exactly
the w8a8 family's. ``model_bytes`` counts the int8 layers as stored (int8 weights, fp32
per-channel scales, int32 column sums, the bias) instead of their packed quantized form.
This is how ``variants search --w8a8`` re-runs a winner as a sweep variant.
"""

import re
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn


def int8_paths(module, pattern):
    """Paths of the ``nn.Linear`` layers of ``module`` whose path matches ``pattern``.

    Raises ValueError (one line naming ``--int8-layers``) when none does."""
    pat = re.compile(pattern)
    paths = sorted(p for p, m in module.named_modules()
                   if type(m) is nn.Linear and pat.search(p))
    if not paths:
        raise ValueError(f"--int8-layers {pattern!r} matches no Linear of this model (paths "
                         "look like encoder.layers.0.attention.value); fix the pattern")
    return paths


def _stored_bytes(m):
    """Bytes of a quantized layer as the native form stores it (packed weight, scales,
    biases, an AWQ input scale), bias excluded."""
    inner = getattr(m, "linear", m)  # an AWQ InputScaledLinear wraps the packed Linear
    n = sum(inner[k].nbytes for k in ("weight", "scales", "biases") if k in inner)
    return n + (m["input_scale"].nbytes if "input_scale" in m else 0)


def build(reference, cfg, inputs, mode="simulated"):
    """``(variant, info)``: the quant build of ``cfg`` without ``int8``, then the Linears
    ``cfg.int8`` matches replaced by :class:`~variants.runtime.int8_linear.Int8Linear` (native: the
    compiled oneDNN op where it is available). info gains ``int8_layers`` (paths),
    ``int8_kernel`` and ``int8`` ({scheme, isa} of the compiled GEMM, None simulated); ``model_bytes`` counts them as stored. Raises ValueError for a pattern
    that matches no Linear."""
    from variants.arch import activations
    from variants.families.quant import build as quantize
    from variants.families.quant.row_use import row_use_of
    from variants.families.quant.dispatch import build_weights
    from variants.families.w8a8.build import kernel_name
    from variants.runtime.int8_linear import Int8Linear, int8_record

    paths = int8_paths(reference.module, cfg.int8)
    from variants.families.w8a8.build import MAX_IN

    mods0 = dict(reference.module.named_modules())
    wide = [p for p in paths if mods0[p].weight.shape[1] > MAX_IN]
    if wide:
        raise ValueError(f"--int8-layers: {wide[0]} has {mods0[wide[0]].weight.shape[1]} inputs; "
                         f"int8 sums are exact in int32 up to {MAX_IN}; leave it out of the "
                         "pattern")
    base = replace(cfg, int8="")
    if set(activations.target_linears(reference.module)) <= set(paths):
        # a learned method learns the encoder Linears only: all in int8, nothing to learn
        base = replace(base, method="rtn")
    variant, info = build_weights(reference, base, inputs, mode)
    ref_mods = dict(reference.module.named_modules())
    module = variant.module
    mods = dict(module.named_modules())
    # the packed size of each replaced layer: from the native form when the variant is dense
    packed = mods if mode == "native" else dict(quantize.quantize_module(
        reference.module, replace(cfg, int8="", method="rtn"), "native", model=reference,
        row_use=row_use_of(reference, inputs.fit, cfg))[0].named_modules())
    delta = 0
    for p in paths:
        q = Int8Linear(ref_mods[p], native=mode == "native")
        new = sum(q[k].nbytes for k in ("wq", "w_scale", "colsum"))
        old = _stored_bytes(packed[p]) if p in packed and not isinstance(
            packed[p], nn.Linear) else ref_mods[p].weight.nbytes
        delta += new - old
        activations.set_module(module, p, q)
    mx.eval(module.parameters())
    info = dict(info, int8_layers=paths, int8_kernel=kernel_name(module),
                # how the integer GEMM is exact on this CPU (int8_linear.scheme), None simulated
                int8=int8_record(kernel_name(module)),
                model_bytes=int(info["model_bytes"] + delta))
    return variant, info

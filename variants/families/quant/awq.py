"""AWQ: activation-aware per-input-channel scales, then a clipping search per group.

Lin, Tang, Tang, Yang, Chen, Wang, Xiao, Dang, Gan & Han, "AWQ: Activation-aware Weight
Quantization for LLM Compression and Acceleration" (MLSys 2024), §3.2, as in the authors'
``auto_scale`` / ``auto_clip``:

1. scale search: s = m^α / sqrt(max(m^α) · min(m^α)) with m = E|x| per input channel (the fit
   split's mean absolute activation, :mod:`variants.arch.activations`), α on the grid
   0, 1/grid, ..., (grid - 1)/grid; the layer is quantized as Ŵ = Q(W diag(s)) diag(s)⁻¹ and α
   minimises the layer's output error tr((W − Ŵ) G (W − Ŵ)ᵀ) over the fit tokens (G = Σ x xᵀ:
   exact, no activation samples kept). α = 0 is round-to-nearest, so the chosen scales never
   do worse than RTN on these activations;
2. clip search: per (row, group) of W diag(s), the range is clipped to ±r · max|w| for r in
   1, 1 − 1/clip_grid, ..., ``min_clip``, choosing r by the group's own output error (its
   diagonal block of G in the scaled input space); kept only if the whole layer's error falls.

The packed format stores Q(W diag(s)) (codes, scales, biases by MLX's affine rule); the input
must be divided by s before the packed matmul. In post-LayerNorm BERT the LayerNorm output is
also the residual stream, so 1/s cannot be folded into it (AWQ folds into the preceding norm of
pre-LN LLMs); it is applied as its own per-channel multiply (n_in multiplies per token: 1/n_out
of the layer's multiply-adds). Pure NumPy in float64/float32; no MLX import.
"""

import numpy as np

from variants.families.quant import affine_codes
from variants.families.quant.gptq import output_error

GRID = 20
CLIP_GRID = 20
MIN_CLIP = 0.5


def _quantized(Ws, bits, group_size, w_min=None, w_max=None):
    codes, scales, biases = affine_codes.quantize(Ws, bits, group_size, w_min, w_max)
    return codes, scales, biases, affine_codes.dequantize(codes, scales, biases, group_size)


def channel_scales(mean_abs, alpha):
    """(n,) float64 AWQ scales m^α normalised by sqrt(max · min) (m clamped at 1e-4 first,
    as the reference's ``clamp(min=1e-4)``)."""
    s = np.maximum(np.asarray(mean_abs, np.float64), 1e-4) ** alpha
    return s / np.sqrt(s.max() * s.min())


def quantize(W, G, mean_abs, bits, group_size, *, grid=GRID, clip_grid=CLIP_GRID,
             min_clip=MIN_CLIP):
    """AWQ of one Linear weight.

    Parameters
    ----------
    W : (o, n) float — the weight (out × in)
    G : (n, n) float64 — Σ x xᵀ over the fit tokens (any positive multiple)
    mean_abs : (n,) float64 — E|x| per input channel
    bits, group_size : int

    Returns
    -------
    codes : (o, n) uint8 ; scales, biases : (o, n / group_size) float32 — of W diag(s)
    input_scale : (n,) float32 — 1/s, multiplied into the input (all ones: plain RTN)
    facts : dict — ``alpha``, ``clipped_groups`` (share of groups clipped), ``error_rtn``,
        ``error`` (tr(ΔW G ΔWᵀ), summed squared output error over the fit tokens)
    """
    W = np.asarray(W, np.float32)
    G = np.asarray(G, np.float64)
    _, _, _, deq0 = _quantized(W, bits, group_size)
    err_rtn = output_error(W, deq0, G)
    best = (err_rtn, 0.0, np.ones(W.shape[1]))
    for k in range(1, grid):
        s = channel_scales(mean_abs, k / grid)
        s32 = s.astype(np.float32)
        _, _, _, deq = _quantized((W * s32).astype(np.float32), bits, group_size)
        err = output_error(W, deq * (1 / s32).astype(np.float32), G)
        if err < best[0]:
            best = (err, k / grid, s)
    err, alpha, s = best
    s32 = s.astype(np.float32)
    inv = (1 / s32).astype(np.float32)  # what the layer stores and multiplies the input by
    Ws = (W * s32).astype(np.float32)
    codes, scales, biases, deq = _quantized(Ws, bits, group_size)
    err = output_error(W, deq * inv, G)

    # clipping search: per (row, group), in the scaled input space x / s
    Gs = G / np.outer(s32, s32)
    ng = W.shape[1] // group_size
    blocks = np.stack([Gs[g * group_size:(g + 1) * group_size, g * group_size:(g + 1) * group_size]
                       for g in range(ng)])  # (ng, gs, gs)
    wg = affine_codes.grouped(Ws, group_size)
    lo, hi, amax = wg.min(-1), wg.max(-1), np.abs(wg).max(-1)
    best_e = best_lo = best_hi = None
    for j in range(int(round((1 - min_clip) * clip_grid)) + 1):
        r = 1.0 - j / clip_grid
        c_lo = np.maximum(lo, -r * amax).astype(np.float32)
        c_hi = np.minimum(hi, r * amax).astype(np.float32)
        _, _, _, dq = _quantized(Ws, bits, group_size, c_lo, c_hi)
        d = affine_codes.grouped(Ws - dq, group_size).astype(np.float64)
        e = np.einsum("rgi,gij,rgj->rg", d, blocks, d)
        if best_e is None:
            best_e, best_lo, best_hi = e, c_lo, c_hi
        else:
            better = e < best_e
            best_e = np.where(better, e, best_e)
            best_lo = np.where(better, c_lo, best_lo)
            best_hi = np.where(better, c_hi, best_hi)
    c_codes, c_scales, c_biases, c_deq = _quantized(Ws, bits, group_size, best_lo, best_hi)
    c_err = output_error(W, c_deq * inv, G)
    clipped = 0.0
    if c_err < err:
        codes, scales, biases, err = c_codes, c_scales, c_biases, c_err
        clipped = float(np.mean((best_lo != lo) | (best_hi != hi)))
    facts = {"alpha": alpha, "clipped_groups": clipped, "error_rtn": err_rtn, "error": err}
    return codes, scales, biases, inv, facts


def quantize_gptq(W, G, mean_abs, bits, group_size, **gptq_settings):
    """AWQ's channel scales, then GPTQ's codes: the exponent α of :func:`quantize` (its scale
    search against round-to-nearest), then :func:`variants.families.quant.gptq.quantize` of
    W diag(s) on the scaled inputs' Gram matrix G / (s sᵀ) (no clipping search: GPTQ's error
    compensation replaces it). Shapes and returns as :func:`quantize` (``facts``: ``alpha``);
    ``gptq_settings`` go to GPTQ (``damping``, ``block_size``, ``act_order``, ``where``)."""
    from variants.families.quant import gptq

    W = np.asarray(W, np.float32)
    _, _, _, inv, facts = quantize(W, G, mean_abs, bits, group_size)
    if not facts["alpha"]:
        inv = np.ones(W.shape[1], np.float32)
    s32 = (1 / inv).astype(np.float32)
    Gs = np.asarray(G, np.float64) / np.outer(s32, s32)
    codes, scales, biases = gptq.quantize((W * s32).astype(np.float32), Gs, bits, group_size,
                                          **gptq_settings)
    deq = affine_codes.dequantize(codes, scales, biases, group_size) * inv
    return codes, scales, biases, inv, {"alpha": facts["alpha"],
                                        "error": output_error(W, deq, G)}

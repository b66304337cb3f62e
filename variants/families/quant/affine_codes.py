"""MLX's affine group quantization in NumPy: the scale/bias rule, the codes and the packing.

The learned quantizers (GPTQ, AWQ, distilled scales) choose codes, scales and biases themselves
and must write exactly what ``mx.quantize`` writes, so that ``mx.dequantize``, the packed
``nn.QuantizedLinear``, the compiled CPU kernel and export read them unchanged:

- per group of ``group_size`` consecutive input weights of a row, ``w ~= scale * q + bias`` with
  integer codes ``0 <= q <= 2^bits - 1``;
- the rule (MLX ``mlx/backend/cpu/quantized.cpp``, ``quantize``): with n = 2^bits - 1, the
  edge of larger magnitude (min if |min| > |max|, else max) is put exactly on an integer code:
  ``s = ±max((max - min) / n, 1e-7)`` (positive when the edge is the min), ``q0 = rint(edge / s)``
  and, when q0 != 0, ``scale = edge / q0``, ``bias = edge`` (so 0 is exact); else bias 0. The
  scale is negative when the edge is the max;
- codes ``q = clip(rint((w - bias) / scale), 0, n)``, computed in float32;
- packing: the codes of a row as one little-endian bit stream (code i in bits [i b, (i + 1) b),
  low bits first), read as uint32 words (3 and 6 bits: 8 and 4 codes per 3 bytes).

A clipped range (AWQ and GPTQ's clipping search) is the same rule on [clip_min, clip_max].
"""

import numpy as np

EPS = 1e-7


def group_params(w_min, w_max, bits):
    """(scales, biases) float32 of MLX's affine rule for groups with these ranges.

    Parameters
    ----------
    w_min, w_max : array-like, same shape, float
        Each group's smallest and largest weight (or a clipped range, min <= max).
    bits : int

    Returns
    -------
    scales, biases : np.ndarray float32, the shape of ``w_min``
    """
    w_min = np.asarray(w_min, np.float32)
    w_max = np.asarray(w_max, np.float32)
    n_bins = np.float32(2 ** bits - 1)
    mask = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, np.float32(EPS)).astype(np.float32)
    scale = np.where(mask, scale, -scale).astype(np.float32)
    edge = np.where(mask, w_min, w_max).astype(np.float32)
    q0 = np.rint(edge / scale).astype(np.float32)
    nz = q0 != 0
    scales = np.where(nz, edge / np.where(nz, q0, 1), scale).astype(np.float32)
    biases = np.where(nz, edge, 0).astype(np.float32)
    return scales, biases


def grouped(w, group_size):
    """(o, n) -> (o, n / group_size, group_size) view (ValueError if n is not a multiple)."""
    w = np.asarray(w)
    o, n = w.shape
    if n % group_size:
        raise ValueError(f"input size {n} is not a multiple of the group size {group_size}")
    return w.reshape(o, n // group_size, group_size)


def encode(w, scales, biases, bits, group_size):
    """(o, n) uint8 codes of ``w`` (o, n) for per-group ``scales``/``biases`` (o, n / g),
    rounded and clipped to [0, 2^bits - 1] in float32 as ``mx.quantize`` does."""
    wg = grouped(np.asarray(w, np.float32), group_size)
    q = np.rint((wg - biases[..., None]) / scales[..., None])
    return np.clip(q, 0, 2 ** bits - 1).astype(np.uint8).reshape(np.shape(w))


def quantize(w, bits, group_size, w_min=None, w_max=None):
    """MLX's round-to-nearest: (codes (o, n) uint8, scales, biases (o, n / g) float32).

    ``w_min``/``w_max`` (o, n / g) replace the groups' own ranges (a clipped range)."""
    wg = grouped(np.asarray(w, np.float32), group_size)
    lo = wg.min(axis=-1) if w_min is None else w_min
    hi = wg.max(axis=-1) if w_max is None else w_max
    scales, biases = group_params(lo, hi, bits)
    return encode(w, scales, biases, bits, group_size), scales, biases


def dequantize(codes, scales, biases, group_size):
    """(o, n) float32 ``scale * q + bias`` (what ``mx.dequantize`` computes)."""
    q = grouped(np.asarray(codes, np.float32), group_size)
    return (scales[..., None].astype(np.float32) * q
            + biases[..., None].astype(np.float32)).reshape(np.shape(codes)).astype(np.float32)


def pack(codes, bits):
    """(o, n) codes -> (o, n * bits / 32) uint32: ``mx.quantize``'s packed weight.

    Raises ValueError when a code does not fit in ``bits`` or a row's bits are not whole words.
    """
    codes = np.asarray(codes)
    o, n = codes.shape
    if (n * bits) % 32:
        raise ValueError(f"{n} codes of {bits} bits are not a whole number of 32-bit words")
    if codes.size and int(codes.max()) >= 2 ** bits:
        raise ValueError(f"a code {int(codes.max())} does not fit in {bits} bits")
    bitplanes = (codes.astype(np.uint32)[..., None] >> np.arange(bits, dtype=np.uint32)) & 1
    stream = np.packbits(bitplanes.astype(np.uint8).reshape(o, n * bits), axis=1,
                         bitorder="little")
    return np.ascontiguousarray(stream).view("<u4").astype(np.uint32)


def unpack(packed, bits, n):
    """Inverse of :func:`pack`: (o, n) uint8 codes of a packed (o, n * bits / 32) weight."""
    packed = np.ascontiguousarray(np.asarray(packed, np.uint32))
    o = packed.shape[0]
    stream = np.unpackbits(packed.view(np.uint8).reshape(o, -1), axis=1, bitorder="little")
    planes = stream[:, :n * bits].reshape(o, n, bits).astype(np.uint32)
    return (planes << np.arange(bits, dtype=np.uint32)).sum(axis=-1).astype(np.uint8)

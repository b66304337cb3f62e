"""ONNX nodes that read MLX's stored quantized arrays back as float32, exactly as
:func:`variants.layer_maps.formats.dequantize` does (the one round trip every path of the
suite follows).

The stored arrays enter the graph as they are, bit for bit: the packed codes (MLX's uint32
words) as their little-endian bytes (uint8), the scales and biases in their stored dtype
(float32, float16, bfloat16; the microscaling modes' uint8 scales). The nodes then

- unpack the codes: MLX packs 2-, 4- and 8-bit codes in single bytes, 3- and 6-bit codes in
  3-byte chunks (8 and 4 values), 5-bit codes in 5-byte chunks (8 values), little-endian from
  the low bits (:mod:`variants.runtime.qlinear`); the graph takes each byte (or chunk) as an
  int64 and extracts value ``k`` as ``(word / 2^(k·bits)) mod 2^bits``;
- affine: ``float32(scale) * q + float32(bias)`` per group of ``group_size`` (a Mul then an
  Add, both float32, as MLX computes it);
- ``mxfp4`` / ``nvfp4``: each 4-bit code through the FP4 E2M1 table, ``mxfp8``: each byte
  through the FP8 E4M3 table (OCP Microscaling Formats v1.0), times the group's scale through
  its table (E8M0 ``2^(e-127)`` for mxfp4 / mxfp8, E4M3 for nvfp4): products of a few mantissa
  bits, exact in float32, as MLX's ``mx.dequantize(..., dtype=float32)``.

On constant codes (a Linear's weight) ONNX Runtime folds all of it into one float32
initializer when the session loads; on gathered rows (an embedding table) it runs per call.
"""

import numpy as np

from variants.layer_maps import formats as F
from variants.onnx.builder import FLOAT, INT32, INT64

#: bytes and values per packed chunk of MLX's affine packing (variants.runtime.qlinear)
CHUNKS = {1: (1, 8), 2: (1, 4), 3: (3, 8), 4: (1, 2), 5: (5, 8), 6: (3, 4), 8: (1, 1)}


def _fp4_e2m1():
    mag = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
    return np.concatenate([mag, -mag]).astype(np.float32)


def _fp8_e4m3():
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e, m = (codes >> 3) & 0xF, codes & 0x7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    v = np.where((codes & 0x7F) == 0x7F, np.nan, v)  # E4M3FN: S.1111.111 is NaN
    return (sign * v).astype(np.float32)


def _e8m0():
    e = np.arange(256, dtype=np.float64)
    v = np.ldexp(1.0, (e - 127).astype(int))
    v[255] = np.nan
    return v.astype(np.float32)


#: element and scale tables of the microscaling modes: (element table, scale table)
MODE_TABLES = {"mxfp4": (_fp4_e2m1, _e8m0), "mxfp8": (_fp8_e4m3, _e8m0),
               "nvfp4": (_fp4_e2m1, _fp8_e4m3)}


def code_bytes(codes):
    """MLX's packed codes (rows, words) uint32 (an ``mx.array`` or NumPy array) as their
    bytes: (rows, 4 · words) uint8, little-endian."""
    a = np.ascontiguousarray(np.asarray(codes))
    if a.dtype != np.uint32:
        raise ValueError(f"packed codes are {a.dtype}, not uint32; pass the quantized layer's "
                         "weight as mx.quantize stores it")
    return a.astype("<u4").view(np.uint8).reshape(a.shape[0], -1)


def stored(array):
    """A stored scale / bias array as NumPy in its own dtype (bfloat16 kept as its bits: an
    ``ml_dtypes`` bfloat16 array that ``onnx.numpy_helper`` writes as BFLOAT16)."""
    import mlx.core as mx

    if isinstance(array, mx.array) and array.dtype == mx.bfloat16:
        import ml_dtypes

        bits = np.array(array.view(mx.uint16))
        return bits.view(ml_dtypes.bfloat16)
    return np.asarray(array)


def unpack_codes(g, packed, bits, hint):
    """Nodes unpacking ``packed`` ((R, nbytes) uint8 tensor name: MLX's code bytes) into the
    (R, nbytes · 8 / bits) int64 codes, in order. ``bits`` in :data:`CHUNKS`; raises
    ValueError otherwise."""
    if bits not in CHUNKS:
        raise ValueError(f"{hint}: {bits}-bit codes have no unpacking here; the widths are "
                         f"{sorted(CHUNKS)}")
    nb, nv = CHUNKS[bits]
    b = g.op("Cast", [packed], f"{hint}/bytes_i64", to=INT64)
    if nb == 1:
        word = g.op("Unsqueeze", [b, g.ints([-1])], f"{hint}/word")  # (R, nbytes, 1)
    else:  # nb bytes -> one little-endian word
        chunks = g.op("Reshape", [b, g.ints([0, -1, nb])], f"{hint}/chunks")
        place = g.const(np.array([1 << (8 * i) for i in range(nb)], np.int64),
                        f"byte_place_{nb}", share=True)
        word = g.op("ReduceSum", [g.op("Mul", [chunks, place], f"{hint}/placed"),
                                  g.ints([-1])], f"{hint}/word", keepdims=1)
    if nv == 1:
        vals = word
    else:
        step = g.const(np.array([1 << (k * bits) for k in range(nv)], np.int64),
                       f"code_step_{bits}", share=True)
        vals = g.op("Mod", [g.op("Div", [word, step], f"{hint}/shifted"),
                            g.scalar(1 << bits, np.int64)], f"{hint}/vals")
    return g.op("Reshape", [vals, g.ints([0, -1])], f"{hint}/codes")


def _groups(g, x, group_size, hint):
    return g.op("Reshape", [x, g.ints([0, -1, group_size])], f"{hint}/groups")


def _per_group(g, s, hint):
    return g.op("Unsqueeze", [s, g.ints([-1])], hint)


def as_float(g, name, hint):
    """``name`` (a float32, float16 or bfloat16 tensor) widened to float32 (exact)."""
    return g.op("Cast", [name], hint, to=FLOAT)


def dequantize(g, packed, scales, biases, fmt, hint):
    """Nodes for the (R, K) float32 values of stored rows, as
    :func:`variants.layer_maps.formats.dequantize` computes them.

    ``packed``: (R, K · bits / 8) uint8 tensor name (:func:`code_bytes`); ``scales``: (R, K /
    group_size) tensor name in the stored dtype; ``biases``: likewise (affine) or None;
    ``fmt``: a :class:`variants.layer_maps.formats.Format`. Raises ValueError for a mode or
    width it does not know."""
    q = unpack_codes(g, packed, fmt.bits, hint)
    if fmt.mode == "affine":
        if biases is None:
            raise ValueError(f"{hint}: affine codes without biases; pass the layer's biases")
        qf = _groups(g, g.op("Cast", [q], f"{hint}/q", to=FLOAT), fmt.group_size, hint)
        s = _per_group(g, as_float(g, scales, f"{hint}/scales_f32"), f"{hint}/scale")
        b = _per_group(g, as_float(g, biases, f"{hint}/biases_f32"), f"{hint}/bias")
        w = g.op("Add", [g.op("Mul", [qf, s], f"{hint}/sq"), b], f"{hint}/w_groups")
    elif fmt.mode in MODE_TABLES:
        elem_table, scale_table = MODE_TABLES[fmt.mode]
        vals = g.op("Gather", [g.const(elem_table(), f"{fmt.mode}_elements", share=True), q],
                    f"{hint}/elements")
        sc = g.op("Gather", [g.const(scale_table(), f"{fmt.mode}_scales", share=True),
                             g.op("Cast", [scales], f"{hint}/scale_codes", to=INT32)],
                  f"{hint}/scales_f32")
        w = g.op("Mul", [_groups(g, vals, fmt.group_size, hint),
                         _per_group(g, sc, f"{hint}/scale")], f"{hint}/w_groups")
    else:
        raise ValueError(f"{hint}: quantization mode {fmt.mode!r} has no ONNX form here; the "
                         f"modes are {', '.join(F.MODES)}")
    return g.op("Reshape", [w, g.ints([0, -1])], f"{hint}/w")


def stored_weight(g, codes, scales, biases, fmt, hint):
    """Initializers of one quantized weight (MLX's stored arrays: ``codes`` uint32 (N, words),
    ``scales``, ``biases`` or None) and the nodes dequantizing them: returns the (N, K) float32
    tensor name (folded to a constant when ONNX Runtime loads the model)."""
    packed = g.const(code_bytes(codes), f"{hint}.codes")
    s = g.const(stored(scales), f"{hint}.scales")
    b = None if biases is None else g.const(stored(biases), f"{hint}.biases")
    return dequantize(g, packed, s, b, fmt, hint)


def format_of(module):
    """The :class:`variants.layer_maps.formats.Format` a quantized module (a Linear or a table:
    ``bits``, ``group_size``, ``mode``, ``scales``) stores: its scale dtype read from the
    ``scales`` array (affine only; the microscaling modes' scales are their own codes)."""
    import mlx.core as mx

    mode = getattr(module, "mode", "affine")
    scale_dtype = {mx.float16: "float16", mx.bfloat16: "bfloat16"}.get(
        module["scales"].dtype, "float32") if mode == "affine" else "float32"
    return F.Format(module.bits, module.group_size, mode, scale_dtype)


"""How one tensor is stored: the quantization mode, width, group size and scale precision, and
the one definition of its round trip that every path (simulated build, sensitivity, native
kernels, export) follows.

A *format* is ``Format(bits, group_size, mode, scale_dtype)``:

- ``mode="affine"`` (MLX's ``mx.quantize`` default): ``bits`` in (2, 3, 4, 6, 8), groups of
  ``group_size`` consecutive input weights of a row with one scale and one bias each
  (``w ~= scale * q + bias``); the scales and biases are computed in float32 by
  ``mx.quantize`` and then stored as ``scale_dtype`` (``float32``, ``float16``, ``bfloat16``:
  mlx-lm stores the dtype of the weights it quantizes, half precision for its models). The
  dequantized weight is ``float32(scale) * q + float32(bias)`` in float32 (MLX's own
  ``mx.dequantize`` on half-precision scales computes in half precision: 1e-4 away at fp16, so
  the simulated path casts the scales first, as our compiled kernels do);
- ``mode="mxfp4"``, ``"mxfp8"`` (OCP Microscaling Formats v1.0: FP4 E2M1 / FP8 E4M3 elements,
  one shared E8M0 power-of-two scale per 32 weights, no bias) and ``"nvfp4"`` (FP4 E2M1, one
  FP8 E4M3 scale per 16 weights), as MLX 0.32 defines them (``mx.quantize(..., mode=...)``); the
  width and group size are the mode's, the scale dtype is the mode's 8-bit one.

Stored bits per weight: ``bits + 8 * (scale bytes + bias bytes) / group_size`` — affine 4-bit g64
with fp32 scales 5.0, with fp16 scales 4.5 (mlx-lm's figure); ``mxfp4`` 4.25, ``nvfp4`` 4.5,
``mxfp8`` 8.25 (:func:`bits_per_weight`, checked against the arrays ``mx.quantize`` returns).
"""

from typing import NamedTuple

MODES = ("affine", "mxfp4", "mxfp8", "nvfp4")
#: the microscaling modes' (bits, group size), fixed by the format
MX_SHAPE = {"mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}
SCALE_DTYPES = ("float32", "float16", "bfloat16")
#: short names in variant names and --bits-map entries
SCALE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_SCALE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class Format(NamedTuple):
    """One tensor's storage: ``bits``, ``group_size``, ``mode`` (:data:`MODES`),
    ``scale_dtype`` (:data:`SCALE_DTYPES`; the microscaling modes store their own 8-bit
    scales and ignore it)."""

    bits: int
    group_size: int
    mode: str = "affine"
    scale_dtype: str = "float32"

    @property
    def token(self):
        """The option's name in the search and in ``--bits-map`` values: the width (``6``) for
        affine, the mode's name otherwise."""
        return self.bits if self.mode == "affine" else self.mode


def check_mode(mode, flag="--quant-mode"):
    """Raise ValueError (one line naming ``flag`` and the choices) for an unknown mode."""
    if mode not in MODES:
        raise ValueError(f"{flag} {mode!r} is not known; choose one of {' '.join(MODES)}")


def check_scale_dtype(dtype, flag="--scale-dtype"):
    """Raise ValueError (one line naming ``flag`` and the choices) for an unknown dtype."""
    if dtype not in SCALE_DTYPES:
        raise ValueError(f"{flag} {dtype!r} is not supported; choose one of "
                         f"{' '.join(SCALE_DTYPES)}")


def of(token, group_size, scale_dtype="float32"):
    """The :class:`Format` of a search option / map value: an int width (affine at
    ``group_size``, ``scale_dtype``) or a mode name (its own width and group size)."""
    if isinstance(token, str) and token in MX_SHAPE:
        bits, gs = MX_SHAPE[token]
        return Format(bits, gs, token, "float32")
    return Format(int(token), int(group_size), "affine", scale_dtype)


def bits_per_weight(fmt):
    """Stored bits per weight of ``fmt`` (module docstring), codes, scales and biases."""
    if fmt.mode != "affine":
        return fmt.bits + 8.0 / fmt.group_size
    return fmt.bits + 8.0 * 2 * _SCALE_BYTES[fmt.scale_dtype] / fmt.group_size


def stored_bytes(shape, fmt):
    """Bytes of a (rows, cols) tensor stored in ``fmt``: packed codes (whole uint32 words per
    row), scales and biases. ValueError when ``group_size`` does not divide ``cols``."""
    rows, cols = int(shape[0]), int(shape[1])
    if cols % fmt.group_size:
        raise ValueError(f"input size {cols} is not divisible by group size {fmt.group_size}")
    groups = cols // fmt.group_size
    codes = rows * (cols * fmt.bits // 32) * 4
    if fmt.mode != "affine":
        return codes + rows * groups
    return codes + 2 * rows * groups * _SCALE_BYTES[fmt.scale_dtype]


def _dtype(name):
    import mlx.core as mx

    return getattr(mx, name)


def quantize(w, fmt):
    """``(codes, scales, biases)`` of ``w`` (rows, cols) as stored in ``fmt``: MLX's
    ``mx.quantize`` in float32, the affine scales and biases then cast to ``fmt.scale_dtype``;
    ``biases`` None for the microscaling modes."""
    import mlx.core as mx

    if fmt.mode != "affine":
        q, s = mx.quantize(w, group_size=fmt.group_size, bits=fmt.bits, mode=fmt.mode)
        return q, s, None
    q, s, b = mx.quantize(w.astype(mx.float32), group_size=fmt.group_size, bits=fmt.bits)
    if fmt.scale_dtype != "float32":
        s, b = s.astype(_dtype(fmt.scale_dtype)), b.astype(_dtype(fmt.scale_dtype))
    return q, s, b


def dequantize(codes, scales, biases, fmt):
    """The float32 (rows, cols) weight of stored arrays: ``float32(scale) * q + float32(bias)``
    for affine (module docstring), MLX's ``mx.dequantize`` for the microscaling modes."""
    import mlx.core as mx

    if fmt.mode != "affine":
        return mx.dequantize(codes, scales, None, group_size=fmt.group_size, bits=fmt.bits,
                             mode=fmt.mode, dtype=mx.float32)
    return mx.dequantize(codes, scales.astype(mx.float32), biases.astype(mx.float32),
                         group_size=fmt.group_size, bits=fmt.bits)


def round_trip(w, fmt):
    """``w`` (rows, cols) stored in ``fmt`` and read back, float32 (the simulated weight)."""
    return dequantize(*quantize(w, fmt), fmt)

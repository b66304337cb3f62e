"""ONNX nodes for every Linear kind the suite's variants put in an encoder, built from the MLX
module's own arrays (issue #43, item 2). The public API (shared by the BERT-family and
ModernBERT graph builders) is :class:`Graph` (re-exported from :mod:`variants.onnx.builder`),
:func:`linear` and :func:`quantize_rows`.

What each kind becomes (``x`` (..., in) float32 -> (..., out) float32):

- ``nn.Linear``: ``MatMul`` by the transposed weight (an initializer) then ``Add`` of the bias.
- ``nn.QuantizedLinear`` / :class:`variants.runtime.qlinear.CpuQuantizedLinear`, affine 2- or
  4-bit with a power-of-two group size >= 16: ONNX Runtime's ``com.microsoft.MatMulNBits`` on
  MLX's packed bytes as they are (same nibble order), the scales widened to float32 and float
  zero points ``-bias / scale``: it dequantizes ``(q - zp) · scale``, which equals MLX's
  ``scale · q + bias`` to float32 round-off (max 1 ulp of the weight; tests/onnx).
- any other affine width (1, 3, 5, 6, 8 bits; scale dtypes float32 / float16 / bfloat16) and
  the microscaling modes (``mxfp4``, ``mxfp8``, ``nvfp4``): the packed codes, scales and biases
  as stored, dequantized in the graph bit for bit as :func:`variants.layer_maps.formats.dequantize`
  (:mod:`variants.onnx.dequant_nodes`), then ``MatMul``; ONNX Runtime folds the dequantization
  into a float32 constant when the session loads.
- :class:`variants.runtime.int8_linear.Int8Linear` (W8A8): SmoothQuant's ``inv_smooth`` Mul,
  then the per-token uint8 codes exactly as ``quantize_rows`` (:func:`quantize_rows`; made
  once per input tensor and smoothing factors: the query, key and value share them), then
  ``MatMulInteger`` u8 x u8 on the weight stored as ``wq + 128`` with a scalar
  ``b_zero_point`` 128 (ONNX Runtime refuses a per-row ``a_zero_point``, and its u8 x s8
  kernels saturate 16-bit pair sums on AVX2 CPUs without VNNI; u8 x u8 does not), minus the
  zero-point term ``zp_row · colsum(wq)`` in int32, cast to float32, times ``a_scale`` then
  ``w_scale``, plus the bias. ``int8="u8s8"`` stores ``wq`` as int8 instead (for speed
  comparisons on VNNI CPUs; exact there, not on AVX2 alone).
- :class:`variants.arch.lowrank.LowRankLinear`: its ``down`` then its ``up`` (each any kind above);
  :class:`variants.arch.input_scaled.InputScaledLinear` (AWQ): ``x · input_scale`` then its Linear.

Any other module raises ValueError naming its path and class.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.layer_maps import formats as F
from variants.onnx import dequant_nodes
from variants.onnx.builder import FLOAT, INT32, MS_DOMAIN, UINT8, Graph  # noqa: F401 (API)

#: affine widths ONNX Runtime's MatMulNBits runs with float zero points (exact for MLX affine)
NBITS = (2, 4)
#: the W8A8 weight encodings :func:`linear` writes: u8 x u8 (default, exact on every x86 CPU)
#: or u8 x s8
INT8_SCHEMES = ("u8u8", "u8s8")


def _np(a):
    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)


def _bias(g, y, module, name):
    if "bias" not in module:
        return y
    return g.op("Add", [y, g.const(_np(module["bias"]).astype(np.float32), f"{name}.bias")],
                f"{name}/out")


def _dense(g, x, module, name):
    w = _np(module["weight"]).astype(np.float32)
    y = g.op("MatMul", [x, g.const(np.ascontiguousarray(w.T), f"{name}.weight_t")],
             f"{name}/MatMul")
    return _bias(g, y, module, name)


def _nbits_ok(fmt, scales, biases, in_features):
    gs = fmt.group_size
    if fmt.mode != "affine" or fmt.bits not in NBITS or gs < 16 or gs & (gs - 1):
        return None
    if in_features % gs:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        zp = (-biases / scales).astype(np.float32)
    return zp if np.all(np.isfinite(zp)) and np.all(scales != 0) else None


def _quantized(g, x, module, name):
    fmt = dequant_nodes.format_of(module)
    codes = module["weight"]
    n_out = codes.shape[0]
    k_in = codes.shape[1] * 32 // fmt.bits
    biases = module.get("biases")
    if fmt.mode == "affine" and biases is None:
        raise ValueError(f"{name}: an affine QuantizedLinear without biases; rebuild it with "
                         "mx.quantize's biases")
    if fmt.mode == "affine":
        s32, b32 = _np(module["scales"]).astype(np.float32), _np(biases).astype(np.float32)
        zp = _nbits_ok(fmt, s32, b32, k_in)
        if zp is not None:
            blob = dequant_nodes.code_bytes(codes).reshape(n_out, k_in // fmt.group_size, -1)
            inputs = [x, g.const(blob, f"{name}.codes"), g.const(s32, f"{name}.scales"),
                      g.const(zp, f"{name}.zero_points"), ""]
            if "bias" in module:
                inputs.append(g.const(_np(module["bias"]).astype(np.float32), f"{name}.bias"))
            return g.op("MatMulNBits", inputs, f"{name}/MatMulNBits", domain=MS_DOMAIN,
                        K=k_in, N=n_out, bits=fmt.bits, block_size=fmt.group_size,
                        accuracy_level=1)
    w = dequant_nodes.stored_weight(g, codes, module["scales"], biases, fmt, name)
    wt = g.op("Transpose", [w], f"{name}/weight_t", perm=[1, 0])
    return _bias(g, g.op("MatMul", [x, wt], f"{name}/MatMul"), module, name)


def quantize_rows(g, x, hint):
    """Nodes for the per-row asymmetric uint8 codes of ``x`` (..., K) float32, exactly as
    :func:`variants.runtime.int8_linear.quantize_rows`: ``lo = min(min_k x, 0)``, ``hi =
    max(max_k x, 0)``, ``scale = (hi - lo) / 255`` (1 where 0), ``zp = clip(round(-lo /
    scale), 0, 255)``, ``q = clip(round(x / scale) + zp, 0, 255)`` (ONNX ``Round`` is half to
    even, as ``mx.round``). Returns tensor names ``(q (..., K) uint8, scale (..., 1) float32,
    zp (..., 1) float32)``."""
    zero, one = g.scalar(0.0), g.scalar(1.0)
    lo = g.op("Min", [g.op("ReduceMin", [x, g.ints([-1])], f"{hint}/row_min", keepdims=1),
                      zero], f"{hint}/lo")
    hi = g.op("Max", [g.op("ReduceMax", [x, g.ints([-1])], f"{hint}/row_max", keepdims=1),
                      zero], f"{hint}/hi")
    scale = g.op("Div", [g.op("Sub", [hi, lo], f"{hint}/range"), g.scalar(255.0)],
                 f"{hint}/scale0")
    scale = g.op("Where", [g.op("Greater", [scale, zero], f"{hint}/scale_pos"), scale, one],
                 f"{hint}/a_scale")
    top = g.scalar(255.0)
    zp = g.op("Clip", [g.op("Round", [g.op("Div", [g.op("Neg", [lo], f"{hint}/neg_lo"), scale],
                                           f"{hint}/zp0")], f"{hint}/zp1"), zero, top],
              f"{hint}/zp")
    q = g.op("Add", [g.op("Round", [g.op("Div", [x, scale], f"{hint}/xs")], f"{hint}/xr"), zp],
             f"{hint}/xz")
    q = g.op("Clip", [q, zero, top], f"{hint}/q_f32")
    return g.op("Cast", [q], f"{hint}/q", to=UINT8), scale, zp


def _int8(g, x, module, name, scheme):
    if scheme not in INT8_SCHEMES:
        raise ValueError(f"int8 scheme {scheme!r} is not known; choose one of "
                         f"{', '.join(INT8_SCHEMES)}")
    inv = _np(module["inv_smooth"]).astype(np.float32) if "inv_smooth" in module else None
    key = ("int8-codes", x, None if inv is None else inv.tobytes())
    if key not in g.memo:  # q, k and v read one input (and share SmoothQuant's factors)
        xs = x if inv is None else g.op("Mul", [x, g.const(inv, f"{name}.inv_smooth")],
                                        f"{name}/smoothed")
        g.memo[key] = quantize_rows(g, xs, f"{name}/act")
    q, a_scale, zp = g.memo[key]
    wq = np.array(module["wq"]).astype(np.int16)  # (out, in)
    if scheme == "u8u8":
        w = g.const(np.ascontiguousarray((wq + 128).T.astype(np.uint8)), f"{name}.wq_u8_t")
        acc = g.op("MatMulInteger", [q, w, "", g.scalar(128, np.uint8)], f"{name}/acc")
    else:
        w = g.const(np.ascontiguousarray(wq.T.astype(np.int8)), f"{name}.wq_t")
        acc = g.op("MatMulInteger", [q, w], f"{name}/acc")
    colsum = g.const(np.array(module["colsum"]).astype(np.int32), f"{name}.colsum")
    shift = g.op("Mul", [g.op("Cast", [zp], f"{name}/zp_i32", to=INT32), colsum],
                 f"{name}/zp_colsum")
    acc = g.op("Cast", [g.op("Sub", [acc, shift], f"{name}/acc_zp")], f"{name}/acc_f32",
               to=FLOAT)
    y = g.op("Mul", [g.op("Mul", [acc, a_scale], f"{name}/y_a"),
                     g.const(_np(module["w_scale"]).astype(np.float32), f"{name}.w_scale")],
             f"{name}/y")
    return _bias(g, y, module, name)


def linear(g, x, module, name, *, int8="u8u8"):
    """Nodes computing ``module(x)`` for ``x`` (..., in) float32; returns the output tensor
    name ((..., out) float32).

    Parameters
    ----------
    g : Graph
    x : str
        The input tensor's name.
    module : mlx.nn.Module
        A Linear of any kind in the module docstring (its arrays are read, not changed).
    name : str
        The module's path (names its initializers and nodes, and error messages).
    int8 : {"u8u8", "u8s8"}
        How a W8A8 layer's weight is stored for ``MatMulInteger`` (module docstring).

    Raises
    ------
    ValueError
        A module kind with no ONNX form here (named with its path), an unknown ``int8``
        scheme, a quantized layer whose arrays are not MLX's layout.
    """
    from variants.arch.input_scaled import InputScaledLinear
    from variants.arch.lowrank import LowRankLinear
    from variants.runtime.int8_linear import Int8Linear

    if type(module) is nn.Linear:
        return _dense(g, x, module, name)
    if isinstance(module, nn.QuantizedLinear):
        return _quantized(g, x, module, name)
    if isinstance(module, Int8Linear):
        return _int8(g, x, module, name, int8)
    if isinstance(module, LowRankLinear):
        h = linear(g, x, module.down, f"{name}.down", int8=int8)
        return linear(g, h, module.up, f"{name}.up", int8=int8)
    if isinstance(module, InputScaledLinear):
        xs = g.op("Mul", [x, g.const(_np(module["input_scale"]).astype(np.float32),
                                     f"{name}.input_scale")], f"{name}/scaled")
        return linear(g, xs, module.linear, f"{name}.linear", int8=int8)
    raise ValueError(f"{name}: a {type(module).__name__} has no ONNX form here (the Linear kinds "
                     "are nn.Linear, nn.QuantizedLinear, Int8Linear, LowRankLinear, "
                     "InputScaledLinear); export the variant's simulated form or another family")

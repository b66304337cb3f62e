"""The W8A8 Linear on the CPU: int8 weights (symmetric per output row) and per-token uint8
activations (asymmetric per row), multiplied by the compiled integer GEMM (:mod:`variants.runtime.qkernel`,
oneDNN) where it is built, else the same quantization simulated in MLX. Built by the w8a8
family (:mod:`variants.families.w8a8.build`); run compiled inside a BERT layer by
:mod:`variants.runtime.fused_layer`."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.runtime import qkernel
from variants.runtime.derived import DerivedWeights

#: the kernel names timing records give a W8A8 Linear's calls: oneDNN's matmul primitive on
#: weights reordered once (:func:`prepacked`), oneDNN's ``dnnl_gemm_u8s8s32`` (re-packs the
#: weight every call; where the build has no matmul primitive for it), or simulated in MLX
NAMES = {"prepacked": "int8-matmul-dnnl-prepacked", "native": "int8-gemm-dnnl",
         "simulated": "w8a8-simulated"}


def quantize_weight(w):
    """(wq int8 (out, in), scale float32 (out,)) of ``w`` (out, in) float32, symmetric per row."""
    w = w.astype(mx.float32)
    scale = mx.max(mx.abs(w), axis=1) / 127.0
    scale = mx.where(scale > 0, scale, mx.ones_like(scale))
    wq = mx.clip(mx.round(w / scale[:, None]), -127, 127).astype(mx.int8)
    return wq, scale


def quantize_rows(x):
    """Per-row asymmetric uint8 codes of ``x`` (..., K) float32: (q float32 in [0, 255],
    scale (..., 1), zero point (..., 1) float32 integers), as the compiled op computes them."""
    lo = mx.minimum(mx.min(x, axis=-1, keepdims=True), 0.0)
    hi = mx.maximum(mx.max(x, axis=-1, keepdims=True), 0.0)
    scale = (hi - lo) / 255.0
    scale = mx.where(scale > 0, scale, mx.ones_like(scale))
    zp = mx.clip(mx.round(-lo / scale), 0, 255)
    q = mx.clip(mx.round(x / scale) + zp, 0, 255)
    return q, scale, zp


def _kernel():
    """The compiled module with oneDNN's int8 ops, or None: not built, no oneDNN, or no exact
    scheme on this CPU (``int8_scheme() == "none"``: its sums were probed wrong, so the W8A8
    ops run simulated rather than judge a model that computes other sums)."""
    k = qkernel.load()
    if k is None or not k.has_dnnl():
        return None
    return None if getattr(k, "int8_scheme", lambda: "u8s8")() == "none" else k


def scheme():
    """How the compiled int8 GEMM gets exact int32 sums on this CPU (``qkernel.int8_scheme``):
    ``"u8s8"`` (one oneDNN u8 x s8 GEMM: VNNI or AMX) or ``"u8s8-split7"`` (the uint8 codes
    split into two 7-bit halves, two GEMMs summed in int32: CPUs without VNNI, whose u8 x s8
    kernels saturate 16-bit pair sums; oneDNN developer guide, "Nuances of int8
    computations"). None where the compiled int8 GEMM is not available (simulated)."""
    k = _kernel()
    return k.int8_scheme() if k is not None and hasattr(k, "int8_scheme") else None


def cpu_isa():
    """oneDNN's effective CPU ISA (``"avx2"``, ``"avx512_core"``, ``"avx512_core_vnni"``,
    ``"avx512_core_amx"``, ...; it honours ``ONEDNN_MAX_CPU_ISA``), or None without oneDNN."""
    k = _kernel()
    return k.int8_cpu_isa() if k is not None and hasattr(k, "int8_cpu_isa") else None


def int8_record(kernel_names):
    """The int8 fields of a timing or build record: ``{"scheme": scheme(), "isa": cpu_isa()}``
    when ``kernel_names`` (a kernel string, e.g. timing's ``kernel.variant``) runs the compiled
    int8 GEMM (a name with ``dnnl``), else None."""
    if not kernel_names or "dnnl" not in kernel_names:
        return None
    return {"scheme": scheme(), "isa": cpu_isa()}


def can_prepack(wq):
    """Whether the compiled op can reorder ``wq`` (N, K) for oneDNN's matmul primitive."""
    k = _kernel()
    return (k is not None and hasattr(k, "int8_prepack_bytes")
            and k.int8_prepack_bytes(*wq.shape) > 0)


def prepacked(module, wq):
    """``wq`` int8 (N, K) reordered once into the layout of oneDNN's matmul primitive (a uint8
    blob, ``qkernel.int8_prepack``), made on the first native call and cached on ``module``
    until ``wq`` is replaced (a plain object: not a parameter, not saved; a deep copy makes its
    own); None where :func:`can_prepack` is False."""
    if not can_prepack(wq):
        return None
    cache = module.__dict__.get("_prepack")
    if cache is None:
        cache = module.__dict__["_prepack"] = DerivedWeights()
    return cache.get((wq,), lambda: _kernel().int8_prepack(wq))


class Int8Linear(nn.Module):
    """A W8A8 Linear: ``x`` (..., in) float32 -> (..., out) float32 (module docstring).

    Parameters: ``wq`` int8 (out, in), ``w_scale`` float32 (out,), ``colsum`` int32 (out,) =
    Σ_k wq, ``bias`` float32 (out,) when the Linear had one, ``inv_smooth`` float32 (in,) with
    SmoothQuant. ``native``: run the compiled integer GEMM where it is available."""

    def __init__(self, linear, native=False, smooth=None):
        super().__init__()
        w = linear.weight.astype(mx.float32)
        if smooth is not None:
            s = mx.array(np.asarray(smooth, np.float32))
            w = w * s[None, :]
            self.inv_smooth = (1.0 / s).astype(mx.float32)
        self.wq, self.w_scale = quantize_weight(w)
        self.colsum = mx.sum(self.wq.astype(mx.int32), axis=1)
        if "bias" in linear:
            self.bias = linear.bias.astype(mx.float32)
        self._native = bool(native)

    @property
    def kernel(self):
        """``int8-matmul-dnnl-prepacked`` when calls run oneDNN's matmul primitive on the
        prepacked weight, ``int8-gemm-dnnl`` when they run ``dnnl_gemm_u8s8s32``, else
        ``w8a8-simulated``."""
        if not (self._native and _kernel() is not None):
            return NAMES["simulated"]
        return NAMES["prepacked"] if can_prepack(self["wq"]) else NAMES["native"]

    def simulated(self, x):
        """The same quantization in MLX, dequantized values multiplied in fp32."""
        if "inv_smooth" in self:
            x = x * self["inv_smooth"]
        q, scale, zp = quantize_rows(x)
        w = self["wq"].astype(mx.float32) * self["w_scale"][:, None]
        y = ((q - zp) * scale) @ w.T
        return y + self["bias"] if "bias" in self else y

    def __call__(self, x):
        k = _kernel() if self._native else None
        if k is None or x.dtype != mx.float32:
            return self.simulated(x)
        return k.int8_linear(x, self["wq"], self["w_scale"], self["colsum"],
                             self["bias"] if "bias" in self else None,
                             self["inv_smooth"] if "inv_smooth" in self else None,
                             prepacked(self, self["wq"]))


def empty_int8(out_features, in_features, bias=True, smooth=False, native=True):
    """An :class:`Int8Linear` skeleton (out, in) whose parameters are zeros of the stored
    dtypes (``wq`` int8, ``w_scale`` float32, ``colsum`` int32, ``bias`` / ``inv_smooth``
    float32 when present), for ``load_weights`` to fill: a loader rebuilds the module from a
    folder's tensors without quantizing anything."""
    m = Int8Linear.__new__(Int8Linear)
    nn.Module.__init__(m)
    if smooth:
        m.inv_smooth = mx.zeros((in_features,), mx.float32)
    m.wq = mx.zeros((out_features, in_features), mx.int8)
    m.w_scale = mx.zeros((out_features,), mx.float32)
    m.colsum = mx.zeros((out_features,), mx.int32)
    if bias:
        m.bias = mx.zeros((out_features,), mx.float32)
    m._native = bool(native)
    return m

"""Quantized Linears at BLAS speed on the CPU: dequantize per call, then the fp32 GEMM.

MLX's CPU backend has no BLAS path for ``mx.quantized_matmul``: one 384 -> 1536 layer at 4 bits
takes ~840 ms at 1504 rows against ~12 ms for ``mx.dequantize`` + the OpenBLAS GEMM
(:mod:`variants.runtime.blas`). :class:`CpuQuantizedLinear` is an ``nn.QuantizedLinear`` with the same
parameters (packed weights, scales, biases: the model bytes do not change) whose call, on the CPU,
dequantizes the weight into a temporary fp32 buffer (one per call, freed after it; it counts in
the call's peak memory, never kept across calls) and multiplies with the GEMM. Off the CPU
(Metal, CUDA) it is ``mx.quantized_matmul``, which is fast there.

Three dequantizers (the result is bit-identical to ``mx.dequantize``, tested):

- ``dequant-cpp+gemm`` (the default where it is built): the compiled extension
  :mod:`variants.runtime.qkernel` (an MLX C++ primitive) dequantizes into one temporary fp32 buffer
  (AVX2 loop where the CPU has it: ~0.1 ms per 384x1536 weight, ~0.16 ns per weight, 4-10x
  faster than the unpacking chain; a portable loop elsewhere, ~0.35 ns) and calls
  ``cblas_sgemm`` on it; without a compiler / cmake / nanobind it falls back to ``unpack+gemm``
  (one line on stderr, the same results);
- ``dequant+gemm``: ``mx.dequantize``, MLX's element-by-element CPU kernel;
- ``unpack+gemm``: an ``mx.compile``'d bit-unpacking chain on the packed bytes (shifts, masks,
  ``scale * q + bias``) fused into one kernel; MLX packs 3 and 6 bits in 3-byte
  chunks (8 and 4 values), the others in single bytes, little-endian from the low bits.

Scales and biases may be float32, float16 or bfloat16 (both the same dtype; mlx-lm stores half
precision): every dequantizer widens them to float32 exactly and computes
``float32(scale) * q + float32(bias)`` in float32, which is what ``mx.quantized_matmul`` computes
for float32 ``x`` (checked bit for bit); ``mx.dequantize`` itself, given half-precision scales,
returns the weight rounded to that dtype, so the ``dequantize`` kernel passes it float32 copies
of them. The compiled loops read the half-precision scales directly, once per group (no slower
path: bench/scale_dtype_speed.py, docs/speed.md).

Which one each bit width uses is :data:`KERNELS` (measured in ``bench/quant_speed.py``: the
unpacking chain is as fast as ``mx.dequantize`` at 4 and 8 bits and 3-6x faster at 3 and 6
bits, where MLX's kernel is slowest). With fewer rows than :data:`SPLIT_ROWS` the output
features are split over :func:`variants.runtime.parallel.streams` (both cores dequantize at B=1); off by
default: on the shared 2-core machine the split ran 1.18-1.25x slower than one stream
(alternated A/B, B=1 L=24, 8 and 4 bits, the second core busy with other work).

MLX's microscaling modes (``mxfp4``, ``mxfp8``, ``nvfp4``: ``mx.quantize(..., mode=...)``, no
biases) run the same way on the CPU: the weight dequantized to fp32 by the compiled
``dequantize_mode`` of :mod:`variants.runtime.qkernel` (``qmodes.cpp``, bit-identical to
``mx.dequantize(..., mode=mode, dtype=mx.float32)``; without the extension ``mx.dequantize``
itself), then the GEMM; the result equals the simulated path (dequantize once, ``nn.Linear``) to
round-off. Measured (AMD EPYC Zen 3 KVM, 2 cores, 2026-12-07, 384 -> 1536, median of 30):

======  ====================  ================================  =========================
mode    ``quantized_matmul``  ``mx.dequantize`` + GEMM          compiled dequantize
        1504 / 128 rows       1504 / 128 rows (dequantize)      (alone)
======  ====================  ================================  =========================
mxfp4   378 / 32 ms           14.5 / 5.6 ms (4.8 ms)            0.10-0.19 ms
mxfp8   1600 / 135 ms         10.3 / 2.1 ms (1.2 ms)            0.24-0.33 ms
nvfp4   383 / 31 ms           14.6 / 5.7 ms (5.0 ms)            0.11-0.12 ms
======  ====================  ================================  =========================

(the fp32 GEMM alone: 9.2 ms at 1504 rows; bench/scale_dtype_speed.py times them per layer
against affine 4 and 8 bits).

What limits B=1: every call dequantizes all of the model's quantized weights (10.6 M for
MiniLM's encoder). With the unpacking chain that is ~1-1.5 ns per weight, ~12-20 ms of one
core, as long as the reference's whole B=1 forward (~12 ms); with the compiled kernel it is
~0.2 ns per weight, ~2.2-2.6 ms for the 36 Linears one after the other (one core; the GEMMs
use both), so B=1 runs at ~0.75-0.87x the reference (bench/quant_speed.py) and B=32 at ~1x.
Dequantizing tiles of 32-512 rows into a cache-sized buffer, each fed to the GEMM, measured no
faster than the whole weight then one GEMM (:data:`TILE`): the 24-row GEMMs on narrow tiles
lose more than the buffer's cache misses cost.
"""

import functools

import mlx.core as mx
import mlx.nn as nn

from variants.runtime import parallel, qkernel

#: bytes and values per packed chunk (MLX's affine packing)
_CHUNKS = {2: (1, 4), 3: (3, 8), 4: (1, 2), 6: (3, 4), 8: (1, 1)}

#: the dequantizer each bit width uses on the CPU ("cpp", "unpack" or "dequantize"; "cpp"
#: falls back to "unpack" where :mod:`variants.runtime.qkernel` is not built)
KERNELS = {2: "cpp", 3: "cpp", 4: "cpp", 6: "cpp", 8: "cpp"}

#: MLX's microscaling modes, run on the CPU as dequantize + GEMM: (group size, bits) of each
#: (the only ones MLX 0.32 accepts)
MODES = {"mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}

#: the dtypes scales and biases may have (both the same) on every dequantizer of this module
SCALE_DTYPES = (mx.float32, mx.float16, mx.bfloat16)

#: kernel names as timing records give them
NAMES = {"cpp": "dequant-cpp+gemm", "unpack": "unpack+gemm", "dequantize": "dequant+gemm",
         "native": "quantized_matmul", "mode-cpp": "dequant-mode-cpp+gemm"}

#: output rows the compiled kernel dequantizes per ``cblas_sgemm`` call (0: the whole weight
#: into one buffer, one GEMM; measured faster than 32 or 128-row tiles at 24 rows: the small-N
#: GEMMs cost more than the buffer's cache misses)
TILE = 0

#: below this many rows per call the output features are split over the CPU streams (0: never;
#: module docstring)
SPLIT_ROWS = 0


@functools.lru_cache(maxsize=None)
def _unpacker(bits, group_size):
    nb, nv = _CHUNKS[bits]
    mask = (1 << bits) - 1
    shifts = mx.array([k * bits for k in range(nv)], mx.uint32 if nb > 1 else mx.uint8)

    def dq(w, scales, biases):
        out, groups = scales.shape
        u = mx.view(w, mx.uint8).reshape(out, groups, -1, nb)
        if nb > 1:  # 3 bytes -> one 24-bit word
            u = u.astype(mx.uint32)
            u = u[..., 0] | (u[..., 1] << 8) | (u[..., 2] << 16)
        else:
            u = u[..., 0]
        # (out, groups, chunks, nv): value k of a chunk sits at bits [k*bits, (k+1)*bits)
        q = ((u[..., None] >> shifts) & mask).astype(mx.float32)
        return (q * scales[..., None, None] + biases[..., None, None]).reshape(
            out, groups * group_size)

    return mx.compile(dq)


def unpack(w, scales, biases, group_size, bits):
    """``mx.dequantize`` (affine mode) by the compiled bit-unpacking chain.

    ``w`` (out, in * bits / 32) uint32 as ``mx.quantize`` packs it; ``scales``, ``biases``
    (out, in / group_size) float32, float16 or bfloat16 (widened exactly: MLX promotes the
    product to float32) -> (out, in) float32, equal to ``mx.dequantize``'s on float32 scales.
    Raises KeyError for a bit width outside (2, 3, 4, 6, 8)."""
    return _unpacker(bits, group_size)(w, scales, biases)


def resolve(kernel):
    """``kernel``, or "unpack" for "cpp" when the compiled extension is unavailable."""
    if kernel == "cpp" and qkernel.load() is None:
        return "unpack"
    return kernel


def dequantize(w, scales, biases, group_size, bits, kernel="unpack"):
    """The dense fp32 weight (out, in) by ``kernel`` ("cpp", "unpack" or "dequantize"):
    ``float32(scale) * q + float32(bias)`` for scales and biases of any :data:`SCALE_DTYPES`
    (module docstring)."""
    kernel = resolve(kernel)
    if kernel == "cpp":
        return qkernel.load().dequantize(w, scales, biases, group_size, bits)
    if kernel == "unpack":
        return unpack(w, scales, biases, group_size, bits)
    if scales.dtype != mx.float32:  # mx.dequantize would round the weight to their dtype
        scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
    return mx.dequantize(w, scales, biases, group_size=group_size, bits=bits)


def mode_kernel():
    """The microscaling modes' dequantizer here: "mode-cpp" (the compiled one) or "dequantize"
    (``mx.dequantize``, where the extension is not built)."""
    mod = qkernel.load()
    return "mode-cpp" if mod is not None and hasattr(mod, "dequantize_mode") else "dequantize"


def dequantize_mode(w, scales, mode, kernel=None):
    """The dense fp32 weight (out, in) of ``mode`` (a key of :data:`MODES`) from ``mx.quantize``'s
    ``(w uint32, scales uint8)``, by ``kernel`` ("mode-cpp" or "dequantize"; None:
    :func:`mode_kernel`); both equal ``mx.dequantize(w, scales, mode=mode, dtype=mx.float32)``
    bit for bit. Raises KeyError for another mode."""
    gs, bits = MODES[mode]
    if (kernel or mode_kernel()) == "mode-cpp" and qkernel.load() is not None:
        return qkernel.load().dequantize_mode(w, scales, mode)
    return mx.dequantize(w, scales, group_size=gs, bits=bits, mode=mode, dtype=mx.float32)


def on_cpu():
    """Whether MLX's default device is the CPU (the dequantize + GEMM path is used only there)."""
    from variants.runtime import device

    return device.is_cpu()


class CpuQuantizedLinear(nn.QuantizedLinear):
    """``nn.QuantizedLinear`` (same parameters and names) that runs on the CPU as dequantize +
    fp32 GEMM (module docstring); ``x`` (..., in) float32 -> (..., out). The microscaling
    modes of :data:`MODES` too (their default group size and bits). Elsewhere (Metal, CUDA)
    it is ``mx.quantized_matmul``."""

    def _mode(self):
        """This layer's mode when it is one of :data:`MODES` at its group size and bits, else
        None."""
        mode = getattr(self, "mode", "affine")
        return mode if MODES.get(mode) == (self.group_size, self.bits) else None

    @property
    def kernel(self):
        """The kernel name a call uses now: ``dequant-cpp+gemm``, ``unpack+gemm``,
        ``dequant+gemm``, ``dequant-mode-cpp+gemm`` (a microscaling mode) or
        ``quantized_matmul``."""
        if not on_cpu():
            return NAMES["native"]
        if getattr(self, "mode", "affine") != "affine":
            return NAMES[mode_kernel()] if self._mode() else NAMES["native"]
        if self.get("biases") is None:
            return NAMES["native"]
        return NAMES[self._dequantizer()]

    def _dequantizer(self):
        """``cpp``, ``unpack`` or ``dequantize``: :data:`KERNELS`' choice, resolved (each reads
        float32 and half-precision scales as ``float32(scale) * q + float32(bias)``,
        :func:`variants.layer_maps.formats.dequantize`)."""
        return resolve(KERNELS.get(self.bits, "dequantize"))

    def _gemm(self, x, rows=None):
        """``x @ W[rows].T + bias[rows]``, W dequantized now (all output rows when None)."""
        pick = (lambda a: a) if rows is None else (lambda a: a[rows])
        if self._mode():
            w = dequantize_mode(pick(self["weight"]), pick(self["scales"]), self.mode)
            if "bias" in self:
                return mx.addmm(pick(self["bias"]), x, w.T)
            return x @ w.T
        kernel = self._dequantizer()
        if kernel == "cpp":
            return qkernel.load().qlinear(
                x, pick(self["weight"]), pick(self["scales"]), pick(self["biases"]),
                pick(self["bias"]) if "bias" in self else None, self.group_size, self.bits,
                TILE)
        w = dequantize(pick(self["weight"]), pick(self["scales"]), pick(self["biases"]),
                       self.group_size, self.bits, kernel)
        if "bias" in self:
            return mx.addmm(pick(self["bias"]), x, w.T)
        return x @ w.T

    def __call__(self, x):
        if self.kernel == NAMES["native"]:
            return super().__call__(x)
        ss = parallel.streams()
        n_rows = x.size // x.shape[-1]
        out = self["weight"].shape[0]
        if len(ss) == 1 or n_rows >= SPLIT_ROWS or out < 2 * len(ss):
            return self._gemm(x)
        parts = []
        for s, (a, b) in zip(ss, parallel.bounds(out, len(ss))):
            with mx.stream(s):
                parts.append(self._gemm(x, slice(a, b)))
        return mx.concatenate(parts, axis=-1)


def refuse_packed(module, family):
    """Raise ValueError (one line naming the first such layer and the fix) when ``module``
    holds a layer already quantized (``nn.QuantizedLinear`` / ``nn.QuantizedEmbedding`` /
    a word table stored by use, as
    :func:`variants.checkpoints.load.load_checkpoint` gives for a folder written by ``variants
    export``): ``family`` (its name) builds from fp32 weights, not from packed ones."""
    from variants.runtime.row_embedding import RowWidthEmbedding

    done = [p for p, m in module.named_modules()
            if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding, RowWidthEmbedding))]
    if done:
        raise ValueError(f"the checkpoint's layer {min(done)} is already quantized (a folder "
                         f"written by variants export?), and --family {family} builds from "
                         "fp32 weights; pass the fp32 checkpoint it was exported from, or "
                         "another --family")


def use_cpu_path(module):
    """Turn every ``nn.QuantizedLinear`` inside ``module`` into a :class:`CpuQuantizedLinear`
    and every ``nn.QuantizedEmbedding`` into a
    :class:`variants.runtime.qembedding.Fp32QuantizedEmbedding` (float32 rows whatever the
    scales' dtype), in place (the same parameter arrays: nothing is copied or added). Returns
    ``module``.
    On the CPU it loads (or first builds) the compiled kernel now, not inside a timed call."""
    if on_cpu() and "cpp" in KERNELS.values():
        qkernel.load()
    for _, m in module.named_modules():
        if type(m) is nn.QuantizedLinear:
            m.__class__ = CpuQuantizedLinear
    from variants.runtime.qembedding import use_fp32_rows

    return use_fp32_rows(module)  # quantized tables: float32 rows (half-precision scales)


def kernels(module):
    """Sorted kernel names the quantized Linears of ``module`` use now (``[]`` when none):
    ``quantized_matmul`` for a plain ``nn.QuantizedLinear`` or off the CPU. (A quantized
    embedding table dequantizes only the rows it gathers: no matmul kernel.)"""
    found = set()
    for _, m in module.named_modules():
        if isinstance(m, CpuQuantizedLinear):
            found.add(m.kernel)
        elif isinstance(m, nn.QuantizedLinear):
            found.add(NAMES["native"])
    return sorted(found)

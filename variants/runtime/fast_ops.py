"""Float32-accurate softmax and GELU that run fast on MLX's CPU backend.

What makes element-wise work slow or fast there (MLX 0.32, Linux x86-64 wheel; measured with
``bench/encoder_steps.py`` and the kernels MLX writes to ``/tmp/mlx/<version>/cpu``):

- ``mx.exp`` / ``mx.erf`` run element by element (about 15 and 40 ns per float here); a chain
  of multiply-adds under ``mx.compile`` becomes one C++ loop that g++ vectorises (~0.3 ns/float).
- ``mx.compile`` fuses at most 11 operations deep. A longer chain is cut into several kernels,
  and a scalar constant that lands at a cut is passed as a broadcast array; a kernel with any
  broadcast input takes MLX's strided path: a scalar, unvectorised loop (3-10x slower). So each
  compiled function below is at most 11 deep and takes only same-shape contiguous arrays;
  broadcasting work (row max, row sum, the padding bias) stays in MLX's own binary and
  reduction kernels, which handle broadcasts well.
- ``mx.floor`` compiles to a libm call per element; ``(v + 1.5·2²³) − 1.5·2²³`` rounds to the
  nearest integer in two vectorised adds instead.
- Polynomials use Estrin's scheme (Knuth, TAOCP vol. 2, 4.6.4): same coefficients as Horner,
  half the depth, so a whole reduction step fits in one kernel.

- MLX keeps at most 32 MB of freed buffers for reuse by default on this CPU; larger arrays go
  back to the OS and come back as fresh pages (a page fault per 4 KB): see
  :func:`variants.runtime.parallel.streams`, which raises the cache limit.

- Reductions over a short last axis are slow there too (a row mean over 384 floats costs 3x a
  GEMV by a column of 1/D), and ``mx.fast.layer_norm`` has no CPU kernel: it runs as 18
  primitives. :func:`layer_norm` takes its two row means as GEMVs (OpenBLAS).

Accuracy (tests/sweep/test_profile.py): exp max relative error 1.2e-7 on [-87, 0]; GELU max absolute
error 1.1e-6 against the float64 exact-erf GELU on [-10, 10]; the encoder stays within float32
round-off of the PyTorch fixtures (tests/arch/test_encoder_parity.py).
"""

import math

import mlx.core as mx
import numpy as np

from variants.runtime import device

# erf(x) ~ x P(x²) / Q(x²) on |x| <= 4 (erf is +/-1 in float32 beyond): Eigen's
# generic_fast_erf_float coefficients, as XLA uses for float32 erf (highest power first).
_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
         -7.37332916720468e-03, -1.42647390514189e-02)
_SQRT1_2 = 1.0 / math.sqrt(2.0)

# exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 with ln 2 split in two parts (Cody &
# Waite 1980) so r is exact to float32; exp(r) on |r| <= ln2/2 by the Cephes expf polynomial.
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1)
_EXP_LO = -87.3  # 2^n stays a normal float32 (n >= -126)
_ROUND = 12582912.0  # 1.5 * 2**23: (v + _ROUND) - _ROUND rounds |v| < 2**22 to an integer


def _estrin(coeffs, z, z2):
    """Polynomial in ``z`` (coefficients highest power first) by Estrin's scheme; ``z2`` = z²."""
    terms = list(coeffs)[::-1]  # lowest power first
    zp = z
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] * zp if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
        zp = z2 if zp is z else zp * zp
    return terms[0]


@mx.compile
def _exp_n(x):
    return (mx.maximum(x, _EXP_LO) * _LOG2E + _ROUND) - _ROUND


@mx.compile
def _exp_bits(n):
    return mx.left_shift(n.astype(mx.int32) + 127, 23)


@mx.compile
def _exp_finish(x, n, scale):
    x = mx.maximum(x, _EXP_LO)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    r2 = r * r
    return _estrin(_EXP_P, r, r2) * (r2 * scale) + (r + 1.0) * scale


def _in_float32(fn):
    """Run ``fn`` in float32 and cast back: the kernels' constants (1.5·2²³ rounding, exponent
    bits, polynomial coefficients) are float32's; float16/bfloat16 inputs would overflow or lose
    the integer part."""
    def wrapped(x):
        if x.dtype == mx.float32:
            return fn(x)
        return fn(x.astype(mx.float32)).astype(x.dtype)
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


@_in_float32
def exp_nonpositive(x):
    """exp(x) for ``x <= 0`` (any shape; float16/bfloat16 computed in float32), three fused
    kernels.

    Max relative error 1.2e-7 on [-87.3, 0] (against float64 ``exp``); below -87.3 the result is
    exp(-87.3) ~ 1.2e-38 instead of a denormal or 0. Also exact to that error up to x = 88; above,
    the 2^n scale overflows its exponent bits (softmax only passes x <= 0).

    References
    ----------
    W. J. Cody and W. Waite, "Software Manual for the Elementary Functions", 1980, Ch. 6;
    S. L. Moshier, Cephes Math Library, ``expf.c``.
    """
    n = _exp_n(x)
    return _exp_finish(x, n, _exp_bits(n).view(mx.float32))


def _exp_shifted(scores, bias, axis=-1):
    s = scores if bias is None else scores + bias
    return exp_nonpositive(s - mx.max(s, axis=axis, keepdims=True))


def softmax_parts(scores, bias=None, total=True, axis=-1):
    """Unnormalised softmax over ``axis``: ``(e, total)`` with softmax = e / total
    (``e`` alone when ``total=False``: attention gets the row sums from its ``e @ [v, 1]``).

    ``scores`` (..., L) float32 (softmax over the last axis), or (..., L, Lq) with ``axis=-2``
    (the transposed layout attention uses: MLX's CPU max over axis -2 of a contiguous array is
    about 3x faster than over short last-axis rows); ``bias`` broadcasts against it (the
    encoder's (B, 1, 1, L) additive padding bias, transposed to (B, 1, L, 1) for ``axis=-2``) or
    is None. ``e = exp(s - max s)`` (same shape, every entry in (0, 1]), ``total`` its sum over
    ``axis`` (>= 1, kept as a size-1 axis). A masked key (bias -1e9) gets weight ~1e-38 / total,
    i.e. 0 in float32 sums, and a fully masked row stays finite.
    """
    e = _exp_shifted(scores, bias, axis)
    return (e, e.sum(axis=axis, keepdims=True)) if total else e


def masked_softmax(scores, bias=None):
    """softmax(scores + bias) over the last axis (see :func:`softmax_parts`); same shape."""
    e = _exp_shifted(scores, bias)
    return e / e.sum(axis=-1, keepdims=True)


@mx.compile
def _erf_arg(x):
    return mx.clip(x * _SQRT1_2, -4.0, 4.0)


@mx.compile
def _gelu_finish(x, u):
    z = u * u
    z2 = z * z
    half = 0.5 * x
    return half + (half * u) * _estrin(_ALPHA, z, z2) / _estrin(_BETA, z, z2)


@_in_float32
def gelu(x):
    """Exact-form GELU x·Φ(x) = 0.5x(1 + erf(x/√2)) (Hendrycks & Gimpel 2016) for ``x`` of any
    shape (float16/bfloat16 computed in float32), with erf as the rational function above; two
    fused kernels.
    Max absolute error 1.1e-6 on [-10, 10] against the float64 exact-erf GELU."""
    return _gelu_finish(x, _erf_arg(x))


_AVG = {}


def _row_mean_weights(D, dtype):
    key = (D, dtype)
    if key not in _AVG:  # from NumPy, not a lazy op: no stream (another thread may use it)
        _AVG[key] = mx.array(np.full((D, 1), 1.0 / D, np.float32), dtype)
    return _AVG[key]


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the last axis (Ba et al. 2016), as ``mx.fast.layer_norm``:
    ``(x - mean) / sqrt(var + eps) * weight + bias`` with the biased variance.

    ``x`` (..., D); ``weight``, ``bias`` (D,) or None. On the CPU in float32 the two row means
    (of x, then of the squared centred x: two passes, as PyTorch computes it, no E[x²] - mean²
    cancellation) are GEMVs by a column of 1/D, 1.2-1.6x faster than ``mx.fast.layer_norm``
    there (N = 128..4096 rows of 384) and closer to the float64 result (max error 1.5e-6 vs
    2.7e-6 on N(0, 1) rows). Other dtypes and devices use ``mx.fast.layer_norm``.
    """
    if x.dtype != mx.float32 or not device.is_cpu() or x.ndim < 1 or x.shape[-1] == 0:
        return mx.fast.layer_norm(x, weight, bias, eps)
    avg = _row_mean_weights(x.shape[-1], x.dtype)
    xc = x - x @ avg
    y = xc * mx.rsqrt(mx.square(xc) @ avg + eps)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias

"""Float32-accurate element-wise functions that run fast on MLX's CPU backend.

MLX's CPU transcendental functions run element by element (``erf`` ~ 40 ns/float here), while a
chain of multiply-adds fuses under ``mx.compile``. ``gelu`` below evaluates erf as a rational
function (odd degree-13 numerator over even degree-8 denominator in x, inputs clamped to
[-4, 4] where erf is +/-1 in float32) — the approximation Eigen and XLA use for float32 erf.
Measured here: max |error| 4.2e-7 for erf and 1.5e-6 for GELU against the exact (float64) erf,
and about 7x faster than ``nn.gelu`` on a (800, 1536) float32 input.
"""

import math

import mlx.core as mx

# Eigen's generic_fast_erf_float coefficients (highest power first).
_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
         -7.37332916720468e-03, -1.42647390514189e-02)
_SQRT1_2 = 1.0 / math.sqrt(2.0)


def _horner(coeffs, x):
    acc = coeffs[0]
    for c in coeffs[1:]:
        acc = acc * x + c
    return acc


def erf(x):
    """erf(x) for float32 ``x`` (any shape), max abs error 4.2e-7 (rational approximation)."""
    x = mx.clip(x, -4.0, 4.0)
    x2 = x * x
    return x * _horner(_ALPHA, x2) / _horner(_BETA, x2)


@mx.compile
def gelu(x):
    """Exact-form GELU x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel 2016),
    with :func:`erf` above; compiled so the polynomial fuses into one kernel."""
    return 0.5 * x * (1.0 + erf(x * _SQRT1_2))


# exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 split in two parts (Cody & Waite
# 1980) so r is exact to float32; exp(r) on |r| <= ln2/2 by the Cephes expf polynomial.
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1)
_EXP_LO, _EXP_HI = -87.3, 88.3  # 2^n stays a normal float32 (n in [-126, 127])


def exp(x):
    """exp(x) for float32 ``x``, max relative error 8.1e-8 on [-87.3, 88.3] (measured against
    float64 exp); inputs below -87.3 give ~1e-38 instead of a denormal or 0, and above 88.3 saturate.

    Plain MLX ops (range reduction, degree-7 polynomial, 2^n built in the exponent bits), so
    under ``mx.compile`` the whole chain fuses into one kernel, unlike ``mx.exp`` on CPU.

    References
    ----------
    W. J. Cody and W. Waite, "Software Manual for the Elementary Functions", 1980, Ch. 6;
    S. L. Moshier, Cephes Math Library, ``expf.c``.
    """
    x = mx.clip(x, _EXP_LO, _EXP_HI)
    n = mx.floor(x * _LOG2E + 0.5)
    r = x - n * _LN2_HI - n * _LN2_LO
    p = _horner(_EXP_P, r)
    p = p * r * r + r + 1.0
    return p * mx.left_shift(n.astype(mx.int32) + 127, 23).view(mx.float32)


@mx.compile
def masked_softmax(scores, bias):
    """softmax(scores + bias) over the last axis with :func:`exp`, compiled.

    ``bias`` broadcasts against ``scores`` (the encoder's (B, 1, 1, L) additive padding bias).
    Subtracting the row max first keeps every exponent <= 0; a masked key (bias -1e9) gets
    weight ~1e-38 / row sum, i.e. 0 in float32 sums, and a fully masked row stays finite.
    """
    s = scores + bias
    e = exp(s - mx.max(s, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

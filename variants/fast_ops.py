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

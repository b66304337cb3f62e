"""Newton's polish of a temperature fit: exact first and second derivatives of the mean NLL of
``softmax(logits / T)`` in log T, and the Newton steps from Brent's point to the root of the first
(:func:`metrics.temperature_fit.fit_temperature_status` calls it). Brent's bounded search stops
anywhere within its tolerance, and which point it stops at can flip with the last bit of an NLL
summed in another SIMD order; the polished root moves continuously with the logits, so the same
logits give the same temperature on every CPU to ~1e-14."""

import numpy as np
from scipy.special import log_softmax

#: Newton's polish stops when a step in log T is below this (absolute), after at most
#: POLISH_STEPS steps; a step that leaves Brent's bracket or meets a non-positive curvature
#: ends it, keeping Brent's point.
POLISH_TOL = 1e-13
POLISH_STEPS = 20


def nll_derivatives(log_t, logits, mask, targets):
    """First and second derivative of :func:`mean_nll` in ``log_t`` (float64).

    With ``s = log T`` and ``z = logits / T``: ``dNLL/ds = mean(z_y - E_p[z])`` and
    ``d2NLL/ds2 = mean(Var_p[z]) - dNLL/ds`` (p = softmax(z) over the valid options).

    Returns
    -------
    (float, float)
    """
    z = np.where(mask, logits * np.exp(-log_t), -np.inf)
    p = np.exp(log_softmax(z, axis=1))
    z = np.where(mask, z, 0.0)
    ez = (p * z).sum(axis=1)
    var = (p * (z - ez[:, None]) ** 2).sum(axis=1)
    g = float((z[np.arange(len(targets)), targets] - ez).mean())
    return g, float(var.mean()) - g


def polish(x, a, b, logits, mask, targets):
    """Newton's steps on log T from Brent's ``x`` inside ``(a, b)``: the polished log T, or
    ``x`` when a step fails (module docstring)."""
    y = x
    for _ in range(POLISH_STEPS):
        g, h = nll_derivatives(y, logits, mask, targets)
        if not (np.isfinite(g) and np.isfinite(h) and h > 0):
            return x
        step = g / h
        if not a <= y - step <= b:
            return x
        y -= step
        if abs(step) <= POLISH_TOL:
            return y
    return y

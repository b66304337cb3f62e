"""The evaluation's temperature refit is the exact NLL optimum, continuous in the logits (issue
#38 item 3): Brent's bounded search alone stops anywhere within its tolerance, and where it stops
can flip with the last bits of the logits (3.4e-7 in log T for a ±1e-8 drift below); the
``temperature-refit`` clause reads the refit, so it would flip too."""

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import softmax

from metrics.temperature_fit import fit_temperature, fit_temperature_status


@pytest.fixture(scope="module")
def data():
    """800 rows, 3 options, labels drawn at T = 1.5, and a direction of drift ``d``."""
    rng = np.random.default_rng(0)
    z = rng.normal(scale=2, size=(800, 3))
    y = np.array([rng.choice(3, p=q) for q in softmax(z / 1.5, axis=1)])
    return z, y, rng.normal(size=z.shape)


def _gradient(beta, z, y):
    """d/dβ of the mean NLL of softmax(β z): mean_i (E_p[z_i] - z_i,y_i)."""
    p = softmax(beta * z, axis=1)
    return ((p * z).sum(axis=1) - z[np.arange(len(y)), y]).mean()


def test_the_refit_is_the_root_of_the_nll_gradient(data):
    """Against an independent root finder (scipy's brentq on the gradient in β = 1/T, the NLL
    being convex in β) run to full precision."""
    z, y, _ = data
    fit = fit_temperature(z, np.ones(z.shape, bool), y)
    root = brentq(_gradient, 0.1, 10.0, args=(z, y), xtol=1e-15, rtol=1e-15)
    assert fit.status == "converged"
    assert 1 / fit.temperature == pytest.approx(root, rel=1e-13)
    assert abs(_gradient(1 / fit.temperature, z, y)) < 1e-13


def _brent_alone(z, mask, y):
    """log T where scipy's bounded Brent search stops, on the bracket fit_temperature_status
    takes (the best cell of its 41-point grid of log T over [1e-3, 1e3] and its neighbours),
    with no polish: what the refit was before."""
    from scipy.optimize import minimize_scalar

    from metrics.temperature_fit import GRID_POINTS, mean_nll

    grid = np.linspace(np.log(1e-3), np.log(1e3), GRID_POINTS)
    best = int(np.argmin([mean_nll(g, z, mask, y) for g in grid]))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, GRID_POINTS - 1)]
    return float(minimize_scalar(mean_nll, bounds=(a, b), method="bounded", args=(z, mask, y),
                                 options={"xatol": 1e-6}).x)


def test_the_refit_moves_continuously_where_brents_search_jumps(data):
    """At z + 0.20172 d, Brent's search alone sits on a boundary between two stopping points
    3.4e-7 apart in log T: some ±1e-8 drifts of the logits flip it. The polished refit (and the
    calibration fit, which shares it) moves by at most 1e-9 for every one of them (its
    first-order bound: ~1e-9)."""
    z, y, d = data
    z0 = z + 0.20172 * d
    mask = np.ones(z.shape, bool)
    brent0 = _brent_alone(z0, mask, y)
    exact0 = np.log(fit_temperature(z0, mask, y).temperature)
    status0 = np.log(fit_temperature_status(z0, mask, y).temperature)
    rng = np.random.default_rng(1)
    brent, exact, status = [], [], []
    for _ in range(12):
        moved = z0 + 1e-8 * rng.choice([-1.0, 1.0], size=z.shape)
        brent.append(_brent_alone(moved, mask, y) - brent0)
        exact.append(np.log(fit_temperature(moved, mask, y).temperature) - exact0)
        status.append(np.log(fit_temperature_status(moved, mask, y).temperature) - status0)
    assert max(np.abs(brent)) > 3e-7
    assert max(np.abs(exact)) < 1e-9 and max(np.abs(status)) < 1e-9

"""Tango's score interval and Newcombe's hybrid score interval of a paired difference (b - c)/n
(metrics/paired.py, issue #38), against published values, closed forms and an independent
inversion of the score test (the constrained likelihood maximised numerically, not by the
closed-form root)."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import norm

from metrics.paired import (newcombe_paired_interval, tango_interval, tango_intervals,
                            tango_statistic)

Z = norm.ppf(0.975)


def _score(delta, b, c, n):
    """Tango's Z at delta with p21 the constrained MLE found by maximising the trinomial
    log-likelihood over p21 (p12 = p21 + delta) numerically."""
    m = n - b - c
    lo, hi = max(0.0, -delta), (1.0 - delta) / 2.0

    def nll(p21):
        p12 = p21 + delta
        return -sum(k * math.log(p) for k, p in ((b, p12), (c, p21), (m, 1 - p12 - p21)) if k)

    p21 = lo if hi - lo < 1e-15 else minimize_scalar(
        nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-14}).x
    return (b - c - n * delta) / math.sqrt(n * (2 * p21 + delta * (1 - delta)))


def _wilson(k, n):
    centre = (k + Z ** 2 / 2) / (n + Z ** 2)
    half = Z / (n + Z ** 2) * math.sqrt(k * (n - k) / n + Z ** 2 / 4)
    return centre - half, centre + half


def test_tango_matches_the_published_example():
    """Fagerland, Lydersen & Laake (2014), Cavo et al. (2012): 6 and 16 discordant of 161 pairs,
    Tango's interval -0.1240 to -0.0054 (also contingencytables' test of
    Tango_asymptotic_score_CI_paired_2x2)."""
    low, high = tango_interval(6, 16, 161)
    assert round(low, 4) == -0.1240 and round(high, 4) == -0.0054


def test_newcombe_matches_the_published_example():
    """Same table (59 both right, 80 both wrong): Newcombe's square-and-add -0.1186 to -0.0046."""
    low, high = newcombe_paired_interval(6, 16, 161, a=59)
    assert round(float(low), 4) == -0.1186 and round(float(high), 4) == -0.0046


@pytest.mark.parametrize("b, c, n", [(6, 16, 161), (1, 7, 21), (2, 1, 800), (3, 0, 800),
                                     (40, 20, 160), (0, 5, 30), (12, 12, 1000), (1, 0, 2)])
def test_tango_ends_are_the_score_test_crossings(b, c, n):
    low, high = tango_interval(b, c, n)
    # the score statistic equals +-z at the ends, with p21 maximised numerically
    assert _score(low, b, c, n) == pytest.approx(Z, abs=1e-6)
    assert _score(high, b, c, n) == pytest.approx(-Z, abs=1e-6)
    assert tango_statistic(low, b, c, n) == pytest.approx(Z, abs=1e-9)
    assert tango_statistic(high, b, c, n) == pytest.approx(-Z, abs=1e-9)
    # brentq on the independent statistic finds the same ends
    eps = 1e-9
    assert brentq(lambda d: _score(d, b, c, n) - Z, -1 + eps, (b - c) / n) == pytest.approx(
        low, abs=1e-7)
    assert brentq(lambda d: _score(d, b, c, n) + Z, (b - c) / n, 1 - eps) == pytest.approx(
        high, abs=1e-7)


@pytest.mark.parametrize("b, c, n", [(6, 16, 161), (2, 1, 800), (0, 0, 50), (9, 0, 40)])
def test_tango_is_the_set_the_score_test_accepts_on_a_grid(b, c, n):
    def accepted(grid):
        return grid[[abs(_score(d, b, c, n)) <= Z for d in grid]]

    coarse = accepted(np.linspace(-0.999, 0.999, 1999))  # step 1e-3, then 1e-5 at each end
    fine = [accepted(np.linspace(x - 1e-3, x + 1e-3, 201)) for x in (coarse.min(), coarse.max())]
    low, high = tango_interval(b, c, n)
    assert fine[0].min() == pytest.approx(low, abs=1e-5)
    assert fine[1].max() == pytest.approx(high, abs=1e-5)
    grid = np.linspace(-0.999, 0.999, 19981)
    assert np.all(np.diff(tango_statistic(grid, b, c, n)) < 0)  # one crossing per end


def test_tango_closed_forms_at_the_edges():
    """b = c = 0: Z(d) = -sqrt(n d / (1 - d)), ends +-z^2 / (n + z^2); b = n: Z(d) =
    sqrt(n (1 - d) / (1 + d)), lower end (n - z^2) / (n + z^2), upper 1; c = 0 and d above
    b / (2n - b): p21 = 0 and Z is the Wilson score statistic of b / n."""
    q = Z ** 2
    for n in (1, 20, 800):
        assert tango_interval(0, 0, n) == (pytest.approx(-q / (n + q), rel=1e-12),
                                           pytest.approx(q / (n + q), rel=1e-12))
        assert tango_interval(n, 0, n) == (pytest.approx((n - q) / (n + q), rel=1e-12), 1.0)
        assert tango_interval(0, n, n) == (-1.0, pytest.approx(-(n - q) / (n + q), rel=1e-12))
    low = tango_interval(14, 0, 800)[0]
    assert low > 14 / (1600 - 14)
    assert low == pytest.approx(_wilson(14, 800)[0], rel=1e-12)
    assert round(low, 5) == 0.01045  # by hand: 0.019806 - 0.009354
    assert math.isnan(tango_interval(0, 0, 0)[0])


def test_tango_vectorised_equals_one_table_at_a_time():
    b, c = np.meshgrid(np.arange(0, 30, 3), np.arange(0, 20, 4))
    low, high = tango_intervals(b, c, 200)
    for i, j in np.ndindex(b.shape):
        assert (low[i, j], high[i, j]) == tango_interval(int(b[i, j]), int(c[i, j]), 200)
    assert tango_interval(6, 16, 161, confidence=0.99)[0] < tango_interval(6, 16, 161)[0]


def test_newcombe_without_correlation_is_the_wilson_square_and_add():
    """Bentur et al. (2009): a=1, b=1, c=7, d=12; ad - bc = 5 <= n/2, so phi = 0 and the ends
    are D -+ the root of the two Wilson distances squared and added."""
    n, p1, p2 = 21, 2 / 21, 8 / 21
    (l1, u1), (l2, u2) = _wilson(2, n), _wilson(8, n)
    low, high = newcombe_paired_interval(1, 7, n, a=1)
    assert float(low) == pytest.approx(p1 - p2 - math.hypot(p1 - l1, u2 - p2), rel=1e-12)
    assert float(high) == pytest.approx(p1 - p2 + math.hypot(p2 - l2, u1 - p1), rel=1e-12)


@pytest.mark.parametrize("call, msg", [
    (lambda: tango_interval(30, 20, 40), r"b \+ c <= n"),
    (lambda: tango_interval(-1, 0, 40), r"b, c >= 0"),
    (lambda: tango_interval(1.5, 0, 40), "whole numbers"),
    (lambda: tango_interval(1, 0, 40, confidence=1.0), r"confidence must be in \(0, 1\)"),
    (lambda: newcombe_paired_interval(1, 7, 21, a=14), r"a \+ b \+ c <= n"),
])
def test_bad_arguments_say_what_is_wrong(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()

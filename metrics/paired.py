"""Intervals of the difference of two rates measured on the same rows (paired binomial data).

The accuracy drop of a variant is ``(b - c) / n``: ``b`` rows the reference gets right and the
variant wrong (negative flips), ``c`` the other way round (positive flips), ``n`` labelled rows.
The checker gives it Tango's score interval (:func:`tango_interval`, method name
:data:`metrics.intervals.TANGO_PAIRED`): it inverts the score test of ``Delta = Delta0`` and
covers close to its nominal level from tens to thousands of rows, where the Bonferroni pair of
Clopper–Pearson intervals it replaced (:func:`clopper_pearson_difference`) covered 99.7–100%
at 95% and failed a variant with no real drop a third of the time. Newcombe's hybrid score
interval (:func:`newcombe_paired_interval`) is the comparison in ``bench/interval_coverage.py``
(it needs the concordant split too, not just b, c and n).

Every function here takes scalars or arrays (broadcast together) and returns floats or arrays.
"""

from functools import lru_cache

import numpy as np

#: bisection steps: the bracket (-1, 1) halves to below float spacing
_BISECTION_STEPS = 64


def _z(confidence):
    """Two-sided normal quantile ``z_{1 - a/2}``, ``a = 1 - confidence``; ValueError outside
    (0, 1)."""
    from scipy.special import ndtri

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    return float(ndtri(0.5 + confidence / 2.0))


def _counts(b, c, n):
    """b, c, n as broadcast float64 arrays of whole numbers with b, c >= 0 and b + c <= n."""
    b, c, n = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (b, c, n)))
    for bad, what in (((b != np.round(b)) | (c != np.round(c)) | (n != np.round(n)),
                       "b, c and n must be whole numbers"),
                      ((b < 0) | (c < 0) | (b + c > n), "need b, c >= 0 and b + c <= n")):
        if bad.any():
            i = tuple(int(j) for j in np.unravel_index(np.argmax(bad), bad.shape))
            raise ValueError(f"{what}, got b={b[i]:g}, c={c[i]:g}, n={n[i]:g}"
                             f"{f' (at index {i})' if bad.size > 1 else ''}.")
    return b, c, n


def tango_p21(delta, b, c, n):
    """Constrained maximum-likelihood estimate of the cell probability of ``c`` (reference wrong,
    variant right) under ``Delta = delta`` (Tango 1998): the larger root of
    ``2n x^2 + B x + C = 0`` with ``B = -b - c + (2n - b + c) delta`` and
    ``C = -c delta (1 - delta)``, taken in the form that does not cancel. Arrays broadcast;
    ``delta`` in [-1, 1]."""
    a2 = 2.0 * n
    bq = -b - c + (2.0 * n - b + c) * delta
    cq = -c * delta * (1.0 - delta)
    root = np.sqrt(np.maximum(bq * bq - 4.0 * a2 * cq, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        # -B + root when B <= 0; -2C / (B + root) when B > 0 (same root, no cancellation)
        return np.where(bq <= 0, (root - bq) / (2.0 * a2),
                        -2.0 * cq / np.where(bq > 0, bq + root, 1.0))


def tango_statistic(delta, b, c, n):
    """Tango's score statistic of ``H0: Delta = delta`` for b, c discordant rows of n,
    ``(b - c - n delta) / sqrt(n (2 p21 + delta (1 - delta)))`` with ``p21`` from
    :func:`tango_p21`; decreasing in delta, +-inf where the variance under H0 is 0 and the
    counts disagree with it, 0 where they agree exactly. Arrays broadcast; float64."""
    b, c, n = (np.asarray(x, dtype=np.float64) for x in (b, c, n))
    var = n * (2.0 * tango_p21(delta, b, c, n) + delta * (1.0 - delta))
    num = b - c - n * delta
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 / 0 (b = c = 0 at 0): Z's limit 0
        return np.where(num == 0, 0.0, num / np.sqrt(np.maximum(var, 0.0)))


def tango_intervals(b, c, n, *, confidence=0.95):
    """Tango's score interval of ``(b - c) / n``, elementwise over arrays.

    Parameters
    ----------
    b, c : int or array-like of int
        Discordant rows: b counted positive (reference right, variant wrong), c negative.
    n : int or array-like of int
        Rows (pairs), ``b + c <= n``; broadcast with b and c.
    confidence : float, default=0.95
        In (0, 1).

    Returns
    -------
    (low, high) : tuple of float64 arrays of the broadcast shape
        ``{delta in [-1, 1] : |Z(delta)| <= z_{1-a/2}}`` with Z of :func:`tango_statistic`;
        ``low = -1`` when c = n and ``high = 1`` when b = n; NaN where n = 0. The ends are
        found by bisection on (-1, 1) to float spacing (Z is decreasing in delta, so each end is
        one crossing). b = c = 0 gives ``+-z^2 / (n + z^2)``.

    Raises
    ------
    ValueError
        If a count is not a whole number, negative, ``b + c > n``, or confidence is outside
        (0, 1).

    References
    ----------
    T. Tango, "Equivalence test and confidence interval for the difference in proportions for
    the paired-sample design", Statistics in Medicine 17 (1998) 891–908;
    M. W. Fagerland, S. Lydersen and P. Laake, "Recommended tests and confidence intervals for
    paired binomial proportions", Statistics in Medicine 33 (2014) 2850–2875 (their
    Cavo et al. example, b=6, c=16, n=161: -0.1240 to -0.0054).
    """
    z = _z(confidence)
    b, c, n = _counts(b, c, n)
    ends = []
    for target in (z, -z):  # low: Z(delta) = z; high: Z(delta) = -z
        lo, hi = np.full(b.shape, -1.0), np.full(b.shape, 1.0)
        for _ in range(_BISECTION_STEPS):
            mid = lo + (hi - lo) / 2.0
            above = tango_statistic(mid, b, c, n) > target  # root lies right of mid
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        ends.append((lo + hi) / 2.0)
    low, high = ends
    low = np.where(c == n, -1.0, low)
    high = np.where(b == n, 1.0, high)
    empty = n == 0
    return np.where(empty, np.nan, low), np.where(empty, np.nan, high)


@lru_cache(maxsize=4096)  # the same (b, c, n) recurs across clauses, strata and variants
def tango_interval(b, c, n, *, confidence=0.95):
    """Tango's score interval of ``(b - c) / n`` for one table: :func:`tango_intervals` of
    scalars, as a tuple of two floats (``(nan, nan)`` when n = 0). Raises as it does.

    Examples
    --------
    >>> [round(x, 4) for x in tango_interval(6, 16, 161)]  # Fagerland et al. 2014, Cavo et al.
    [-0.124, -0.0054]
    """
    low, high = tango_intervals(b, c, n, confidence=confidence)
    return float(low), float(high)


def _wilson(k, n, z):
    """Wilson score interval of k events in n (arrays), as (low, high)."""
    centre = (k + z * z / 2.0) / (n + z * z)
    half = z / (n + z * z) * np.sqrt(k * (n - k) / n + z * z / 4.0)
    return centre - half, centre + half


def newcombe_paired_interval(b, c, n, *, a, confidence=0.95):
    """Newcombe's hybrid score interval of ``(b - c) / n`` for paired rows (method 10).

    Parameters
    ----------
    b, c, n : int or array-like of int
        As :func:`tango_intervals`.
    a : int or array-like of int
        Rows both get right (the concordant split matters here, unlike Tango's interval);
        ``a + b + c <= n``, the rest ``d = n - a - b - c`` both wrong.
    confidence : float, default=0.95

    Returns
    -------
    (low, high) : tuple of float64 arrays
        ``D - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)`` and
        ``D + sqrt((p2 - l2)^2 - 2 phi (p2 - l2)(u1 - p1) + (u1 - p1)^2)``, ``D = (b - c)/n``,
        ``p1 = (a + b)/n`` (reference accuracy) and ``p2 = (a + c)/n`` (variant accuracy) with
        Wilson intervals ``[l1, u1]``, ``[l2, u2]``; ``phi`` the phi coefficient of the table
        with Newcombe's continuity correction (``ad - bc`` moved n/2 towards 0 when positive, 0
        in between, left alone when negative; 0 when a margin is empty). NaN where n = 0.

    Raises
    ------
    ValueError
        If a count is not a whole number, negative, ``a + b + c > n``, or confidence is outside
        (0, 1).

    References
    ----------
    R. G. Newcombe, "Improved confidence intervals for the difference between binomial
    proportions based on paired data", Statistics in Medicine 17 (1998) 2635–2650, method 10;
    Fagerland et al. 2014 ("Newcombe square-and-add"; Cavo et al., b=6, c=16, n=161, a=59:
    -0.1186 to -0.0046).
    """
    z = _z(confidence)
    b, c, n = _counts(b, c, n)
    a, b, c, n = np.broadcast_arrays(np.asarray(a, dtype=np.float64), b, c, n)
    bad = (a != np.round(a)) | (a < 0) | (a + b + c > n)
    if bad.any():
        i = tuple(int(j) for j in np.unravel_index(np.argmax(bad), bad.shape))
        raise ValueError(f"need a whole a >= 0 with a + b + c <= n, got a={a[i]:g}, b={b[i]:g}, "
                         f"c={c[i]:g}, n={n[i]:g}.")
    d = n - a - b - c
    with np.errstate(divide="ignore", invalid="ignore"):
        p1, p2 = (a + b) / n, (a + c) / n
        l1, u1 = _wilson(a + b, n, z)
        l2, u2 = _wilson(a + c, n, z)
        margins = (a + b) * (c + d) * (a + c) * (b + d)
        cross = a * d - b * c
        corrected = np.where(cross > n / 2.0, cross - n / 2.0, np.where(cross >= 0, 0.0, cross))
        phi = np.where(margins > 0, corrected / np.sqrt(np.where(margins > 0, margins, 1.0)), 0.0)
        diff = p1 - p2
        low = diff - np.sqrt(np.maximum((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)
                                        + (u2 - p2) ** 2, 0.0))
        high = diff + np.sqrt(np.maximum((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)
                                         + (u1 - p1) ** 2, 0.0))
    return low, high


def clopper_pearson_difference(b, c, n, *, confidence=0.95):
    """The Bonferroni pair of Clopper–Pearson intervals for ``(b - c) / n`` (one scalar table):
    each rate's exact interval at level ``1 - (1 - confidence) / 2``, the far ends combined.
    The checker's accuracy-drop interval before issue #38 (method name
    ``"clopper-pearson-difference"`` in older verdict files); kept as the comparison in
    ``bench/interval_coverage.py``: coverage at least ``confidence`` whatever the pairing, and
    99.7–100% at 95% on a few hundred rows.

    Returns
    -------
    (low, high) : tuple of float
        In [-1, 1]; ``(nan, nan)`` when n = 0.

    Raises
    ------
    ValueError
        As :func:`metrics.intervals.clopper_pearson`, or if ``b + c > n``.
    """
    from metrics.intervals import clopper_pearson

    if b + c > n:
        raise ValueError(f"need b + c <= n, got b={b}, c={c}, n={n}.")
    level = 1.0 - (1.0 - confidence) / 2.0
    lo_b, hi_b = clopper_pearson(b, n, confidence=level)
    lo_c, hi_c = clopper_pearson(c, n, confidence=level)
    return lo_b - hi_c, hi_b - lo_c

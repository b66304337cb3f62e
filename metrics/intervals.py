"""Exact (Clopper–Pearson) intervals for rates and counts of yes/no events, and the names of the
interval methods a figure can carry.

A percentile bootstrap of a rate with 0 (or n) events in n examples resamples nothing but zeros
(ones) and gives the zero-width interval [0, 0] ([1, 1]): with 0 flips in 20 examples a clause
"upper CI bound of the flip rate <= 0.01" would pass. The Clopper–Pearson interval is honest at 0
and n (its 95% upper bound at 0 of 20 is 1 - 0.025^(1/20) = 0.168) and never undercovers. A
difference of two rates on the same examples (the accuracy drop) has the same zero-width problem
and gets Tango's score interval for paired proportions (:func:`metrics.paired.tango_interval`:
+-0.161 at 0 and 0 of 20, and close to nominal coverage elsewhere, where the Bonferroni pair of
Clopper–Pearson intervals it replaced covered 99.7–100% at 95%; docs/contracts.md, "How good the
intervals are").
"""

import math
from functools import lru_cache

#: Names of the interval methods, as written into verdict.json, report.json and the reports.
CLOPPER_PEARSON = "clopper-pearson"
TANGO_PAIRED = "tango-paired-score"
BOOTSTRAP_PERCENTILE = "bootstrap-percentile"
INTERVAL_METHODS = (CLOPPER_PEARSON, TANGO_PAIRED, BOOTSTRAP_PERCENTILE)
#: The accuracy drop's method before issue #38 (Bonferroni Clopper–Pearson pair), as results
#: saved then name it; nothing computes it for a clause any more.
CLOPPER_PEARSON_DIFFERENCE = "clopper-pearson-difference"


@lru_cache(maxsize=4096)  # the same (k, n) recurs across clauses, strata and variants
def clopper_pearson(k, n, *, confidence=0.95):
    """Exact two-sided interval of a binomial proportion from k events in n trials.

    Parameters
    ----------
    k : int
        Events, ``0 <= k <= n``.
    n : int
        Trials (examples), ``>= 0``.
    confidence : float, default=0.95
        In (0, 1).

    Returns
    -------
    (low, high) : tuple of float
        ``low = Beta.ppf(a/2; k, n-k+1)`` (0 when k = 0) and ``high = Beta.ppf(1-a/2; k+1, n-k)``
        (1 when k = n), ``a = 1 - confidence``; ``(nan, nan)`` when n = 0.

    Raises
    ------
    ValueError
        If k or n is not a whole number, ``k`` is outside [0, n], or ``confidence`` is outside
        (0, 1).

    References
    ----------
    C. J. Clopper and E. S. Pearson, "The use of confidence or fiducial limits illustrated in the
    case of the binomial", Biometrika 26 (1934); computed by
    ``scipy.stats.binomtest(k, n).proportion_ci(confidence, method="exact")``'s own method (a
    Brent root of the binomial tail, :func:`_exact_limits`), bit for bit, without importing
    ``scipy.stats`` (about 0.6 s of every ``variants check``).
    """

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    if k != int(k) or n != int(n) or not 0 <= k <= n:
        raise ValueError(f"need whole numbers 0 <= k <= n, got k={k}, n={n}.")
    k, n = int(k), int(n)
    if n == 0:
        return float("nan"), float("nan")
    return _exact_limits(k, n, (1.0 - confidence) / 2.0)


def _exact_limits(k, n, alpha):
    """The two-sided exact limits as SciPy's ``scipy.stats._binomtest._binom_exact_conf_int``
    computes them: ``brentq`` on [0, 1] (default tolerances) of ``binom.sf(k - 1; n, p) - alpha``
    (low) and ``binom.cdf(k; n, p) - alpha`` (high), with the same Boost binomial ufuncs that
    ``scipy.stats.binom`` calls. ``tests/metrics/test_metric_edges.py`` checks it equals ``binomtest``
    exactly over a grid of (k, n), so a SciPy change that moves either shows there."""
    from scipy.optimize import brentq
    from scipy.special._ufuncs import _binom_cdf, _binom_sf

    low = 0.0 if k == 0 else brentq(lambda p: _binom_sf(k - 1.0, n, p) - alpha, 0, 1)
    high = 1.0 if k == n else brentq(lambda p: _binom_cdf(float(k), n, p) - alpha, 0, 1)
    return float(low), float(high)


def clopper_pearson_count(k, n, *, confidence=0.95):
    """Interval of the event count: ``n`` times :func:`clopper_pearson` (same arguments)."""
    low, high = clopper_pearson(k, n, confidence=confidence)
    return (n * low, n * high) if not math.isnan(low) else (low, high)

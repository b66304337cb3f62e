"""How many rows would decide an undecided clause.

A clause compared on its interval (``compare = "ci"``) is **undecided** when its point value meets
the threshold but the interval's far end does not: the rows at hand cannot tell a variant that
meets the bound from one that does not. More rows narrow the interval; at the observed rate (or
spread) its half-width shrinks as ``1 / sqrt(n)`` (the normal approximation behind every
interval the checker uses: Clopper–Pearson, Tango's paired score interval and the percentile
bootstrap all have that width to first order), so the far end meets the threshold once

    n' >= n * (half-width / distance of the value from the threshold) ** 2.

The figure is an estimate at the observed rate, said as such ("about N rows"); it is not a
power calculation. No MLX.
"""

import math

#: the largest row count reported; beyond it the clause is said to need "more than" this
MAX_ROWS = 10_000_000


def rows_needed(value, far_end, threshold, n):
    """About how many rows (in all, not more) would decide an undecided clause.

    Parameters
    ----------
    value : float
        The clause's point value (meets ``threshold``).
    far_end : float
        The interval's end the clause compares (beyond ``threshold``).
    threshold : float
        The clause's bound.
    n : int
        Rows the value was computed on (the clause's support).

    Returns
    -------
    int or None
        ``ceil(n * ((far_end - value) / (threshold - value)) ** 2)``, capped at
        :data:`MAX_ROWS`; None when it cannot be said (n < 1, a NaN, or the value equal to the
        threshold: no finite number of rows decides it at the observed rate).
    """
    if n is None or n < 1 or any(math.isnan(x) for x in (value, far_end, threshold)):
        return None
    gap = abs(threshold - value)
    half = abs(far_end - value)
    if gap == 0.0:
        return None
    need = math.ceil(n * (half / gap) ** 2)
    return int(min(max(need, n + 1), MAX_ROWS))

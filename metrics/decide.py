"""How many rows a clause compared on its interval needs, and the smallest violation n rows show.

A clause with ``compare = "ci"`` passes when its interval's far end clears the threshold (the
upper end ``<= max``, the lower end ``>= min``). Two questions follow from a run's row count n:

- :func:`rows_to_decide`: with the observed rates held fixed, how many rows would the far end
  need to clear the threshold (None when the observed value itself does not clear it: more rows
  only narrow the interval around it);
- :func:`smallest_detectable`: how far beyond the threshold a value must be for its interval to
  exclude the threshold on n rows (the smallest violation the run can show).

Both work for the three interval methods of :data:`metrics.intervals.INTERVAL_METHODS`:
Clopper–Pearson (a rate of k events), Tango's paired score interval (a difference
``(b - c) / n``) and the percentile bootstrap (given its observed half-width, scaled as
``1/sqrt(n)``).
"""

import math

from metrics.intervals import BOOTSTRAP_PERCENTILE, CLOPPER_PEARSON, TANGO_PAIRED, clopper_pearson
from metrics.paired import tango_interval

OPS = ("<=", ">=")
#: the doubling search gives up beyond this many rows (RuntimeError; not reached by any value
#: strictly inside the threshold whose rate is representable in float64)
_MAX_ROWS = 2 ** 62


def _check(method, n, op, confidence):
    if method not in (CLOPPER_PEARSON, TANGO_PAIRED, BOOTSTRAP_PERCENTILE):
        raise ValueError(f"method must be one of {CLOPPER_PEARSON!r}, {TANGO_PAIRED!r}, "
                         f"{BOOTSTRAP_PERCENTILE!r}, got {method!r}.")
    if op not in OPS:
        raise ValueError(f"op must be '<=' (a max clause) or '>=' (a min clause), got {op!r}.")
    if n != int(n) or n < 1:
        raise ValueError(f"n must be a whole number >= 1, got {n}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")


def _need(name, x):
    if x is None:
        raise ValueError(f"{name} is required for this method; pass the observed {name}.")
    return x


def _far_end_at(method, n, op, confidence, k, b, c, value, half_width):
    """``(point value, far_end(rows))``: the interval's end on the threshold's side at ``rows``
    rows with the observed rates held (counts ``round(rate * rows)``)."""
    upper = op == "<="
    if method == CLOPPER_PEARSON:
        k = _need("k", k)
        if not 0 <= k <= n:
            raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}.")

        def far(rows):
            return clopper_pearson(round(k / n * rows), rows, confidence=confidence)[upper]
        return k / n, far
    if method == TANGO_PAIRED:
        b, c = _need("b", b), _need("c", c)
        if b < 0 or c < 0 or b + c > n:
            raise ValueError(f"need b, c >= 0 and b + c <= n, got b={b}, c={c}, n={n}.")

        def far(rows):
            bs = round(b / n * rows)
            return tango_interval(bs, min(round(c / n * rows), rows - bs), rows,
                                  confidence=confidence)[upper]
        return (b - c) / n, far
    value, half_width = _need("value", value), _need("half_width", half_width)
    if not half_width >= 0:
        raise ValueError(f"half_width must be >= 0, got {half_width}.")
    sign = 1.0 if upper else -1.0
    return value, lambda rows: value + sign * half_width * math.sqrt(n / rows)


def _first(shows, top):
    """The smallest x in [0, top] with ``shows(x)`` (false, then true as x grows), or None."""
    if not shows(top):
        return None
    lo, hi = -1, top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if shows(mid) else (mid, hi)
    return hi


def rows_to_decide(method, *, n, threshold, op, confidence=0.95, k=None, b=None, c=None,
                   value=None, half_width=None):
    """The fewest rows n' >= n on which the interval's far end would clear the threshold, the
    observed rates held fixed.

    Parameters
    ----------
    method : {'clopper-pearson', 'tango-paired-score', 'bootstrap-percentile'}
        The clause's interval (:data:`metrics.intervals.INTERVAL_METHODS`).
    n : int
        Rows observed, >= 1.
    threshold : float
        The clause's ``max`` (op ``"<="``) or ``min`` (op ``">="``), in the metric's units.
    op : {'<=', '>='}
        ``"<="``: decided when the upper end is ``<= threshold``; ``">="``: the lower end
        ``>= threshold``.
    confidence : float, default=0.95
    k : int, optional
        Clopper–Pearson: events observed in n (the rate ``k/n`` is held; ``round(k/n * n')``
        events at n').
    b, c : int, optional
        Tango: rows counted positive and negative in ``(b - c)/n`` (both rates held).
    value, half_width : float, optional
        Bootstrap: the observed value and the distance from it to the far end (``high - value``
        for ``"<="``, ``value - low`` for ``">="``), which shrinks as ``sqrt(n / n')``.

    Returns
    -------
    int or None
        n when the interval already clears the threshold; None when the point value does not
        strictly clear it (more rows cannot help); else the smallest n' found by doubling from n
        and bisecting. Rounding the counts makes the far end slightly non-monotone in n', so a
        smaller n' can clear the threshold by a rounding accident; the answer is the first
        crossing the bisection finds.

    Raises
    ------
    ValueError
        If the method or op is unknown, n < 1, confidence outside (0, 1), a count the method
        needs is missing or out of range.

    Examples
    --------
    >>> rows_to_decide("clopper-pearson", k=0, n=20, threshold=0.01, op="<=")
    368
    """
    _check(method, n, op, confidence)
    point, far = _far_end_at(method, n, op, confidence, k, b, c, value, half_width)

    def decided(rows):
        end = far(rows)
        return end <= threshold if op == "<=" else end >= threshold

    if decided(n):
        return int(n)
    if not (point < threshold if op == "<=" else point > threshold):
        return None
    lo, hi = int(n), 2 * int(n)
    while not decided(hi):
        lo, hi = hi, 2 * hi
        if hi > _MAX_ROWS:
            raise RuntimeError(f"no row count up to 2**62 decides (value {point} against "
                               f"threshold {threshold}).")
    while hi - lo > 1:  # lo does not decide, hi does
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid, hi)
    return hi


def smallest_detectable(method, n, *, threshold, op, confidence=0.95, b=None, c=None,
                        half_width=None):
    """The smallest violation n rows can show: how far past the threshold an observed value must
    lie for its interval to exclude the threshold.

    For a ``max`` clause (op ``"<="``) the smallest observed value whose interval's lower end is
    ``> threshold``, minus the threshold; for a ``min`` clause (``">="``) the threshold minus
    the largest observed value whose upper end is ``< threshold``.

    Parameters
    ----------
    method : {'clopper-pearson', 'tango-paired-score', 'bootstrap-percentile'}
    n : int
        Rows, >= 1.
    threshold : float
    op : {'<=', '>='}
    confidence : float, default=0.95
    b, c : int, optional
        Tango: the count on the threshold's far side is held at its observed value and the
        other one varies: op ``"<="`` holds ``c`` (positive flips; the drop grows with negative
        flips b), op ``">="`` holds ``b``. (Holding b + c instead caps the difference at
        ``(b + c)/n``, so few discordant rows could show no violation at all.)
    half_width : float, optional
        Bootstrap: the distance from the value to the far end of its interval on n rows; the
        answer is that distance (a value further than it past the threshold shows).

    Returns
    -------
    float or None
        The violation, > 0, in the metric's units; None when no count in [0, n] shows one
        (e.g. a rate clause ``max = 1``).

    Raises
    ------
    ValueError
        As :func:`rows_to_decide`.

    Examples
    --------
    >>> round(smallest_detectable("clopper-pearson", 100, threshold=0.01, op="<="), 12)
    0.03
    """
    _check(method, n, op, confidence)
    n, upper = int(n), op == "<="
    if method == BOOTSTRAP_PERCENTILE:
        return float(_need("half_width", half_width))
    # x counts away from the threshold's pass side: the value grows with x for "<=" and falls
    # with it for ">=", so "shows" turns from false to true once as x goes 0..top
    if method == CLOPPER_PEARSON:
        top = n

        def table(x):
            return x if upper else n - x

        def value(x):
            return table(x) / n

        def end(x):
            return clopper_pearson(table(x), n, confidence=confidence)[0 if upper else 1]
    else:
        name = "c" if upper else "b"
        held = _need(name, c if upper else b)
        if not 0 <= held <= n:
            raise ValueError(f"need 0 <= {name} <= n, got {name}={held}, n={n}.")
        top = n - held

        def table(x):  # (b, c): x negative flips against held positive ones, or the reverse
            return (x, held) if upper else (held, x)

        def value(x):
            bx, cx = table(x)
            return (bx - cx) / n

        def end(x):
            return tango_interval(*table(x), n, confidence=confidence)[0 if upper else 1]

    x = _first(lambda x: end(x) > threshold if upper else end(x) < threshold, top)
    if x is None:
        return None
    return value(x) - threshold if upper else threshold - value(x)

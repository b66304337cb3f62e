"""What a clause's row count can decide: the rows an undecided clause needs, and the smallest
violation the rows at hand can show.

A clause compared on its interval (``compare = "ci"``) is **undecided** when its point value meets
the threshold but the interval's far end does not: the rows at hand cannot tell a variant that
meets the bound from one that does not. :func:`decision_facts` says, for one clause result,

- ``rows_needed`` (undecided clauses): the fewest rows on which the far end would meet the
  threshold with the observed rates held fixed (:func:`metrics.decide.rows_to_decide`: exact for
  Clopper–Pearson rates and Tango's paired interval, the ``1/sqrt(n)`` scaling of the observed
  half-width for the bootstrap) — an estimate at the observed rate, not a power calculation;
- ``detectable`` (every clause with an interval on a rate, a paired difference or a bootstrap
  figure): the smallest violation the clause's n rows can show at the clause's confidence
  (:func:`metrics.decide.smallest_detectable`), in the metric's units.

``count`` clauses (a number of events, ``max = 0``) have neither: their threshold does not
scale with the rows, and one compared on its interval is never undecided (more rows widen a
count's interval: it fails). A bootstrap clause on fewer than :data:`MIN_BOOTSTRAP_ROWS` rows
says no detectable violation. No MLX.
"""

import math

from metrics.intervals import BOOTSTRAP_PERCENTILE, CLOPPER_PEARSON, TANGO_PAIRED

#: a bootstrap interval of fewer rows says nothing about the violations they could show (one
#: row resamples to itself: a zero-width interval)
MIN_BOOTSTRAP_ROWS = 10


def _counts(ev, clause, value, n):
    """Keyword counts of ``clause``'s interval for :mod:`metrics.decide` (None: not a method
    it handles)."""
    method = ev.interval_method(clause.metric, clause.statistic)
    if method == CLOPPER_PEARSON and clause.statistic != "count":
        return method, {"k": int(round(value * n))}
    if method == TANGO_PAIRED:
        b = int(ev.value("negative_flip", clause.stratum, "count"))
        c = int(ev.value("positive_flip", clause.stratum, "count"))
        return method, {"b": b, "c": c}
    if method == BOOTSTRAP_PERCENTILE:
        return method, {}
    return None, None


def decision_facts(ev, clause, value, low, high, n, confidence, undecided):
    """``(rows_needed, detectable)`` of one clause (module docstring); None where not said.

    Parameters
    ----------
    ev : metrics.evaluation.Evaluation
    clause : contracts.contract.Clause
    value, low, high : float
        The point value and its interval (NaN when not computed).
    n : int
        Rows behind the value.
    confidence : float
        The interval's level.
    undecided : bool
        Whether the clause is undecided (only then is ``rows_needed`` computed).
    """
    from metrics.decide import rows_to_decide, smallest_detectable

    if n < 1 or any(math.isnan(x) for x in (value, low, high)):
        return None, None
    method, counts = _counts(ev, clause, value, n)
    if method is None:
        return None, None
    far = high if clause.op == "<=" else low
    near = low if clause.op == "<=" else high
    kw = dict(threshold=clause.threshold, op=clause.op, confidence=confidence)
    try:
        if method == BOOTSTRAP_PERCENTILE:
            # rows: the far end must come to the threshold; a violation shows once the near
            # end passes it (for a max clause, the lower end above the max)
            need = (rows_to_decide(method, n=n, value=value, half_width=abs(far - value), **kw)
                    if undecided else None)
            seen = (smallest_detectable(method, n, half_width=abs(value - near), **kw)
                    if n >= MIN_BOOTSTRAP_ROWS else None)
        else:
            need = rows_to_decide(method, n=n, **counts, **kw) if undecided else None
            seen = smallest_detectable(method, n, **{k: v for k, v in counts.items()
                                                      if k in ("b", "c")}, **kw)
    except (ValueError, RuntimeError):  # a count out of range, or beyond 2**62 rows: not said
        return None, None
    return need, (None if seen is None else float(seen))

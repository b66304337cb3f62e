"""Selection by confidence bounds: on the search split a candidate passes only when each clause's
interval, not just its point value, clears the threshold (the default; ``--select value`` is the
point-value rule).

The interval is the one the checker reports (:meth:`metrics.evaluation.Evaluation.ci`):
Clopper–Pearson for rates of events, Tango's paired score interval for the accuracy drop, the
seeded percentile bootstrap for percentiles, means and set metrics (ECE, Brier). A clause with a
``max`` bound is compared on the interval's upper end, one with a ``min`` bound on its lower
end (the contract's ``compare = "ci"``). Why: a candidate that only just passes on the search
split's sample passes on another sample about half the time; asking the bound to pass asks for
the headroom the sampling noise needs. Three kinds are treated apart:

- the temperature refit ratio has no interval in the checker (a refit per resample is slow);
  here it gets a percentile bootstrap of :data:`N_REFIT_BOOTSTRAP` resamples (same seed and
  level), a resample whose refit runs to a bound counting as failing;
- the split-conformal coverage (``within_conformal``, :data:`VALUE_ONLY`) keeps its value: it
  tests exchangeability, and its threshold already holds the sampling headroom;
- ``count`` clauses (``max = 0`` certified flips, bound violations, mask mismatches) keep the
  observed count: the Clopper–Pearson upper bound of 0 events in n rows is above 0 for every n
  (it would reject every candidate), and a single event already fails.

The ``max`` statistic's bootstrap upper end is the sample maximum itself; its headroom is
``--search-margin`` (:mod:`variants.search.margin`). No MLX.
"""

import math
from dataclasses import replace

import numpy as np

from metrics.registry import spec

SELECT = ("bound", "value")
#: bootstrap resamples of the temperature refit ratio on the search split
N_REFIT_BOOTSTRAP = 200
#: metrics without a checker interval that get one here (a resampled set metric)
RESAMPLED = ("temperature_refit_log_ratio",)
#: metrics compared on their value even under the bound rule: the split-conformal coverage
#: tests exchangeability, not the approximation — the reference recomputed on another compute
#: path (the null control) covers 1 - alpha on average whatever it is, and its contract bound
#: already leaves the sampling headroom (default 0.92 at alpha 0.05: ~2.7 standard errors on
#: 800 rows); under its lower 95% bound the null control failed 29 of 300 resampled 800 + 800
#: row copies, on its value 2 of 300 (bench/null_control.py, 2026-12-07)
VALUE_ONLY = ("within_conformal",)


def boundable(clause):
    """Whether ``clause`` is compared on its interval under the bound rule (module docstring)."""
    if clause.statistic == "count" or clause.metric in VALUE_ONLY:
        return False
    return spec(clause.metric).interval is not None or clause.metric in RESAMPLED


def bounded(contract):
    """``contract`` with ``compare = "ci"`` on every :func:`boundable` clause."""
    clauses = tuple(replace(c, compare="ci") if boundable(c) else c for c in contract.clauses)
    return replace(contract, clauses=clauses)


def complete_bounds(ev, verdict, n_boot=N_REFIT_BOOTSTRAP):
    """``verdict`` with the :data:`RESAMPLED` clauses compared on ``compare = "ci"`` given their
    bootstrap interval (the checker leaves them without one): ``(low, high)`` percentile bounds
    of ``n_boot`` resamples of the stratum's rows (seed and level from ``verdict.settings``),
    NaN resamples (a refit at a bound) counted as the worst case (+inf for a ``max`` bound,
    -inf for a ``min`` one). A clause whose point value is NaN keeps its reason."""
    from metrics.bootstrap import bootstrap_ci
    from metrics.decide import rows_to_decide
    from metrics.intervals import BOOTSTRAP_PERCENTILE

    results = []
    for r in verdict.results:
        if r.metric not in RESAMPLED or r.compare != "ci" or math.isnan(r.value):
            results.append(r)
            continue
        rows = np.flatnonzero(ev.rows(r.stratum))
        worst = math.inf if r.op == "<=" else -math.inf
        compute = spec(r.metric).compute

        def stat(idx, rows=rows, compute=compute, worst=worst):
            v = float(compute(ev, rows[idx][None, :])[0])
            return worst if math.isnan(v) else v

        low, high = bootstrap_ci(stat, rows.size, n_boot=n_boot,
                                 confidence=verdict.settings.get("confidence", 0.95),
                                 seed=verdict.settings.get("seed", 0))
        far = high if r.op == "<=" else low
        passed = bool(far <= r.threshold) if r.op == "<=" else bool(far >= r.threshold)
        meets = r.value <= r.threshold if r.op == "<=" else r.value >= r.threshold
        undecided = bool(not passed and meets and not r.reason)
        results.append(replace(r, ci_low=low, ci_high=high, interval="bootstrap-percentile",
                               passed=passed, undecided=undecided,
                               rows_needed=rows_to_decide(
                                   BOOTSTRAP_PERCENTILE, n=r.n, value=r.value,
                                   half_width=abs(far - r.value), threshold=r.threshold,
                                   op=r.op) if undecided and r.n >= 1 and math.isfinite(far)
                               else None))  # no interval on these rows: no row estimate
    return replace(verdict, results=tuple(results))


def rows_needed(clause, confidence=0.95):
    """The fewest rows on which a rate clause's Clopper–Pearson bound can pass at all (every row
    favourable: k = n events for a ``min`` bound, 0 for a ``max`` one), or None for a clause
    that is not a rate with that interval or whose bound no sample size reaches. The two-sided
    interval's far end: ``(a/2)^(1/n)`` for n of n, ``1 - (a/2)^(1/n)`` for 0 of n, with
    ``a = 1 - confidence``."""
    from metrics.intervals import CLOPPER_PEARSON

    s = spec(clause.metric)
    if clause.statistic != "rate" or s.interval != CLOPPER_PEARSON or clause.compare != "ci":
        return None
    tail = (1 - confidence) / 2
    target = clause.threshold if clause.op == ">=" else 1 - clause.threshold
    if not 0 < target < 1:
        return None
    return math.ceil(math.log(tail) / math.log(target))


def unreachable(contract, n_rows, confidence=0.95):
    """``[(clause id, rows needed)]`` of the ``all``- and ``decided``-stratum rate clauses whose bound cannot
    pass on ``n_rows`` rows whatever the candidate (:func:`rows_needed`)."""
    out = []
    for c in contract.clauses:
        # "decided" is every row but the numerical ties (none, or a few): as many as "all"
        need = rows_needed(c, confidence) if c.stratum in ("all", "decided") else None
        if need is not None and need > n_rows:
            out.append((c.id, need))
    return out

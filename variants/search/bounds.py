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
    from metrics.intervals import clopper_pearson

    tail = (1 - confidence) / 2
    target = clause.threshold if clause.op == ">=" else 1 - clause.threshold
    if not 0 < target < 1:
        return None
    n = max(1, math.ceil(math.log(tail) / math.log(target)))

    def passes(m):  # the interval the checker uses decides, not the closed form's last ulp
        if clause.op == ">=":
            return clopper_pearson(m, m, confidence=confidence)[0] >= clause.threshold
        return clopper_pearson(0, m, confidence=confidence)[1] <= clause.threshold

    while not passes(n):
        n += 1
    while n > 1 and passes(n - 1):
        n -= 1
    return n


def unreachable(contract, n_rows, confidence=0.95, n_labelled=None):
    """``[(clause id, rows needed, rows there)]`` of the ``all``- and ``decided``-stratum rate
    clauses whose bound cannot pass on ``n_rows`` rows whatever the candidate
    (:func:`rows_needed`). A clause on a metric that needs labels counts the ``n_labelled``
    labelled rows (None: every row is); with none it has no examples, which does not fail a
    verdict (:mod:`contracts.checker`), so it is not listed. "decided" is every row but the
    numerical ties (none, or a few; known only once the reference ran): counting every row,
    a clause listed here cannot pass on the decided ones either."""
    out = []
    for c in contract.clauses:
        need = rows_needed(c, confidence) if c.stratum in ("all", "decided") else None
        have = n_labelled if n_labelled is not None and spec(c.metric).needs_labels else n_rows
        if need is not None and have > 0 and need > have:
            out.append((c.id, need, have))
    return out


def check_rows(contract, n_search, labels, select, confidence=0.95):
    """Raise ValueError (one line: the rows there, the rows needed, the fix) when some clause of
    the search's ``contract`` cannot pass on the search-eval rows whatever the candidate
    (:func:`unreachable`): the row-count arithmetic, done before any sensitivity or candidate
    work. ``labels``: the search-eval rows' labels ((N,) int, -1 unlabelled); ``n_search``:
    the search split's rows (``n_search // 2`` calibration, the rest eval, as
    :func:`variants.search.split.search_tasksets` halves it); ``select``: ``--select``."""
    labels = np.asarray(labels)
    n, n_lab = int(labels.size), int((labels >= 0).sum())
    far = unreachable(contract, n, confidence, n_labelled=n_lab)
    if not far:
        return
    # search-eval rows that would do: the labelled share of the rows taken as it is here
    rows = max(need if have == n else math.ceil(need * n / have) for _, need, have in far)
    labelled = any(have < n for _, _, have in far)
    looser = ("judge point values with --select value" if select == "bound" else
              'drop compare = "ci" from those clauses of the contract')
    raise ValueError(
        f"--n-search {n_search} gives {n} search-eval rows"
        + (f" ({n_lab} labelled)" if labelled else "") + ", but no candidate can pass "
        + ", ".join(f"{i} on fewer than {need}" + (" labelled" if have < n else "")
                    for i, need, have in far)
        + f" (the {confidence:.0%} confidence bound of a rate with no error at all); raise "
        f"--n-search to {2 * rows - 1} or more (--data with more fit-split rows"
        + (", labelled," if labelled else "") + f" if it has fewer), or {looser}")

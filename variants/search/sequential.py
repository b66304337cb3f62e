"""Exact sequential stopping: a candidate's verdict on the search-eval split decided from a
prefix of it, only when no completion of the unseen rows could change it.

After ``n`` of ``N`` eval rows, the unseen rows are filled with the *best case*: the variant's
outputs equal to the reference's there, so every drift column is exactly 0 and every event
column is favourable (agreement, within the conformal ε: True; flips, violations: False).
A clause is **settled failing** when it does not pass on that completion (it fails, or is
undecided: its value meets the threshold, its bound does not) and its statistic is monotone in
each example, in the favourable direction:

- bool columns, ``rate`` / ``count``, compared on the value or on the Clopper–Pearson bound
  (monotone in the event count for a fixed N): the best completion adds no bad event;
- float columns, ``max`` and the percentiles (``p50`` ... ``p999``), compared on the value or
  on the upper end of their seeded percentile bootstrap, lower is better: a max only grows, a
  percentile is non-decreasing in each element and 0 is the smallest drift, and so is the
  upper percentile of the statistic over resamples whose row indices depend only on the seed
  and N;
- not settled: set-level ``value`` metrics (ECE, Brier, accuracy drop, the temperature refit:
  an unseen example can move them either way), ``mean`` / ``rms`` / ``min``, other bootstrap
  comparisons, clauses against the metric's own direction, and the ``epsilon_held`` stratum
  (its rows depend on the variant's outputs).

Every other stratum's rows are fixed by the reference, the labels and the calibration ε, all of
which are known in full before the first eval chunk (the calibration split is run whole first).
So a settled failure is no pass on the full split (a failure, or undecided): stopping never
flips a verdict
(``tests/search/test_search.py`` compares stopped and full evaluations on many perturbed candidates).
Passing is never settled early (an unseen example may always break a ``max``). No MLX.
"""

import numpy as np

from metrics.intervals import BOOTSTRAP_PERCENTILE, CLOPPER_PEARSON
from metrics.registry import BOOL, FLOAT, spec
from metrics.statistics import PERCENTILES
from runs.npz_readers import OUTPUT_FIELDS

#: strata whose rows depend on the variant's eval outputs: never settled
VARIANT_STRATA = ("epsilon_held",)


def settleable(clause):
    """Whether ``clause`` (a :class:`contracts.checker.Clause` or ClauseResult) can be settled
    failing from a prefix (module docstring)."""
    if clause.metric == "nonfinite_rows":  # a count of NaN / inf rows only grows with rows
        return clause.op == "<="
    if clause.stratum in VARIANT_STRATA:
        return False
    s = spec(clause.metric)
    good_high = clause.op == ">="
    if s.higher_is_better is None or s.higher_is_better != good_high:
        return False
    if s.kind == BOOL and clause.statistic in ("rate", "count"):
        return clause.compare == "value" or s.interval == CLOPPER_PEARSON
    if s.kind == FLOAT and not good_high and (clause.compare == "value"
                                              or s.interval == BOOTSTRAP_PERCENTILE):
        return clause.statistic == "max" or clause.statistic in PERCENTILES
    return False


def complete(ref_eval, var_seen):
    """The best-case completion: the first ``n = len(var_seen['ids'])`` rows the variant's, the
    rest the reference's. Both are mappings of the ``DecisionOutputs`` fields; returns a dict of
    the :data:`runs.npz_readers.OUTPUT_FIELDS`, N rows each. Raises ValueError when the seen
    ids are not the reference's first n."""
    n = len(var_seen["ids"])
    if not np.array_equal(np.asarray(var_seen["ids"]), np.asarray(ref_eval["ids"])[:n]):
        raise ValueError("the variant's eval rows are not a prefix of the reference's")
    return {k: np.concatenate([np.asarray(var_seen[k]), np.asarray(ref_eval[k])[n:]])
            for k in OUTPUT_FIELDS}


def interim_settings(contract, settings):
    """The judge settings of an interim check: no bootstrap unless a settleable clause compares
    on a (Clopper–Pearson) interval, which the checker only computes with ``n_bootstrap > 0``."""
    needs_ci = any(c.compare != "value" and settleable(c) for c in contract.clauses)
    return settings if needs_ci else dict(settings, n_bootstrap=0)


def settled_failures(ref_cal, ref_eval, var_cal, var_seen, contract, settings):
    """Ids of the clauses that fail whatever the unseen eval rows hold ([] when none, or when
    every row was seen: then the caller judges the full outputs).

    Parameters
    ----------
    ref_cal, var_cal : mapping of arrays
        Reference and variant outputs on the whole search-calibration split.
    ref_eval : mapping of arrays
        The reference's outputs on the whole search-eval split (N rows).
    var_seen : mapping of arrays
        The variant's outputs on its first n rows.
    contract : contracts.checker.Contract
    settings : dict
        As :func:`runs.settings.resolve_settings`.
    """
    from runs.judge import judge_outputs

    if len(var_seen["ids"]) >= len(ref_eval["ids"]):
        return []
    best = complete(ref_eval, var_seen)
    _, verdict, _ = judge_outputs(ref_cal, ref_eval, var_cal, best, contract,
                                  settings=interim_settings(contract, settings))
    return [r.id for r in verdict.results if r.passed is False and settleable(r)]

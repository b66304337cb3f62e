"""Check an evaluation against a contract, clause by clause (the interval method of each
clause from :mod:`metrics.registry`).

A contract is a name, a description, optional ``[settings]`` and a list of ``[[clause]]`` tables;
each clause names one number of :meth:`metrics.evaluation.Evaluation.value` (``metric``,
``stratum``, ``statistic``) and a bound, ``min`` (pass when value >= min) or ``max`` (pass when
value <= max). With ``compare = "ci"`` the bound applies to the far end of the value's interval
instead (upper end for ``max``, lower for ``min``): "the upper CI bound must be below". The
interval is the exact Clopper–Pearson one for rates and counts of events (bool columns,
``certified_share``, ``accuracy_*``) and the seeded percentile bootstrap otherwise; each result
names its method (``interval``). A clause whose value is NaN is reported with ``passed=None`` and
does not fail the verdict: "no examples" when its stratum has no example on which the metric is
defined (an absent stratum is not evidence against the variant, but the report shows it so a
reader can see the clause went untested), or "skipped: <reason>" when the value could not be
estimated (the reference's temperature refit ran to a bound or did not converge). A variant
whose own refit ran to a bound or did not converge where the reference's converged fails that
clause, "FAIL: <reason>" (:meth:`metrics.evaluation.Evaluation.fail_reason`).

Parsing and validating a contract file: :mod:`contracts.contract` (its names are re-exported
here for code that imports them from this module).
"""

import math
from dataclasses import asdict, dataclass, field

import pandas as pd

from contracts.undecided import decision_facts

from contracts.contract import (  # re-exported (__all__)
    CLAUSE_KEYS,
    COMPARE,
    CONTRACT_KEYS,
    MAX_LABEL,
    DEFAULT_CONTRACT,
    OPS,
    PACKAGED,
    SETTINGS,
    Clause,
    Contract,
    ContractError,
    contract_from_dict,
    default_settings,
    load_contract,
)

SCHEMA_VERSION = 2

__all__ = ["CLAUSE_KEYS", "COMPARE", "CONTRACT_KEYS", "MAX_LABEL", "DEFAULT_CONTRACT", "OPS", "PACKAGED",
           "SCHEMA_VERSION", "SETTINGS", "Clause", "ClauseResult", "Contract", "ContractError",
           "Verdict", "check", "contract_from_dict", "default_settings", "load_contract"]


@dataclass(frozen=True)
class ClauseResult:
    """Outcome of one clause.

    Attributes
    ----------
    value : float
        NaN when the stratum has no example on which the metric is defined.
    passed : bool or None
        None when the compared number is NaN ("no examples", or skipped with ``reason``).
    n : int
        Examples the value was computed over (stratum size less rows where the metric is
        undefined, e.g. unknown labels).
    interval : str or None
        Method of ``ci_low``/``ci_high``: "clopper-pearson", "tango-paired-score"
        (accuracy drop; "clopper-pearson-difference" in results saved before issue #38),
        "bootstrap-percentile", or None (no interval: the metric has none, or
        intervals were off).
    reason : str
        Why the value is NaN although the stratum has examples, or why the clause failed
        whatever its value (a variant whose temperature refit ran to a bound where the
        reference's converged); "" otherwise.
    undecided : bool
        The point value meets the threshold but the interval's far end does not (``compare =
        "ci"``): the rows do not decide the clause either way. Not a pass (``passed`` is False)
        and not a failure (not in :attr:`Verdict.failed`).
    rows_needed : int or None
        Undecided clauses only: about how many rows, at the observed rate (or spread), would
        make the interval's far end meet the threshold (:func:`contracts.undecided.
        decision_facts`); None otherwise.
    detectable : float or None
        The smallest violation (metric units, past the threshold) the clause's n rows can show
        at the interval's level; None for clauses without an interval or counting events.
    """

    id: str
    metric: str
    stratum: str
    statistic: str
    value: float
    op: str
    threshold: float
    passed: bool | None
    n: int
    why: str = ""
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    compare: str = "value"
    interval: str | None = None
    reason: str = ""
    undecided: bool = False
    rows_needed: int | None = None
    detectable: float | None = None

    @property
    def compared_value(self):
        """The number the bound was applied to: the value, or the CI's far end."""
        if self.compare == "value":
            return self.value
        return self.ci_high if self.op == "<=" else self.ci_low

    @property
    def status(self):
        """'pass', 'FAIL', 'FAIL: <reason>', 'undecided[: about N more rows would decide it]',
        'no examples' or 'skipped: <reason>'."""
        if self.undecided:
            more = ("" if self.rows_needed is None else
                    f": about {self.rows_needed - self.n:,} more rows would decide it")
            return f"undecided{more}"
        if self.passed is None:
            return f"skipped: {self.reason}" if self.reason else "no examples"
        if self.passed:
            return "pass"
        return f"FAIL: {self.reason}" if self.reason else "FAIL"


@dataclass(frozen=True)
class Verdict:
    """All clause results of one contract on one evaluation.

    ``passed`` is True when no clause failed and none is undecided; clauses with no examples
    (``passed is None``) are reported but do not fail the verdict. :attr:`outcome` says which of
    the three it is.
    """

    contract: str
    results: tuple
    settings: dict = field(default_factory=dict)

    @property
    def passed(self):
        return all(r.passed is not False for r in self.results)

    @property
    def failed(self):
        """Ids of the clauses that failed (undecided ones are not among them)."""
        return [r.id for r in self.results if r.passed is False and not r.undecided]

    @property
    def word(self):
        """'PASS', 'FAIL' or 'UNDECIDED' (:attr:`outcome`), as the reports print it."""
        return self.outcome.upper()

    @property
    def undecided(self):
        """Ids of the clauses the rows do not decide (point value passes, bound does not)."""
        return [r.id for r in self.results if r.undecided]

    @property
    def outcome(self):
        """'pass', 'fail' (a clause failed) or 'undecided' (none failed, one or more undecided)."""
        if self.failed:
            return "fail"
        return "undecided" if self.undecided else "pass"

    @property
    def untested(self):
        """Ids of the clauses with no examples or skipped (``passed is None``)."""
        return [r.id for r in self.results if r.passed is None]

    @property
    def unjudged(self):
        """``{reason: [ids]}`` of the clauses skipped with a reason (the number they bound is
        undefined on these rows, e.g. a regression reference's constant values), in clause
        order: untested though their rows are there, which a bare 'PASS' must not hide."""
        out = {}
        for r in self.results:
            if r.passed is None and r.reason:
                out.setdefault(r.reason, []).append(r.id)
        return out

    def unjudged_text(self):
        """"; not judged: a, b: <reason>; c: <reason>", or "" when every clause was judged or
        had no examples."""
        parts = [f"{', '.join(ids)}: {reason}" for reason, ids in self.unjudged.items()]
        return "; not judged: " + "; ".join(parts) if parts else ""

    def to_dict(self):
        """JSON-ready dict (NaN values become None)."""
        def num(x):
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else x

        clauses = []
        for r in self.results:
            d = asdict(r)
            for k in ("value", "ci_low", "ci_high"):
                d[k] = num(d[k])
            d["status"] = r.status
            clauses.append(d)
        return {"schema_version": SCHEMA_VERSION, "contract": self.contract,
                "passed": self.passed, "outcome": self.outcome, "failed": self.failed,
                "undecided": self.undecided, "untested": self.untested,
                "settings": dict(self.settings), "clauses": clauses}

    def to_frame(self):
        """One row per clause: the ClauseResult fields plus ``status``."""
        rows = [{**asdict(r), "status": r.status} for r in self.results]
        columns = [*ClauseResult.__dataclass_fields__, "status"]
        return pd.DataFrame(rows, columns=columns)


def _meets(value, op, threshold):
    return not math.isnan(value) and (value >= threshold if op == ">=" else value <= threshold)


def check(contract, evaluation, *, n_bootstrap=None, confidence=None, seed=None):
    """Evaluate every clause of ``contract`` on ``evaluation``.

    Parameters
    ----------
    contract : Contract
    evaluation : metrics.evaluate.Evaluation
    n_bootstrap, confidence, seed : optional
        Bootstrap resamples, interval level and seed of each clause's CI; default the
        contract's ``[settings]`` (1000, 0.95, 0). ``n_bootstrap=0`` skips intervals, both
        methods (a clause with ``compare = "ci"`` then has no interval and is reported as "no
        examples"); ``confidence`` is also the level of the Clopper–Pearson intervals.

    Returns
    -------
    Verdict
        One :class:`ClauseResult` per clause, in contract order. A clause passes when
        ``value >= threshold`` (min) or ``value <= threshold`` (max), with ``value`` the CI's far
        end when ``compare = "ci"``; ``passed`` is None when that number is NaN (no examples, or
        skipped with a ``reason``), which does not fail the verdict; ``passed`` is False with a
        ``reason`` whatever the number when the evaluation gives a ``fail_reason`` (a variant's
        temperature refit that ran to a bound where the reference's converged).
    """
    settings = dict(contract.settings)
    n_boot = settings["n_bootstrap"] if n_bootstrap is None else int(n_bootstrap)
    level = settings["confidence"] if confidence is None else float(confidence)
    seed = settings["seed"] if seed is None else int(seed)
    settings.update(n_bootstrap=n_boot, confidence=level, seed=seed)
    results = []
    for c in contract.clauses:
        value = float(evaluation.value(c.metric, c.stratum, c.statistic))
        n = int(evaluation.support(c.metric, c.stratum))
        low, high = (float("nan"), float("nan"))
        interval = None
        if n_boot and not math.isnan(value):
            low, high = evaluation.ci(c.metric, c.stratum, c.statistic, n_boot=n_boot,
                                      confidence=level, seed=seed)
            interval = evaluation.interval_method(c.metric, c.statistic)
        fails = evaluation.fail_reason(c.metric, c.stratum)
        if fails and c.metric == "nonfinite_rows" and _meets(value, c.op, c.threshold):
            fails = ""  # a contract's own bound on the count (e.g. max = 5) holds: no failure
        reason = fails or (evaluation.skip_reason(c.metric, c.stratum)
                           if math.isnan(value) else "")
        compared = value if c.compare == "value" else (high if c.op == "<=" else low)
        if fails:
            passed = False
        elif math.isnan(compared):
            passed = None
        elif c.op == ">=":
            passed = bool(compared >= c.threshold)
        else:
            passed = bool(compared <= c.threshold)
        # a count's interval widens with more rows: more rows cannot decide it (a failure)
        undecided = bool(passed is False and not fails and c.compare != "value"
                         and c.statistic != "count" and _meets(value, c.op, c.threshold))
        rows, detectable = (decision_facts(evaluation, c, value, low, high, n, level, undecided)
                            if interval else (None, None))
        results.append(ClauseResult(id=c.id, metric=c.metric, stratum=c.stratum,
                                    statistic=c.statistic, value=value, op=c.op,
                                    threshold=c.threshold, passed=passed, n=n, why=c.why,
                                    ci_low=low, ci_high=high, compare=c.compare,
                                    interval=interval, reason=reason, undecided=undecided,
                                    rows_needed=rows, detectable=detectable))
    return Verdict(contract=contract.name, results=tuple(results), settings=settings)

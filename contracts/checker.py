"""Load a contract (TOML) and check an evaluation against it, clause by clause.

A contract is a name, a description, optional ``[settings]`` and a list of ``[[clause]]`` tables;
each clause names one number of :meth:`metrics.evaluate.Evaluation.value` (``metric``,
``stratum``, ``statistic``) and a bound, ``min`` (pass when value >= min) or ``max`` (pass when
value <= max). With ``compare = "ci"`` the bound applies to the far end of the value's interval
instead (upper end for ``max``, lower for ``min``): "the upper CI bound must be below". The
interval is the exact Clopper–Pearson one for rates and counts of events (bool columns,
``certified_share``, ``accuracy_*``) and the seeded percentile bootstrap otherwise; each result
names its method (``interval``). A clause whose value is NaN is reported with ``passed=None`` and
does not fail the verdict: "no examples" when its stratum has no example on which the metric is
defined (an absent stratum is not evidence against the variant, but the report shows it so a
reader can see the clause went untested), or "skipped: <reason>" when the value could not be
estimated (a temperature refit that ran to a bound or did not converge).
"""

import math
import sys
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import pandas as pd

from metrics.evaluate import (
    METRIC_STATISTICS,
    METRICS,
    STRATA,
    TASK_STRATUM_PREFIX,
    check_metric_statistic,
    check_stratum,
)
from metrics._checks import short_list, short_path, short_repr

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

#: Keys allowed at the top of a contract file and in each ``[[clause]]`` table.
CONTRACT_KEYS = ("name", "description", "settings", "clause")
CLAUSE_KEYS = ("id", "metric", "stratum", "statistic", "min", "max", "compare", "why")
#: What a clause's bound is compared with: the point value, or the far end of its CI.
COMPARE = ("value", "ci")
#: ``[settings]`` keys, their types and defaults. ``near_tie_margin = None`` means "the run's"
#: (run.json ``config.near_tie_margin``).
SETTINGS = {
    "near_tie_margin": ((int, float), None),
    "human_tie_gap": ((int, float), 0.2),
    "alpha": ((int, float), 0.05),
    "n_bootstrap": ((int,), 1000),
    "confidence": ((int, float), 0.95),
    "seed": ((int,), 0),
    "n_bins": ((int,), 15),
}
_SETTING_RANGES = {
    "near_tie_margin": (lambda x: x >= 0, ">= 0"),
    "human_tie_gap": (lambda x: 0 <= x <= 1, "in [0, 1]"),
    "alpha": (lambda x: 0 < x < 1, "in (0, 1)"),
    "n_bootstrap": (lambda x: x >= 0, ">= 0 (0 = no intervals)"),
    "confidence": (lambda x: 0 < x < 1, "in (0, 1)"),
    "seed": (lambda x: x >= 0, ">= 0"),
    "n_bins": (lambda x: x >= 1, ">= 1"),
}
SCHEMA_VERSION = 2
#: Comparison of each bound key: ``min`` -> value >= threshold, ``max`` -> value <= threshold.
OPS = {"min": ">=", "max": "<="}
DEFAULT_CONTRACT = "default.toml"


class ContractError(ValueError):
    """A contract file is missing, not valid TOML, or breaks the contract schema."""


@dataclass(frozen=True)
class Clause:
    """One bound on one number of an evaluation.

    Attributes
    ----------
    id : str
        Unique within the contract.
    metric, stratum, statistic : str
        Arguments of :meth:`metrics.evaluate.Evaluation.value`.
    op : {'>=', '<='}
        From the clause's ``min`` or ``max`` key.
    threshold : float
    why : str
        The reason, for the report.
    """

    id: str
    metric: str
    stratum: str
    statistic: str
    op: str
    threshold: float
    why: str = ""
    compare: str = "value"


def default_settings():
    """The ``[settings]`` defaults as a dict."""
    return {k: default for k, (_, default) in SETTINGS.items()}


@dataclass(frozen=True)
class Contract:
    """A named list of clauses; ``source`` says where it was read from; ``settings`` the
    validated ``[settings]`` table merged over :func:`default_settings`."""

    name: str
    description: str
    clauses: tuple
    source: str = "<dict>"
    settings: dict = field(default_factory=default_settings, compare=False, hash=False)


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
        Method of ``ci_low``/``ci_high``: "clopper-pearson", "clopper-pearson-difference"
        (accuracy drop), "bootstrap-percentile", or None (no interval: the metric has none, or
        intervals were off).
    reason : str
        Why the value is NaN although the stratum has examples ("" otherwise).
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

    @property
    def compared_value(self):
        """The number the bound was applied to: the value, or the CI's far end."""
        if self.compare == "value":
            return self.value
        return self.ci_high if self.op == "<=" else self.ci_low

    @property
    def status(self):
        """'pass', 'FAIL', 'no examples' or 'skipped: <reason>'."""
        if self.passed is None:
            return f"skipped: {self.reason}" if self.reason else "no examples"
        return "pass" if self.passed else "FAIL"


@dataclass(frozen=True)
class Verdict:
    """All clause results of one contract on one evaluation.

    ``passed`` is True when no clause failed; clauses with no examples (``passed is None``) are
    reported but do not fail the verdict.
    """

    contract: str
    results: tuple
    settings: dict = field(default_factory=dict)

    @property
    def passed(self):
        return all(r.passed is not False for r in self.results)

    @property
    def failed(self):
        """Ids of the clauses that failed."""
        return [r.id for r in self.results if r.passed is False]

    @property
    def untested(self):
        """Ids of the clauses with no examples or skipped (``passed is None``)."""
        return [r.id for r in self.results if r.passed is None]

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
                "passed": self.passed, "failed": self.failed, "untested": self.untested,
                "settings": dict(self.settings), "clauses": clauses}

    def to_frame(self):
        """One row per clause: the ClauseResult fields plus ``status``."""
        rows = [{**asdict(r), "status": r.status} for r in self.results]
        columns = [*ClauseResult.__dataclass_fields__, "status"]
        return pd.DataFrame(rows, columns=columns)


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


#: Longest clause id and contract name: they are echoed in terminal lines and report headings.
MAX_LABEL = 100


def _short_label(text):
    """True when ``text`` (str) is at most ``MAX_LABEL`` characters with no control character."""
    return len(text) <= MAX_LABEL and text.isprintable()


def _parse_clause(raw, index, where):
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: clause #{index + 1} must be a [[clause]] table, got "
                            f"{short_repr(raw)}.")
    cid = raw.get("id")
    if not isinstance(cid, str) or not cid:
        raise ContractError(f"{where}: clause #{index + 1} needs a non-empty string id = \"...\".")
    if not _short_label(cid):
        raise ContractError(f"{where}: clause #{index + 1} has id {short_repr(cid)}; an id is one "
                            f"line of at most {MAX_LABEL} characters (it is printed in every "
                            "verdict line), e.g. id = \"negative-flips\".")
    label = f"{where}: clause {short_repr(cid)}"
    unknown = sorted(set(raw) - set(CLAUSE_KEYS))
    if unknown:
        raise ContractError(
            f"{label} has unknown key(s) {short_list(unknown)}; allowed keys: {', '.join(CLAUSE_KEYS)}."
        )
    metric = raw.get("metric")
    if not isinstance(metric, str) or metric not in METRIC_STATISTICS:  # a TOML list: unhashable
        raise ContractError(f"{label} has unknown metric {short_repr(metric)}; use one of "
                            f"{', '.join(METRICS)}.")
    allowed = METRIC_STATISTICS[metric]
    statistic = raw.get("statistic", allowed[0] if len(allowed) == 1 else None)
    try:
        check_metric_statistic(metric, statistic)
    except ValueError:
        raise ContractError(
            f"{label} has statistic {short_repr(statistic)}, not allowed for metric {metric!r}; "
            "use one of "
            f"{', '.join(allowed)}."
        ) from None
    stratum = raw.get("stratum", "all")
    try:
        check_stratum(stratum)
    except ValueError:
        raise ContractError(
            f"{label} has unknown stratum {short_repr(stratum)}; use one of {', '.join(STRATA)} or "
            f"'{TASK_STRATUM_PREFIX}<task name>', 'options:<K>', 'margin:<lo>-<hi>'."
        ) from None
    bounds = [k for k in OPS if k in raw]
    if len(bounds) != 1:
        got = "both min and max" if bounds else "neither min nor max"
        raise ContractError(f"{label} has {got}; give exactly one bound (min = ... or max = ...).")
    threshold = raw[bounds[0]]
    if not _is_number(threshold) or not math.isfinite(threshold):
        raise ContractError(
            f"{label} has {bounds[0]} = {short_repr(threshold)}; the bound must be a finite "
            "number, e.g. "
            f"{bounds[0]} = 0.05."
        )
    why = raw.get("why", "")
    if not isinstance(why, str):
        raise ContractError(f"{label} has a non-string why; write the reason as why = \"...\".")
    compare = raw.get("compare", "value")
    if compare not in COMPARE:
        raise ContractError(
            f"{label} has compare = {short_repr(compare)}; use \"value\" (the point value) or "
            "\"ci\" (the upper CI bound for max, the lower for min)."
        )
    return Clause(id=cid, metric=metric, stratum=stratum, statistic=statistic,
                  op=OPS[bounds[0]], threshold=float(threshold), why=why, compare=compare)


def _parse_settings(raw, where):
    settings = default_settings()
    if raw is None:
        return settings
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: settings must be a [settings] table, got "
                            f"{short_repr(raw)}.")
    unknown = sorted(set(raw) - set(SETTINGS))
    if unknown:
        raise ContractError(
            f"{where}: [settings] has unknown key(s) {short_list(unknown)}; allowed: "
            f"{', '.join(SETTINGS)}."
        )
    for key, value in raw.items():
        types, _ = SETTINGS[key]
        if isinstance(value, bool) or not isinstance(value, types) or (
                isinstance(value, float) and not math.isfinite(value)):
            kind = "an integer" if types == (int,) else "a finite number"
            raise ContractError(f"{where}: [settings] {key} = {short_repr(value)} must be {kind}.")
        ok, rule = _SETTING_RANGES[key]
        if not ok(value):
            raise ContractError(f"{where}: [settings] {key} = {short_repr(value)} must be {rule}.")
        settings[key] = value
    return settings


def contract_from_dict(data, *, source="<dict>"):
    """Validate a parsed contract (the dict ``tomllib`` returns) and build a :class:`Contract`.

    Parameters
    ----------
    data : dict
        Top-level keys ``name`` (str, default: the file stem), ``description`` (str) and
        ``clause`` (list of tables with ``id``, ``metric``, ``stratum`` (default 'all'),
        ``statistic`` (may be omitted for set-level metrics, whose only statistic is 'value'),
        exactly one of ``min``/``max``, and ``why``).
    source : str, default='<dict>'
        Where the data came from, for messages.

    Returns
    -------
    Contract

    Raises
    ------
    ContractError
        On an unknown key, metric, statistic or stratum, a missing/duplicated id, neither or both
        of min/max, a non-numeric bound, or no clause at all.
    """
    unknown = sorted(set(data) - set(CONTRACT_KEYS))
    if unknown:
        raise ContractError(
            f"{source}: unknown top-level key(s) {short_list(unknown)}; allowed: "
            f"{', '.join(CONTRACT_KEYS)} (clauses go in [[clause]] tables)."
        )
    raw_clauses = data.get("clause")
    if not isinstance(raw_clauses, list) or not raw_clauses:
        raise ContractError(f"{source}: no clauses; add at least one [[clause]] table.")
    clauses = [_parse_clause(raw, i, source) for i, raw in enumerate(raw_clauses)]
    seen = set()
    for c in clauses:
        if c.id in seen:
            raise ContractError(f"{source}: duplicate clause id {short_repr(c.id)}; give each "
                            "clause its own id.")
        seen.add(c.id)
    name = data.get("name", Path(source).stem)
    description = data.get("description", "")
    if not isinstance(name, str) or not isinstance(description, str):
        raise ContractError(f"{source}: name and description must be strings.")
    if not _short_label(name):
        raise ContractError(f"{source}: name = {short_repr(name)} must be one line of at most "
                            f"{MAX_LABEL} characters, e.g. name = \"strict\".")
    settings = _parse_settings(data.get("settings"), source)
    return Contract(name=name, description=description, clauses=tuple(clauses), source=source,
                    settings=settings)


#: Contracts shipped with the package, by name (``load_contract("strict")`` works).
PACKAGED = ("default", "strict", "lenient")


def load_contract(path=None):
    """Read and validate a contract file.

    Parameters
    ----------
    path : str or path-like, optional
        A ``.toml`` contract; None reads the packaged ``contracts/default.toml``; one of
        ``PACKAGED`` ("default", "strict", "lenient") reads that packaged contract.

    Returns
    -------
    Contract

    Raises
    ------
    ContractError
        If the file is missing or unreadable, is not valid TOML, or breaks the schema (see
        :func:`contract_from_dict`).
    """
    if path is None or (isinstance(path, str) and path in PACKAGED):
        fname = DEFAULT_CONTRACT if path is None else f"{path}.toml"
        resource = resources.files("contracts").joinpath(fname)
        source, text = f"contracts/{fname}", resource.read_text(encoding="utf-8")
    else:
        source = short_path(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ContractError(
                f"contract file {source} not found; pass an existing .toml path, or none for the "
                "packaged default."
            ) from None
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else e  # no 2nd path echo
            raise ContractError(f"cannot read contract file {source} ({why}); pass a UTF-8 .toml "
                                "file.") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ContractError(f"{source} is not valid TOML ({e}); fix the syntax there.") from None
    return contract_from_dict(data, source=source)


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
        skipped with a ``reason``), which does not fail the verdict.
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
        reason = evaluation.skip_reason(c.metric, c.stratum) if math.isnan(value) else ""
        compared = value if c.compare == "value" else (high if c.op == "<=" else low)
        if math.isnan(compared):
            passed = None
        elif c.op == ">=":
            passed = bool(compared >= c.threshold)
        else:
            passed = bool(compared <= c.threshold)
        results.append(ClauseResult(id=c.id, metric=c.metric, stratum=c.stratum,
                                    statistic=c.statistic, value=value, op=c.op,
                                    threshold=c.threshold, passed=passed, n=n, why=c.why,
                                    ci_low=low, ci_high=high, compare=c.compare,
                                    interval=interval, reason=reason))
    return Verdict(contract=contract.name, results=tuple(results), settings=settings)

"""Load a contract (TOML) and validate it: a name, a description, optional ``[settings]`` and a
list of ``[[clause]]`` tables.

Each clause names one number of :meth:`metrics.evaluation.Evaluation.value` (``metric``,
``stratum``, ``statistic``; the metric and its allowed statistics come from
:mod:`metrics.registry`) and a bound, ``min`` (pass when value >= min) or ``max`` (pass when
value <= max), compared with the point value or (``compare = "ci"``) the far end of its
interval. Checking a contract against an evaluation: :mod:`contracts.checker`.
"""

import math
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from metrics._checks import short_list, short_path, short_repr
from metrics.defaults import HUMAN_TIE_GAP, N_BINS, VALUE_TOLERANCE
from metrics.registry import METRICS, REGISTRY, check_metric_statistic
from metrics.strata import STRATA, TASK_STRATUM_PREFIX, check_stratum

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
    "human_tie_gap": ((int, float), HUMAN_TIE_GAP),
    "alpha": ((int, float), 0.05),
    "n_bootstrap": ((int,), 1000),
    "confidence": ((int, float), 0.95),
    "seed": ((int,), 0),
    "n_bins": ((int,), N_BINS),
}
#: Largest near-tie margin (raw logits): float32 logits of a decision model differ by far less;
#: past it every row is a near tie and the flip table's margin bins run to inf
MAX_NEAR_TIE_MARGIN = 1e4
#: Most bootstrap resamples per CI (each resample holds one index per eval row: 100,000 x 1,000
#: rows is 800 MB)
MAX_BOOTSTRAP = 100_000
_SETTING_RANGES = {
    # raw logits; a margin past MAX_NEAR_TIE_MARGIN makes every row a near tie
    "near_tie_margin": (lambda x: 0 <= x <= MAX_NEAR_TIE_MARGIN,
                        f"in [0, {MAX_NEAR_TIE_MARGIN:g}] (raw logits), e.g. 1.0"),
    "human_tie_gap": (lambda x: 0 <= x <= 1, "in [0, 1]"),
    "alpha": (lambda x: 0 < x < 1, "in (0, 1)"),
    "n_bootstrap": (lambda x: 0 <= x <= MAX_BOOTSTRAP,
                    f"in [0, {MAX_BOOTSTRAP}] (0 = no intervals)"),
    "confidence": (lambda x: 0 < x < 1, "in (0, 1)"),
    "seed": (lambda x: x >= 0, ">= 0"),
    "n_bins": (lambda x: x >= 1, ">= 1"),
    "value_tolerance": (lambda x: 0 < x <= 1e6, "in (0, 1e6] (units of the reference's spread), "
                        "e.g. 0.05"),
}
#: ``[settings]`` keys read only when a contract gives them (absent from every other contract's
#: settings and verdicts): their types and defaults. ``value_tolerance``: a regression row is
#: within tolerance when |variant - reference| <= value_tolerance x the spread of the
#: reference's values (:mod:`metrics.regression`).
OPTIONAL_SETTINGS = {"value_tolerance": ((int, float), VALUE_TOLERANCE)}
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


#: The clause every contract has (added last when a contract has no clause on its metric):
#: a variant's rows with NaN or inf outputs fail it, listed by id (:mod:`metrics.finite`).
FINITE_OUTPUTS = Clause(
    id="finite-outputs", metric="nonfinite_rows", stratum="all", statistic="value", op="<=",
    threshold=0.0, why="Every output must be a number: a row answered with NaN or inf (an "
    "overflow) has no choice, probability or score to serve.")


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
    if not isinstance(metric, str) or metric not in REGISTRY:  # a TOML list: unhashable
        raise ContractError(f"{label} has unknown metric {short_repr(metric)}; use one of "
                            f"{', '.join(METRICS)}.")
    allowed = REGISTRY[metric].statistics
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
    s = REGISTRY[metric]
    is_rate = statistic == "rate" or (s.events is not None and statistic == "value")
    if is_rate and not 0 <= threshold <= 1:  # a rate's bound outside [0, 1] decides nothing
        raise ContractError(
            f"{label} bounds a rate ({metric}, {statistic}) with {bounds[0]} = {threshold:g}, "
            f"outside [0, 1]: it would {'never' if (bounds[0] == 'min') == (threshold > 1) else 'always'} "
            f"pass; give a bound in [0, 1], e.g. {bounds[0]} = {0.97 if bounds[0] == 'min' else 0.02}.")
    if statistic == "count" and threshold < 0 and bounds[0] == "max":
        raise ContractError(f"{label} has max = {threshold:g} on a count, which is never "
                            "negative: it would never pass; give max = 0 or more.")
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
    known = {**SETTINGS, **OPTIONAL_SETTINGS}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ContractError(
            f"{where}: [settings] has unknown key(s) {short_list(unknown)}; allowed: "
            f"{', '.join(known)}."
        )
    for key, value in raw.items():
        types, _ = known[key]
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
    if not any(c.metric == FINITE_OUTPUTS.metric for c in clauses):  # every contract has it
        if any(c.id == FINITE_OUTPUTS.id for c in clauses):
            raise ContractError(f"{source}: clause id {FINITE_OUTPUTS.id!r} is the suite's own "
                                "(rows with NaN or inf outputs); give your clause another id.")
        clauses.append(FINITE_OUTPUTS)
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
PACKAGED = ("default", "strict", "lenient", "multi_label", "regression")
#: The packaged contracts that judge each kind of model output (metrics.registry.OUTPUT_KINDS),
#: the first the default (:mod:`contracts.outputs`)
PACKAGED_FOR = {"softmax": ("default", "strict", "lenient"), "multi_label": ("multi_label",),
                "regression": ("regression",)}


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
    elif not str(path).strip():  # Path("") is the current folder, not a file
        raise ContractError(f"the contract name is empty; pass a .toml path or a packaged "
                            f"contract: {' | '.join(PACKAGED)}.")
    else:
        source = short_path(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ContractError(
                f"contract file {source} not found; pass an existing .toml path or a packaged "
                f"contract: {' | '.join(PACKAGED)}."
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


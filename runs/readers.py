"""One validating reader per JSON/CSV file kind of a results folder (no MLX).

Every file a command reads back goes through one of these readers: ``run.json``, ``build.json``,
``timing.json``, ``metrics.json``, ``verdict.json``, ``summary.csv``, the outputs ``.npz`` files
(a run's and the reference-output cache's), the head cache (``.cache/heads``), the activation
statistics (``.cache/activations``) and the early-exit heads (``.cache/exit_heads``). Each parses
the file and checks the shape its callers rely on; a file that does not parse or has the wrong
shape raises :class:`CorruptFileError` naming the file, what is wrong and the fix (delete it and
rerun; only that part is rebuilt). A missing file is not corrupt: callers check for it (the
readers let ``FileNotFoundError`` through). The npz readers (outputs and caches) are in
:mod:`runs.npz_readers`.
"""

import json
import re
from pathlib import Path

from metrics._checks import short_repr

FIX = "delete it and rerun: only that part is rebuilt"
#: Fields of one timing.json entry (``batches`` / ``end_to_end`` per batch size) that
#: ``runs.report.summary_row`` reads: (path, required).
TIMING_ENTRY_FIELDS = (("seq_len",), ("rounds",), ("ref", "p50_ms"), ("ref", "p95_ms"),
                       ("var", "p50_ms"), ("var", "p95_ms"), ("speedup", "speedup_median"),
                       ("speedup", "speedup_ci_low"), ("speedup", "speedup_ci_high"),
                       ("ref_peak_memory_bytes",), ("var_peak_memory_bytes",))
#: Columns every summary.csv has (``runs.report.summary_row``).
SUMMARY_COLUMNS = ("variant", "family", "verdict")

_MISSING_OK = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class CorruptFileError(ValueError):
    """A results or cache file that does not parse or has the wrong shape.

    Attributes ``path`` (Path), ``kind`` (e.g. "timing file") and ``problem`` (one line). The
    message is one line: ``<path> is not a valid <kind> (<problem>); delete it and rerun: only
    that part is rebuilt``.
    """

    def __init__(self, path, kind, problem):
        self.path, self.kind = Path(path), kind
        self.problem = re.sub(r"\s+", " ", str(problem)).strip()
        super().__init__(f"{self.path} is not a valid {kind} ({self.problem}); {FIX}")


def _error(e):
    """``TypeName: message`` of an exception, the message cut to a readable length."""
    return f"{type(e).__name__}: {short_repr(str(e), 200)[1:-1]}"


# -- JSON -------------------------------------------------------------------------------------
def _type(value):
    return {dict: "a mapping", list: "a list", str: "a str", bool: "a bool", type(None): "null",
            int: "an int", float: "a float"}.get(type(value), type(value).__name__)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Checker:
    """Shape checks of one parsed JSON file; every failure raises CorruptFileError."""

    def __init__(self, path, kind):
        self.path, self.kind = path, kind

    def fail(self, problem):
        raise CorruptFileError(self.path, self.kind, problem)

    def mapping(self, value, where="the file"):
        if not isinstance(value, dict):
            self.fail(f"{where} is {_type(value)} {short_repr(value)}, expected a mapping")
        return value

    _KINDS = {"mapping": lambda v: isinstance(v, dict), "list": lambda v: isinstance(v, list),
              "str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
              "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": _is_number, "number or null": lambda v: v is None or _is_number(v),
              "mapping or null": lambda v: v is None or isinstance(v, dict),
              "str or null": lambda v: v is None or isinstance(v, str)}

    def opt(self, d, key, kind, where=None):
        """``d[key]`` must be of ``kind`` (a key of ``_KINDS``) or absent; returns it or None."""
        if key not in d:
            return None
        v = d[key]
        if not self._KINDS[kind](v):
            self.fail(f"{where or key} is {_type(v)} {short_repr(v)}, expected "
                      f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}")
        return v

    def need(self, d, key, kind, where=None):
        if key not in d:
            self.fail(f"{where or key} is missing")
        return self.opt(d, key, kind, where)


def read_json(path, kind="JSON file"):
    """Parse a JSON file. Raises CorruptFileError if it is not UTF-8 JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except _MISSING_OK:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError, OSError) as e:
        raise CorruptFileError(path, kind, f"not JSON: {_error(e)}") from None


def read_run_json(path):
    """``run.json`` as a dict; ``identity``, ``config``, ``data``, ``extras`` (str values),
    ``temperatures``, ``failed_variants``, ``sweep_time`` mappings where present,
    ``cold_start`` a mapping or null, ``status``/``contract`` str. Raises CorruptFileError."""
    c = _Checker(Path(path), "run file")
    d = c.mapping(read_json(path, c.kind))
    for key in ("identity", "config", "data", "extras", "temperatures", "failed_variants",
                "sweep_time", "versions", "checkpoint"):
        c.opt(d, key, "mapping")
    for key in ("status", "contract", "device"):
        c.opt(d, key, "str")
    c.opt(d, "cold_start", "mapping or null")
    for name, text in (d.get("extras") or {}).items():
        if not isinstance(text, str):
            c.fail(f"extras[{short_repr(name)}] is {_type(text)}, expected a str")
    cfg = d.get("config") or {}
    c.opt(cfg, "near_tie_margin", "number", "config.near_tie_margin")
    c.opt(cfg, "family", "str", "config.family")
    splits = c.opt(d.get("data") or {}, "splits", "mapping", "data.splits") or {}
    for s, v in splits.items():
        c.mapping(v, f"data.splits[{short_repr(s)}]")
    return d


def read_build(path):
    """A variant's ``build.json`` as a dict: ``config`` a mapping, ``family`` str, the size
    figures numbers or null, ``layers`` a list of mappings, ``exit_layers`` a list of ints,
    ``n_layers`` an int (each where present). Raises CorruptFileError."""
    c = _Checker(Path(path), "build file")
    d = c.mapping(read_json(path, c.kind))
    c.opt(d, "config", "mapping")
    c.opt(d, "family", "str or null")
    for key in ("bits_per_weight", "model_bytes", "ideal_speedup", "param_ratio",
                "quality_wall_s"):
        c.opt(d, key, "number or null")
    c.opt(d, "n_layers", "int")
    for i, layer in enumerate(c.opt(d, "layers", "list") or []):
        c.mapping(layer, f"layers[{i}]")
    for i, layer in enumerate(c.opt(d, "exit_layers", "list") or []):
        if not isinstance(layer, int) or isinstance(layer, bool):
            c.fail(f"exit_layers[{i}] is {_type(layer)} {short_repr(layer)}, expected an int")
    return d


def read_timing(path):
    """A variant's ``timing.json`` as a dict.

    ``batches`` and ``end_to_end`` (where present) map a batch size (digits) to a mapping with
    the numeric fields ``TIMING_ENTRY_FIELDS`` (numbers; ``ref``/``var``/``speedup`` mappings);
    ``model_bytes`` is a mapping, ``cold_start`` a mapping or null. Raises CorruptFileError.
    """
    c = _Checker(Path(path), "timing file")
    d = c.mapping(read_json(path, c.kind))
    for region in ("batches", "end_to_end"):
        for b, entry in (c.opt(d, region, "mapping") or {}).items():
            where = f"{region}[{short_repr(b)}]"
            if not str(b).isdigit():
                c.fail(f"{region} key {short_repr(b)} is not a batch size")
            c.mapping(entry, where)
            for fields in TIMING_ENTRY_FIELDS:
                node, name = entry, where
                for f in fields[:-1]:
                    name += f".{f}"
                    node = c.mapping(c.need(node, f, "mapping", name), name)
                c.need(node, fields[-1], "number or null", f"{name}.{fields[-1]}")
    c.opt(d, "model_bytes", "mapping")
    c.opt(d, "cold_start", "mapping or null")
    c.opt(d, "wall_s", "number")
    return d


def read_metrics(path):
    """A variant's ``metrics.json`` (Evaluation.summary) as a dict; ``epsilon`` a number or null
    where present; Raises CorruptFileError."""
    c = _Checker(Path(path), "metrics file")
    d = c.mapping(read_json(path, c.kind))
    c.opt(d, "epsilon", "number or null")
    return d


def read_verdict(path):
    """A variant's ``verdict.json`` as a dict: ``clauses`` a list of mappings (``metric``,
    ``stratum``, ``op`` str; ``threshold`` a number or null), ``passed`` a bool, ``failed`` a
    list. Raises CorruptFileError."""
    c = _Checker(Path(path), "verdict file")
    d = c.mapping(read_json(path, c.kind))
    c.opt(d, "passed", "bool")
    c.opt(d, "failed", "list")
    for i, clause in enumerate(c.need(d, "clauses", "list")):
        c.mapping(clause, f"clauses[{i}]")
        for key in ("metric", "stratum", "op"):
            c.opt(clause, key, "str", f"clauses[{i}].{key}")
        c.opt(clause, "threshold", "number or null", f"clauses[{i}].threshold")
    return d


def read_summary(path):
    """``summary.csv`` as a DataFrame with the ``SUMMARY_COLUMNS`` and, per timed batch size
    ``b<B>_speedup``, its ``_ci_low``/``_ci_high`` numeric columns; every row has a variant
    (each once), family and verdict. An empty file gives an empty frame with a ``variant``
    column. Raises CorruptFileError."""
    import pandas as pd

    path = Path(path)
    kind = "summary table"
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    except _MISSING_OK:
        raise
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError, OSError) as e:
        raise CorruptFileError(path, kind, f"not CSV: {_error(e)}") from None
    if df.empty:
        return df
    missing = [c for c in SUMMARY_COLUMNS if c not in df.columns]
    if missing:
        raise CorruptFileError(path, kind, f"no column {', '.join(missing)}; it has "
                               f"{short_repr(', '.join(map(str, df.columns)))}")
    for col in SUMMARY_COLUMNS:  # a short or cut row leaves these empty (NaN)
        empty = df[col].isna().to_numpy() | (df[col].astype(str).str.strip() == "").to_numpy()
        if empty.any():
            raise CorruptFileError(path, kind, f"row {int(empty.nonzero()[0][0]) + 1} has no "
                                   f"{col} (a cut or short row)")
    twice = df["variant"][df["variant"].duplicated()]
    if len(twice):
        raise CorruptFileError(path, kind, f"variant {short_repr(str(twice.iloc[0]))} is listed "
                               "twice")
    for col in df.columns:
        if re.fullmatch(r"(e2e_)?b\d+_speedup(_ci_low|_ci_high)?", col):
            if not pd.api.types.is_numeric_dtype(df[col]):
                raise CorruptFileError(path, kind, f"column {col} holds non-numbers, e.g. "
                                       f"{short_repr(df[col].iloc[0])}")
    for col in [c for c in df.columns if re.fullmatch(r"b\d+_speedup", c)]:
        for side in ("_ci_low", "_ci_high"):
            if col + side not in df.columns:
                raise CorruptFileError(path, kind, f"column {col} without {col + side}")
    return df

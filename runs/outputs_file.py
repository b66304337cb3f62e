"""Read a file of decision logits written by another runtime (``variants judge RUN --outputs
FILE``; no MLX): JSONL, Parquet or npz, one row per example id.

Formats (chosen by the file's suffix)
-------------------------------------
``.jsonl`` / ``.ndjson``
    One JSON object per line: ``"id"`` (str, or an int read as its decimal text) and
    ``"logits"`` (a list of numbers; ``NaN``, ``Infinity`` and ``-Infinity`` as Python's json
    writes them are numbers), optional ``"latency_ms"`` (a number >= 0, or null = not timed).
    Other keys are ignored; blank lines are skipped.
``.parquet`` / ``.pq``
    Columns ``id`` (string or integer) and either ``logits`` (a list of numbers per row) or
    ``logit_0`` … ``logit_{W-1}`` (numbers; a null is padding, allowed only past the row's
    options), optional ``latency_ms`` (numbers, null = not timed). Read with pyarrow (a
    dependency of the package).
``.npz``
    Arrays ``ids`` (N,) of str or int and ``logits`` (N, W) of floats, optional ``latency_ms``
    (N,) floats (NaN = not timed); read with ``allow_pickle=False``.

A row's logits are the raw scores of its options in the reference's option order, before any
temperature: either exactly as many as the row has options, or the run's full width K (the
widest row), entries past the row's options ignored. Whether the counts fit the run is checked
by :mod:`runs.judge_file`, which knows the run; this module checks only the file itself.

Every problem raises :class:`OutputsFileError` (a ValueError: ``variants`` prints it as one
line and exits 2) naming the file, the line or row, and the fix.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from metrics._checks import short_list, short_path, short_repr

#: suffix -> format name
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet",
           ".npz": "npz"}
#: how many offending rows a message names before "and N more"
SHOWN = 5


class OutputsFileError(ValueError):
    """A logits file that cannot be judged: unreadable, of an unknown format, or whose rows do
    not fit the run (one line naming the file, what is wrong and the fix)."""


@dataclass
class LogitsFile:
    """The rows of a logits file, in file order.

    Attributes
    ----------
    path : Path
    format : str
        ``jsonl``, ``parquet`` or ``npz``.
    ids : list of str, length N
    logits : list of ndarray, length N
        Each row's logits, float64 (1-D; lengths may differ between rows).
    padding : list of ndarray or None
        Per row, True where a value was null (Parquet ``logit_<j>`` columns only); None when the
        file has no nulls.
    latency_ms : ndarray of shape (N,), float64, or None
        Per-row latency in milliseconds as the file reports it, NaN where a row has none;
        None when no row has one.
    """

    path: Path
    format: str
    ids: list
    logits: list
    padding: list = None
    latency_ms: np.ndarray = None

    def __len__(self):
        return len(self.ids)


def _fail(path, problem, fix="see `variants judge --help` for the file formats"):
    raise OutputsFileError(f"outputs file {short_path(path)}: {problem}; {fix}")


def _id_text(value):
    """An id as text: str as is, an int as its decimal text; None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value))
    return None


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _latency(path, where, value):
    """A latency value: None (not timed) or a finite number >= 0."""
    if value is None:
        return math.nan
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        _fail(path, f"{where}: latency_ms is {short_repr(value)}, expected a finite number of "
                    "milliseconds >= 0 (or null when not timed)")
    return float(value)


def _read_jsonl(path):
    ids, logits, latency = [], [], []
    with open(path, encoding="utf-8-sig") as handle:  # a BOM is not a row
        try:
            for n, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                where = f"line {n}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    _fail(path, f"{where} is not JSON ({e.msg} at column {e.colno})",
                          "write one JSON object per line")
                if not isinstance(row, dict):
                    _fail(path, f"{where} is {short_repr(row, 40)}, not a JSON object",
                          'write one object per line, e.g. {"id": "tweet:1", "logits": [0.1, '
                          '-2.0, 1.3]}')
                if "id" not in row or _id_text(row["id"]) is None:
                    _fail(path, f"{where}: id is {short_repr(row.get('id'), 40)}, expected a "
                                "string (or an integer)", 'give every row its example id, '
                                'e.g. "id": "tweet:1"')
                values = row.get("logits")
                if (not isinstance(values, list) or not values
                        or not all(_is_number(v) for v in values)):
                    _fail(path, f"{where} (id {short_repr(_id_text(row['id']), 40)}): logits is "
                                f"{short_repr(values, 60)}, expected a non-empty list of numbers",
                          'write "logits": [one number per option]')
                ids.append(_id_text(row["id"]))
                logits.append(np.asarray(values, dtype=np.float64))
                latency.append(_latency(path, where, row.get("latency_ms")))
        except UnicodeDecodeError as e:
            _fail(path, f"not UTF-8 text ({e.reason})", "write the JSONL file as UTF-8")
    return ids, logits, None, np.asarray(latency, dtype=np.float64)


def _numeric(path, what, array):
    if array.dtype.kind not in "fiu" or array.dtype.kind == "b":
        _fail(path, f"{what} has dtype {array.dtype}, expected numbers")
    return array.astype(np.float64)


def _ids_of(path, values, what):
    out = [_id_text(v) for v in values]
    bad = [i for i, v in enumerate(out) if v is None]
    if bad:
        _fail(path, f"{what} of row {bad[0]} is {short_repr(values[bad[0]], 40)}, expected a "
                    f"string or an integer ({len(bad)} such rows)",
              "give every row its example id, e.g. tweet:1")
    return out


def _read_parquet(path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        _fail(path, f"not a readable Parquet file ({short_repr(str(e), 120)[1:-1]})",
              "write it with pandas.DataFrame.to_parquet or pyarrow.parquet.write_table")
    names = table.column_names
    if "id" not in names:
        _fail(path, f"no id column (it has: {short_list(names)})", "add the example ids as "
                                                                  "column id")
    ids = _ids_of(path, table.column("id").to_pylist(), "id")
    wide = sorted((c for c in names if c.startswith("logit_") and c[6:].isdigit()),
                  key=lambda c: int(c[6:]))
    padding = None
    if "logits" in names:
        rows = table.column("logits").to_pylist()
        logits = []
        for i, values in enumerate(rows):
            if (not isinstance(values, list) or not values
                    or not all(_is_number(v) for v in values)):
                _fail(path, f"row {i} (id {short_repr(ids[i], 40)}): logits is "
                            f"{short_repr(values, 60)}, expected a non-empty list of numbers",
                      "write a list of one number per option")
            logits.append(np.asarray(values, dtype=np.float64))
    elif wide:
        expect = [f"logit_{j}" for j in range(len(wide))]
        if wide != expect:
            _fail(path, f"logit columns {short_list(wide)} are not logit_0 … "
                        f"logit_{len(wide) - 1}", "number them from 0 without gaps")
        cols = []
        for c in wide:
            col = table.column(c)
            if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
                _fail(path, f"column {c} has type {col.type}, expected numbers")
            cols.append(np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
                        if col.null_count == 0 else
                        np.asarray([math.nan if v is None else v for v in col.to_pylist()],
                                   dtype=np.float64))
        matrix = np.stack(cols, axis=1)
        nulls = np.stack([np.asarray(table.column(c).is_null().to_pylist(), bool) for c in wide],
                         axis=1)
        logits = list(matrix)
        padding = list(nulls) if nulls.any() else None
    else:
        _fail(path, f"no logits column and no logit_0 … columns (it has: {short_list(names)})",
              "add a column logits (a list per row) or logit_0, logit_1, …")
    latency = None
    if "latency_ms" in names:
        latency = np.asarray([_latency(path, f"row {i}", v) for i, v in
                              enumerate(table.column("latency_ms").to_pylist())], np.float64)
    return ids, logits, padding, latency


def _read_npz(path):
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an .npz archive")
            arrays = {k: z[k] for k in z.files}
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception as e:  # BadZipFile, pickled object arrays, garbage
        why = ("an array of Python objects (write str ids: np.asarray(ids, dtype=str))"
               if "allow_pickle" in str(e) else f"{type(e).__name__}: {short_repr(str(e), 120)}")
        _fail(path, f"not an .npz archive of plain arrays ({why})",
              "write it with numpy.savez(FILE, ids=..., logits=...)")
    for name in ("ids", "logits"):
        if name not in arrays:
            _fail(path, f"no {name} array (it has: {short_list(sorted(arrays)) or 'none'})",
                  "write numpy.savez(FILE, ids=<(N,) str>, logits=<(N, K) float>)")
    ids, logits = arrays["ids"], arrays["logits"]
    if ids.ndim != 1 or ids.dtype.kind not in "USiu":
        _fail(path, f"ids has shape {ids.shape} and dtype {ids.dtype}, expected (N,) str or int")
    if logits.ndim != 2 or logits.shape[0] != ids.shape[0] or logits.shape[1] == 0:
        _fail(path, f"logits has shape {logits.shape}, expected ({ids.shape[0]}, K): one row "
                    "per id, one column per option")
    matrix = _numeric(path, "logits", logits)
    latency = None
    if "latency_ms" in arrays:
        lat = arrays["latency_ms"]
        if lat.shape != ids.shape:
            _fail(path, f"latency_ms has shape {lat.shape}, expected {ids.shape}: one value per "
                        "row (NaN = not timed)")
        lat = _numeric(path, "latency_ms", lat)
        if (lat[~np.isnan(lat)] < 0).any() or np.isinf(lat).any():
            i = int(np.flatnonzero(np.isinf(lat) | (lat < 0))[0])
            _fail(path, f"latency_ms of row {i} is {lat[i]}, expected a finite number of "
                        "milliseconds >= 0 (NaN when not timed)")
        latency = lat
    return [str(v) for v in ids.tolist()], list(matrix), None, latency


def read_logits_file(path):
    """Read a logits file (format by suffix, see the module docstring).

    Parameters
    ----------
    path : path-like

    Returns
    -------
    LogitsFile

    Raises
    ------
    OutputsFileError
        A missing file or a folder, an unknown suffix, a file that does not parse, a row
        without an id or logits, a latency that is not a number >= 0, or no rows at all.
    PermissionError
        As the file system raises it (``variants`` reports it in one line).
    """
    path = Path(path)
    if path.is_dir():
        _fail(path, "is a folder", "pass the logits file itself")
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        _fail(path, f"unknown format {short_repr(path.suffix or '(no suffix)')}",
              f"pass a {', '.join(sorted(set(FORMATS)))} file")
    if not path.exists():
        _fail(path, "not found", "pass the path of the logits file")
    ids, logits, padding, latency = {"jsonl": _read_jsonl, "parquet": _read_parquet,
                                     "npz": _read_npz}[fmt](path)
    if not ids:
        _fail(path, "holds no rows", "write one row per example id of the run")
    if latency is not None and np.isnan(latency).all():
        latency = None
    return LogitsFile(path=path, format=fmt, ids=ids, logits=logits, padding=padding,
                      latency_ms=latency)

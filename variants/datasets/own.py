"""The team's own data: read a JSONL, CSV or Parquet file into checked, normalized rows, and
turn them into :class:`variants.datasets.tasks.TaskSet` rows. Every problem is found before anything is
written and reported as one :class:`DataError` line (file, row, column, fix).

The schema (columns, how each cell is read) is in :mod:`variants.datasets.own_schema`; the text
below (:data:`SCHEMA_HELP`) is what ``variants sweep --help`` prints.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

from metrics._checks import short_repr
from runs.io import digest
from variants.datasets.splits import SPLITS, assign_split
from variants.datasets.own_schema import (COLUMNS, REQUIRED, DataError, RowChecker, closest_column,
                                          fail, from_csv_cell, is_missing, plain)

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet",
           ".pq": "parquet"}
PARQUET_INSTALL = "pip install pyarrow"

SCHEMA_HELP = """\
--data FILE: your own rows as JSONL (one object per line), CSV (header row; list cells as JSON,
e.g. ["no", "yes"]) or Parquet. Columns (only text is required):
  text      the state the model reads (a string; empty or blank ones are kept and judged)
  id        unique id (default: a hash of the text); also decides the hash split
  question  question text for prompt templates
  options   list of option texts (>= 2, unique); rows may differ in count (K = max, masked);
            default: the model config's options
  label     the right option: 0-based index or option text (empty or -1 = unlabelled)
  scores    list of numbers, one per option (default: the model config's)
  actions   list of action names, one per option (default: the model config's, else the
            option texts)
  raters    each rater's choice (indices or option texts), or shares per option summing to 1
            (numbers with a decimal point, or {"option": share})
  split     fit / calibration / eval (empty: sha256 of the id, 60/20/20, as for VADER)
  task      question kind for strata (default: options-K)
Every split must end up non-empty. Bad rows stop the run with one line naming file, row, column."""


def _where_line(n):
    return f"line {n}"


def _decode_lines(path, raw: bytes):
    """UTF-8 text of the file (BOM dropped); a bad byte is reported with its 1-based line."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise fail(path, _where_line(line), None, f"byte {column} of the line is not valid "
                   f"UTF-8 ({e.reason})", "re-save the file as UTF-8") from None


class _Repeated(Exception):
    """A key given twice in one JSON object (json.loads would keep the last silently)."""


def _no_repeats(pairs):
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            raise _Repeated(k)
    return dict(pairs)


def _read_jsonl(path, raw):
    records = []
    for n, line in enumerate(_decode_lines(path, raw).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_no_repeats)
        except _Repeated as e:
            raise fail(path, _where_line(n), e.args[0], "the column appears twice",
                       "keep one of them") from None
        except json.JSONDecodeError as e:
            raise fail(path, _where_line(n), None, f"not valid JSON ({e.msg} at column "
                       f"{e.colno})", "write one JSON object per line") from None
        if not isinstance(obj, dict):
            raise fail(path, _where_line(n), None, f"{short_repr(obj)} is not a JSON object",
                       'write one object per line, e.g. {"text": "..."}')
        records.append((_where_line(n), obj))
    return records, None


def _read_csv(path, raw):
    reader = csv.reader(io.StringIO(_decode_lines(path, raw), newline=""))
    header, records, last = None, [], 0
    for cells in reader:
        start, last = last + 1, reader.line_num
        # a blank line; in a one-column file a cell of blanks (or `""`) is an empty text
        if not cells or (not any(c.strip() for c in cells)
                         and (header is None or len(header) > 1)):
            continue
        if header is None:
            header = [c.strip() for c in cells]
            twice = [h for h in header if h and header.count(h) > 1]
            if twice:
                raise fail(path, _where_line(start), twice[0], "the column appears twice in "
                           "the header", "keep one of them")
            continue
        if len(cells) != len(header):
            raise fail(path, _where_line(start), None, f"has {len(cells)} cells but the header "
                       f"has {len(header)}", "quote cells that hold commas (lists as JSON in "
                       "double quotes)")
        where = _where_line(start)

        def err(column, problem, fix, where=where):
            return fail(path, where, column, problem, fix)

        records.append((where, {h: from_csv_cell(c, h, err) if h in COLUMNS else c
                                for h, c in zip(header, cells)}))
    return records, header


def _read_parquet(path, raw):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise fail(path, None, None, "reading Parquet needs pyarrow, which is not installed",
                   f"run `{PARQUET_INSTALL}` or convert the file to JSONL/CSV") from None
    try:
        frame = pd.read_parquet(io.BytesIO(raw))
    except Exception as e:  # pyarrow raises its own error types
        raise fail(path, None, None, f"not a readable Parquet file ({type(e).__name__}: "
                   f"{str(e).splitlines()[0][:120] if str(e) else ''})",
                   "write it with pandas.DataFrame.to_parquet") from None
    frame = frame.reset_index(drop=True)
    records = [(f"row index {i}", {c: plain(v) for c, v in rec.items()})
               for i, rec in enumerate(frame.to_dict("records"))]
    return records, list(frame.columns)


def _check_columns(path, records, header):
    """Unknown/misspelt columns (first place each appears) and a missing ``text`` column."""
    seen = list(header) if header is not None else []
    places = {name: "line 1" for name in seen} if header is not None else {}
    if header is None:
        for where, rec in records:
            for name in rec:
                if name not in places:
                    places[name] = where
                    seen.append(name)
    for name in seen:
        if name not in COLUMNS:
            where = None if path.suffix.lower() in (".parquet", ".pq") else places[name]
            raise fail(path, where, name, "unknown column", closest_column(name))
    for name in REQUIRED:
        if name not in seen:
            raise fail(path, None, name, "the required column is missing",
                       f"add a {name!r} column holding each row's text (columns found: "
                       f"{short_repr(seen)})")


def resolve_row(raw, err, options=None, scores=None, actions=None, fill=True, unread=None):
    """One row's cells checked and normalized (label -> index, raters -> shares per option).

    ``options``/``scores``/``actions`` are the defaults for rows without their own; with
    ``fill=False`` they are used for the checks only and the row keeps its own (None where the
    file has none), so defaults given later still apply. With ``fill=True`` a row without any
    actions maps each option to an action named like the option. While a row has no options
    at all, its label/scores/actions/raters are kept as given. ``unread``: why the model reads
    no labels (a regression head); a row with a label or raters is then refused with it.
    """
    c = RowChecker(err)
    if unread:
        for column in ("label", "raters"):
            value = raw.get(column)
            if isinstance(value, (list, dict)) or c.label(value, None) != -1:
                raise err(column, f"{unread}, so {column} cells are not read",
                          f"drop the {column} column")
    row = {"id": c.optional_str(raw.get("id"), "id"), "text": c.text(raw.get("text")),
           "question": c.optional_str(raw.get("question"), "question"),
           "task": c.optional_str(raw.get("task"), "task"), "split": c.split(raw.get("split"))}
    given = {name: raw.get(name) for name in ("options", "scores", "actions", "raters")}
    given = {k: (None if not isinstance(v, (list, dict)) and is_missing(v) else v)
             for k, v in given.items()}
    own = c.options(given["options"]) if given["options"] is not None else None
    opts = own if own is not None else options
    row["options"] = own if not fill else (None if opts is None else list(opts))
    row["label"] = c.label(raw.get("label"), opts)
    row["raters"] = c.raters(given["raters"], opts)
    if opts is None:
        row["scores"], row["actions"] = given["scores"], given["actions"]
        return row
    k = len(opts)
    for name, default in (("scores", scores), ("actions", actions)):
        value = given[name]
        if value is not None:
            row[name] = c.scores(value, k) if name == "scores" else c.string_list(
                value, "actions", k, "actions")
            continue
        if default is not None and len(default) != k:
            raise err(name, f"the model config's {len(default)} default {name} do not fit "
                      f"the row's {k} options", f"give the row its own {name}")
        row[name] = None
        if fill:
            row[name] = list(default) if default is not None else (
                list(opts) if name == "actions" else None)
    return row


def _row_error(path, where):
    def err(column, problem, fix):
        return fail(path, where, column, problem, fix)
    return err


def _fill_ids_and_splits(path, rows, wheres, require_splits):
    first = {}
    for row, where in zip(rows, wheres):
        if row["id"] is None:
            base = "t" + hashlib.sha256(row["text"].encode("utf-8")).hexdigest()[:12]
            row["id"], n = base, 1
            while row["id"] in first:  # the same text again: a stable numbered id
                n += 1
                row["id"] = f"{base}#{n}"
        elif row["id"] in first:
            raise fail(path, where, "id", f"id {short_repr(row['id'])} repeats {first[row['id']]}",
                       "make every id unique (or drop the id column to use text hashes)")
        first[row["id"]] = where
    missing = [i for i, row in enumerate(rows) if row["split"] is None]
    hashed = assign_split([rows[i]["id"] for i in missing])
    for i, name in zip(missing, hashed):
        rows[i]["split"] = str(name)
    for name in require_splits:
        if not any(row["split"] == name for row in rows):
            raise fail(path, None, "split", f"the {name} split is empty ({len(rows)} rows)",
                       f"add rows, or a 'split' column marking some rows {name!r}")


def read_data(path, *, options=None, scores=None, actions=None, require_splits=SPLITS,
              unread=None):
    """Read and check the user's data file.

    Parameters
    ----------
    path : str or path-like
        ``.jsonl``/``.ndjson`` (one JSON object per line), ``.csv`` (header row; list cells are
        JSON strings; an integer-looking label is an index) or ``.parquet``/``.pq`` (pyarrow).
    options, scores, actions : list, optional
        Model-config defaults for rows without their own (see :func:`resolve_row`).
    require_splits : tuple of str, default=SPLITS
        Splits that must hold at least one row.
    unread : str, optional
        Why the model reads no labels (e.g. a regression head, judged against the reference's
        values): a row with a ``label`` or ``raters`` cell is then refused, naming it.

    Returns
    -------
    frame : pandas.DataFrame, one row per data row in file order, columns :data:`COLUMNS`:
        ``id`` str (unique; default ``"t" + sha256(text)[:12]``), ``text`` str, ``question``
        str or None, ``task`` str or None, ``options`` list[str] or None (the file's own;
        defaults are checked, not stored), ``label`` int (0-based, -1 = unlabelled; kept as
        given while the row has no options), ``scores``
        list[float] or None, ``actions`` list[str] or None, ``raters`` list[float] (shares per
        option, summing to 1) or None, ``split`` in ``SPLITS`` (given, else
        :func:`variants.datasets.splits.assign_split` of the id). The index holds each row's
        location ("line 7" / "row index 6"); ``frame.attrs["path"]`` the file.

    Raises
    ------
    DataError
        One line naming the file, row and column: missing file, unknown extension, empty file,
        non-UTF-8 bytes, bad JSON, unknown column (closest name suggested), missing text, bad
        option list, label/rater choice outside the options, list lengths differing from the
        options, a distribution not summing to 1, unknown split, duplicate id, empty split, a
        label or raters cell where ``unread`` says none is read.
    """
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise fail(path, None, None, f"unknown file type {short_repr(path.suffix or '(none)')}",
                   f"use one of {', '.join(FORMATS)}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise fail(path, None, None, "the file does not exist", "check the path") from None
    except OSError as e:
        raise fail(path, None, None, f"cannot be read ({e.strerror})", "check the path") from None
    reader = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}[fmt]
    records, header = reader(path, raw) if raw.strip() else ([], None)
    if not records:
        raise fail(path, None, None, "the file holds no rows",
                   "add rows with at least a 'text' column")
    _check_columns(path, records, header)
    wheres = [where for where, _ in records]
    rows = [resolve_row(rec, _row_error(path, where), options, scores, actions, False, unread)
            for where, rec in records]
    _fill_ids_and_splits(path, rows, wheres, require_splits)
    frame = pd.DataFrame({name: pd.Series([r[name] for r in rows], dtype=object)
                          for name in COLUMNS})
    frame.index = pd.Index(wheres, name="row")
    frame.attrs["path"] = str(path)
    return frame


def split_rows(frame, split):
    """The rows of one split, in file order (index and ``attrs`` kept)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    return frame.loc[frame["split"].to_numpy() == split]


def taskset_rows(frame, *, options=None, scores=None, actions=None, action_names=None,
                 task=None):
    """Rows for :func:`variants.datasets.tasks.build_taskset` from a :func:`read_data` frame.

    Parameters
    ----------
    frame : pandas.DataFrame from :func:`read_data` (or a subset of it)
    options, scores, actions : list, optional
        The model config's fixed options/scores/actions for rows without their own.
    action_names : sequence of str, optional
        All action names in order; default: the actions in order of first appearance.
    task : str, optional
        Task name for rows without a ``task`` (default ``"options-K"``, K the row's options).

    Returns
    -------
    rows : list of dict
        ``id, task, text, question, options, scores, actions, label (int, -1 = unknown),
        human (shares per option or None)``.
    k_max : int
        Most options of any row (the TaskSet's K; shorter rows are masked).
    action_names : tuple of str

    Raises
    ------
    DataError
        A row without options and no default options, a label/rater/score/action that does not
        fit the options, or an action not in ``action_names``.
    """
    path = frame.attrs.get("path", "(frame)")
    out = []
    for where, rec in zip(frame.index, frame.to_dict("records")):
        err = _row_error(path, where)
        row = resolve_row(rec, err, options, scores, actions)
        if row["options"] is None:
            raise err("options", "the row has no options and the model config gives none",
                      "add an 'options' list to every row, or fixed options to the model TOML")
        k = len(row["options"])
        out.append(dict(id=row["id"], task=row["task"] or task or f"options-{k}",
                        text=row["text"], question=row["question"], options=row["options"],
                        scores=row["scores"], actions=row["actions"], label=int(row["label"]),
                        human=row["raters"]))
    seen = list(dict.fromkeys(a for r in out for a in r["actions"]))
    if action_names is None:
        action_names = seen
    for where, r in zip(frame.index, out):
        bad = [a for a in r["actions"] if a not in action_names]
        if bad:
            raise fail(path, where, "actions", f"action {short_repr(bad[0])} is not one of the "
                       f"model's actions {short_repr(list(action_names))}",
                       "use one of those names or add it to the model TOML's actions")
    return out, max((len(r["options"]) for r in out), default=0), tuple(action_names)


def to_taskset(frame, **defaults):
    """:func:`taskset_rows` assembled by :func:`variants.datasets.tasks.build_taskset`."""
    from variants.datasets.tasks import build_taskset

    rows, k_max, action_names = taskset_rows(frame, **defaults)
    return build_taskset(rows, k_max=k_max, action_names=action_names)


def data_fingerprint(frame):
    """16 hex digits over every field of every row (order included): a cache-key part.

    Follows :func:`runs.io.digest` (sha256 of the JSON form); NaN is written as None.
    """
    def clean(v):
        v = plain(v)
        if isinstance(v, list):
            return [clean(x) for x in v]
        return None if isinstance(v, float) and np.isnan(v) else v

    return digest("own-data-v1", {name: [clean(v) for v in frame[name].tolist()]
                                  for name in COLUMNS if name in frame.columns})

"""The user's data schema, one row at a time: which columns exist, how a cell of each is read
(JSONL value, CSV string, Parquet value) and checked, and the one-line :class:`DataError`.

The reader and the conversion to a :class:`variants.datasets.tasks.TaskSet` are in
:mod:`variants.datasets.own`; this module knows nothing about files beyond the location text.
"""

from __future__ import annotations

import difflib
import json
import math
import re

import numpy as np

from metrics._checks import short_repr
from variants.datasets.splits import SPLITS

#: Every column a data file may have; ``text`` is the only required one.
COLUMNS = ("id", "text", "question", "options", "label", "scores", "actions", "raters", "split",
           "task")
REQUIRED = ("text",)
LIST_COLUMNS = ("options", "scores", "actions", "raters")  # JSON strings in a CSV cell
#: Tolerance on a rater distribution's sum (float32 writers round to ~1e-7 per entry).
DIST_TOLERANCE = 1e-4
# common names for the three splits, so the message can say which one was meant
SPLIT_ALIASES = {"train": "fit", "training": "fit", "val": "calibration", "valid": "calibration",
                 "validation": "calibration", "dev": "calibration", "calib": "calibration",
                 "test": "eval", "evaluation": "eval", "holdout": "eval"}
_INT_RE = re.compile(r"[+-]?\d+(\.0*)?")  # pandas writes an int column with NaN as 2.0


class DataError(ValueError):
    """A data file the suite cannot use. The message is one line: the file, the row (1-based
    line for JSONL/CSV, 0-based row index for Parquet), the column, the problem and the fix."""


def fail(path, where, column, problem, fix) -> DataError:
    """Build the one-line :class:`DataError` (``where``/``column`` may be None)."""
    place = ", ".join(p for p in (where, f"column {column!r}" if column else None) if p)
    return DataError(f"data file {path}{': ' + place if place else ''}: {problem}; {fix}")


def closest_column(name: str) -> str:
    """The fix for an unknown column: the closest known name (difflib), else the full list."""
    known = ", ".join(COLUMNS)
    for sep, what in ((";", "semicolons"), ("\t", "tabs"), ("|", "'|'")):
        if sep in str(name) and any(c in str(name).split(sep) for c in COLUMNS):
            return (f"the header looks separated by {what}, but a CSV here is separated by "
                    f"commas: save it with commas (pandas: to_csv(sep=',')) or as JSONL "
                    f"(known columns: {known})")
    match = difflib.get_close_matches(str(name).lower(), COLUMNS, n=1, cutoff=0.6)
    if match:
        return f"did you mean {match[0]!r}? (known columns: {known})"
    return f"rename or remove it (known columns: {known})"


def is_missing(value) -> bool:
    """None, NaN, pandas NA or an empty/blank string."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, float):
        return math.isnan(value)
    try:
        import pandas as pd
        return value is pd.NA or value is pd.NaT
    except ImportError:  # pragma: no cover
        return False


def plain(value):
    """NumPy scalars/arrays and tuples as plain Python (Parquet gives arrays for list cells)."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def from_csv_cell(value: str, column: str, err):
    """A CSV cell as the value JSONL would hold: lists (and a rater dict) from JSON, an
    integer-looking label as an index, everything else the string itself."""
    if column == "text":  # the text as written: an empty cell is an empty text
        return value
    text = value.strip()
    if not text:
        return None
    if column in LIST_COLUMNS:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise err(column, f"{short_repr(text)} is not a JSON list",
                      'write list cells as JSON, e.g. ["negative", "neutral", "positive"]'
                      ) from None
    if column == "label" and _INT_RE.fullmatch(text):
        return int(float(text))
    return value


class RowChecker:
    """Reads and checks the cells of one row; ``err(column, problem, fix)`` builds the error."""

    def __init__(self, err):
        self.err = err

    def text(self, value):
        """The row's text as written. An empty or whitespace-only string is a text (it tokenizes
        to [CLS] [SEP]: kept, judged and counted as special-tokens-only); only an absent value
        (None, NaN, pandas NA) is missing."""
        if isinstance(value, str):
            return value
        if is_missing(value):
            raise self.err("text", "the text is missing",
                           "every row needs a 'text' string (the state the model reads; \"\" "
                           "for an empty one)")
        raise self.err("text", f"{short_repr(value)} is not a string", "quote the text")

    def optional_str(self, value, column):
        if is_missing(value):
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.err(column, f"{short_repr(value)} is not a string",
                           f"write {column} as text")
        return str(value).strip() if column == "id" else str(value)

    def string_list(self, value, column, n=None, what="values"):
        if not isinstance(value, list):
            raise self.err(column, f"{short_repr(value)} is not a list",
                           f'write {column} as a list, e.g. ["a", "b"]')
        if n is not None and len(value) != n:
            raise self.err(column, f"has {len(value)} {what} but the row has {n} options",
                           f"give one {column[:-1]} per option")
        bad = [v for v in value if not isinstance(v, str) or not v.strip()]
        if bad:
            raise self.err(column, f"{short_repr(bad[0])} is not a non-empty string",
                           f"write each of {column} as text")
        return [str(v) for v in value]

    def options(self, value):
        opts = self.string_list(value, "options")
        if len(opts) < 2:
            raise self.err("options", f"has {len(opts)} option(s)", "give at least 2 options")
        if len(set(opts)) != len(opts):
            dup = next(o for o in opts if opts.count(o) > 1)
            raise self.err("options", f"option {short_repr(dup)} appears twice",
                           "make each option text unique within the row")
        return opts

    def scores(self, value, k):
        if not isinstance(value, list):
            raise self.err("scores", f"{short_repr(value)} is not a list",
                           "write scores as a list of numbers, one per option")
        if len(value) != k:
            raise self.err("scores", f"has {len(value)} values but the row has {k} options",
                           "give one score per option")
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                 for v in value)
        if not ok:
            raise self.err("scores", f"{short_repr(value)} holds a non-number or non-finite value",
                           "write each score as a finite number")
        return [float(v) for v in value]

    def choice(self, value, options, column, fix):
        """An option given as a 0-based index (int) or as its text; returns the index."""
        k = len(options)
        if isinstance(value, int) and not isinstance(value, bool):
            if 0 <= value < k:
                return value
            raise self.err(column, f"index {value} is outside the row's {k} options", fix)
        if isinstance(value, float) and value.is_integer() and 0 <= value < k:
            return int(value)
        if isinstance(value, str) and value in options:
            return options.index(value)
        near = difflib.get_close_matches(str(value), options, n=1) if isinstance(value, str) else []
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise self.err(column, f"{short_repr(value)} is not one of the row's options "
                       f"{short_repr(options)}", hint + fix)

    def label(self, value, options):
        if is_missing(value) or (isinstance(value, int) and not isinstance(value, bool)
                                 and value == -1):
            return -1
        if options is None:  # resolved once the options are known
            return value
        return self.choice(value, options, "label",
                           f"use an option text or a 0-based index below {len(options)}")

    def raters(self, value, options):
        """Per-rater choices (indices or option texts) or a distribution -> shares per option."""
        if not isinstance(value, (list, dict)) and is_missing(value):
            return None
        if options is None:
            return value
        k = len(options)
        if isinstance(value, dict):
            unknown = [key for key in value if key not in options]
            if unknown:
                raise self.err("raters", f"{short_repr(unknown[0])} is not one of the row's "
                               f"options {short_repr(options)}", "key the shares by option text")
            value = [value.get(o, 0.0) for o in options]
            return self._distribution(value, k, force=True)
        if not isinstance(value, list) or not value:
            raise self.err("raters", f"{short_repr(value)} is not a non-empty list",
                           "write raters as a list of each rater's choice, or a list of shares "
                           "per option summing to 1")
        if any(isinstance(v, float) for v in value):  # numbers with a decimal point: shares
            return self._distribution(value, k)
        counts = np.zeros(k)
        fix = f"give each rater's choice as an option text or a 0-based index below {k}"
        for v in value:
            counts[self.choice(v, options, "raters", fix)] += 1
        return (counts / counts.sum()).tolist()

    def _distribution(self, value, k, force=False):
        if len(value) != k:
            raise self.err("raters", f"a distribution of {len(value)} shares but the row has "
                           f"{k} options", "give one share per option (or per-rater choices)")
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                 and v >= 0 for v in value)
        total = float(sum(value)) if ok else float("nan")
        if not ok or abs(total - 1.0) > DIST_TOLERANCE:
            raise self.err("raters", f"the distribution {short_repr(value)} sums to "
                           f"{total:.6g}, not 1", "give shares >= 0 that sum to 1 (or "
                           "per-rater choices as integers / option texts)")
        return [float(v) for v in value]

    def split(self, value):
        if is_missing(value):
            return None
        name = str(value).strip()
        if name in SPLITS:
            return name
        guess = SPLIT_ALIASES.get(name.lower()) or next(
            iter(difflib.get_close_matches(name.lower(), SPLITS, n=1, cutoff=0.5)), None)
        hint = f"did you mean {guess!r}? " if guess else ""
        raise self.err("split", f"{short_repr(value)} is not a split name",
                       f"{hint}use one of {', '.join(SPLITS)} (or leave it empty for the hash "
                       "split)")

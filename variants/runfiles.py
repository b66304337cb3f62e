"""One validating reader per file kind of a results folder and its cache (no MLX).

Every file a command reads back goes through one of these readers: ``run.json``, ``build.json``,
``timing.json``, ``metrics.json``, ``verdict.json``, ``summary.csv``, the outputs ``.npz`` files
(a run's and the reference-output cache's), the head cache (``.cache/heads``), the activation
statistics (``.cache/activations``) and the early-exit heads (``.cache/exit_heads``). Each parses
the file and checks the shape its callers rely on; a file that does not parse or has the wrong
shape raises :class:`CorruptFileError` naming the file, what is wrong and the fix (delete it and
rerun; only that part is rebuilt). A missing file is not corrupt: callers check for it (the
readers let ``FileNotFoundError`` through). npz files are read with ``allow_pickle=False``.
"""

import json
import re
from pathlib import Path

import numpy as np

from metrics._checks import short_repr

FIX = "delete it and rerun: only that part is rebuilt"
#: Required arrays of an outputs .npz (the fields of ``variants.outputs.DecisionOutputs``).
OUTPUT_FIELDS = ("ids", "task", "logits", "option_mask", "temperature", "probs", "option_scores",
                 "expected_score", "confidence", "action_probs", "labels", "human_dist")
#: Optional per-example arrays (``variants.outputs.OPTIONAL_FIELDS``).
OPTIONAL_OUTPUT_FIELDS = ("exit_layer",)
#: Fields of one timing.json entry (``batches`` / ``end_to_end`` per batch size) that
#: ``contracts.report.summary_row`` reads: (path, required).
TIMING_ENTRY_FIELDS = (("seq_len",), ("rounds",), ("ref", "p50_ms"), ("ref", "p95_ms"),
                       ("var", "p50_ms"), ("var", "p95_ms"), ("speedup", "speedup_median"),
                       ("speedup", "speedup_ci_low"), ("speedup", "speedup_ci_high"),
                       ("ref_peak_memory_bytes",), ("var_peak_memory_bytes",))
#: Columns every summary.csv has (``contracts.report.summary_row``).
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
            raise CorruptFileError(path, kind, f"row {int(np.flatnonzero(empty)[0]) + 1} has no "
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


# -- npz --------------------------------------------------------------------------------------
def _load_npz(path, kind):
    """{name: array} of an npz file; anything but a readable npz raises CorruptFileError."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an .npz archive")
            return {k: z[k] for k in z.files}
    except _MISSING_OK:
        raise
    except Exception as e:  # BadZipFile, EOFError, ValueError (pickled data), zlib, ...
        if isinstance(e, ValueError) and "allow_pickle" in str(e):
            e = ValueError("not an .npz archive of plain arrays (pickled data or garbage)")
        raise CorruptFileError(path, kind, _error(e)) from None


def _kind_ok(a, kinds):
    return a.dtype.kind in kinds


def check_outputs(arrays, path, kind="outputs file", required=OUTPUT_FIELDS):
    """Validate a dict of outputs arrays (see :func:`read_outputs`); returns it."""
    def fail(problem):
        raise CorruptFileError(path, kind, problem)

    missing = [f for f in required if f not in arrays]
    if missing:
        fail(f"no {', '.join(missing)} array" + ("s" if len(missing) > 1 else ""))
    dtype_names = {"US": "str", "f": "float", "b": "bool", "iu": "int"}
    spec = {"ids": (1, "US"), "task": (1, "US"), "logits": (2, "f"), "option_mask": (2, "b"),
            "temperature": (1, "f"), "probs": (2, "f"), "option_scores": (2, "f"),
            "expected_score": (1, "f"), "confidence": (1, "f"), "action_probs": (2, "f"),
            "labels": (1, "iu"), "human_dist": (2, "f"), "exit_layer": (1, "iu")}
    names = [f for f in spec if f in arrays]
    for f in names:
        ndim, kinds = spec[f]
        a = arrays[f]
        if a.ndim != ndim or not _kind_ok(a, kinds):
            fail(f"{f} has shape {a.shape} and dtype {a.dtype}, expected {ndim}-D "
                 f"{dtype_names[kinds]}")
    if not names:
        fail("no outputs array")
    n = arrays[names[0]].shape[0]
    ref2 = next((f for f in ("logits", "option_mask", "probs") if f in arrays), None)
    k = arrays[ref2].shape[1] if ref2 else None
    for f in names:
        a = arrays[f]
        if a.shape[0] != n:
            fail(f"{f} has {a.shape[0]} rows, {names[0]} has {n}")
        if spec[f][0] == 2 and f != "action_probs" and a.shape[1] != k:
            fail(f"{f} has {a.shape[1]} options per row, {ref2} has {k}")
    if n == 0 or (k is not None and k == 0):
        fail(f"{n} rows of {k} options: empty")
    if "option_mask" in arrays and not arrays["option_mask"].any(axis=1).all():
        fail("a row of option_mask has no valid option")
    if "option_mask" in arrays:  # values on valid options: what every metric reads
        m = arrays["option_mask"]
        for f in ("logits", "probs"):
            if f in arrays and not np.isfinite(arrays[f][m]).all():
                row = int(np.flatnonzero(~np.isfinite(np.where(m, arrays[f], 0)).all(axis=1))[0])
                fail(f"{f} has NaN or inf on a valid option (row {row})")
        if "probs" in arrays and not ((arrays["probs"][m] >= 0) & (arrays["probs"][m] <= 1)).all():
            fail("probs has a value outside [0, 1] on a valid option")
    if "temperature" in arrays:
        t = arrays["temperature"]
        if not (np.isfinite(t).all() and (t > 0).all()):
            fail("a temperature is not a finite number > 0")
    return arrays


def read_outputs(path, kind="outputs file", required=OUTPUT_FIELDS):
    """Arrays of an outputs .npz written by ``DecisionOutputs.save``.

    Returns {field: ndarray} of the ``OUTPUT_FIELDS`` and optional ``exit_layer`` present
    (other arrays are dropped). Checked: the ``required`` fields are present; ids/task 1-D str;
    logits, probs, option_scores, human_dist (N, K) float; option_mask (N, K) bool with a valid
    option per row; logits and probs finite on valid options, probs there in [0, 1]; temperature
    (N,) finite > 0; expected_score, confidence (N,) float;
    action_probs (N, A) float; labels, exit_layer (N,) int; N, K >= 1.

    Raises
    ------
    CorruptFileError
        Not an npz (truncated, garbage, pickled objects) or arrays of the wrong shape or dtype.
    """
    arrays = _load_npz(path, kind)
    keep = {k: v for k, v in arrays.items() if k in OUTPUT_FIELDS + OPTIONAL_OUTPUT_FIELDS}
    return check_outputs(keep, Path(path), kind, required)


def read_head_cache(path, head_shapes=None):
    """The fitted head and temperatures cached in ``.cache/heads/<model>-<key>.npz``.

    Returns {name: array}: ``t_keys`` (M,) int option counts, ``t_values`` (M,) float
    temperatures (finite > 0), and ``head_<name>`` arrays; ``head_shapes`` ({name: shape}, the
    model's own head state) makes each ``head_<name>`` required with that shape.
    Raises CorruptFileError.
    """
    kind = "head cache file"
    z = _load_npz(path, kind)

    def fail(problem):
        raise CorruptFileError(path, kind, problem)

    for key, kinds in (("t_keys", "iu"), ("t_values", "f")):
        if key not in z:
            fail(f"no {key} array")
        if z[key].ndim != 1 or not _kind_ok(z[key], kinds):
            fail(f"{key} has shape {z[key].shape} and dtype {z[key].dtype}, expected 1-D")
    if z["t_keys"].shape != z["t_values"].shape or len(z["t_keys"]) == 0:
        fail(f"t_keys {z['t_keys'].shape} and t_values {z['t_values'].shape} differ or are empty")
    if not (np.isfinite(z["t_values"]).all() and (z["t_values"] > 0).all()):
        fail("a temperature is not a finite number > 0")
    for name, shape in (head_shapes or {}).items():
        a = z.get(f"head_{name}")
        if a is None or a.shape != tuple(shape) or not _kind_ok(a, "f"):
            fail(f"head_{name} is " + ("missing" if a is None else f"{a.shape} {a.dtype}")
                 + f", expected float {tuple(shape)}")
    return z


def read_activation_stats(path, sites=None):
    """Activation statistics of ``.cache/activations/<model>-<key>.npz``.

    Returns {site: (gram (n, n) float64, abs_sum (n,) float64, count int >= 0)}; every value
    finite. ``sites`` (iterable of str) must all be present. Raises CorruptFileError.
    """
    kind = "activation statistics cache file"
    z = _load_npz(path, kind)

    def fail(problem):
        raise CorruptFileError(path, kind, problem)

    out = {}
    for site in sorted({k.rsplit("|", 1)[0] for k in z}):
        parts = [z.get(f"{site}|{p}") for p in ("gram", "abs_sum", "count")]
        if any(p is None for p in parts):
            fail(f"site {short_repr(site)} lacks gram, abs_sum or count")
        gram, abs_sum, count = parts
        n = abs_sum.shape[0] if abs_sum.ndim == 1 else -1
        if (gram.shape != (n, n) or not _kind_ok(gram, "f") or not _kind_ok(abs_sum, "f")
                or count.size != 1 or not _kind_ok(count, "iu")):
            fail(f"site {short_repr(site)}: gram {gram.shape}, abs_sum {abs_sum.shape}, count "
                 f"{count.shape} {count.dtype}; expected (n, n), (n,) float and one int")
        if not (np.isfinite(gram).all() and np.isfinite(abs_sum).all()) or int(count) < 0:
            fail(f"site {short_repr(site)} holds non-finite values or a negative count")
        out[site] = (gram, abs_sum, int(count))
    missing = sorted(set(sites or ()) - set(out))
    if missing:
        fail(f"no statistics for {short_repr(', '.join(missing))}")
    return out


def read_exit_heads(path, layers):
    """Early-exit heads of ``.cache/exit_heads/<model>-<key>.npz``: [(W (K, D), b (K,)) float]
    for each of ``layers``, all of one shape, finite. Raises CorruptFileError."""
    kind = "exit heads cache file"
    z = _load_npz(path, kind)
    heads = []
    for layer in layers:
        w, b = z.get(f"w{layer}"), z.get(f"b{layer}")
        if w is None or b is None:
            raise CorruptFileError(path, kind, f"no head for layer {layer} (w{layer}, b{layer})")
        if (w.ndim != 2 or b.shape != w.shape[:1] or not _kind_ok(w, "f") or not _kind_ok(b, "f")
                or (heads and w.shape != heads[0][0].shape)):
            raise CorruptFileError(path, kind, f"layer {layer}: w {w.shape} {w.dtype}, b "
                                   f"{b.shape} {b.dtype}; expected (K, D) and (K,) float, one "
                                   "shape for all layers")
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise CorruptFileError(path, kind, f"layer {layer} holds non-finite weights")
        heads.append((w, b))
    return heads


def check_same_ids(path, ids, ref_ids, what="the reference's"):
    """Raise CorruptFileError naming ``path`` unless ``ids`` (its outputs' example ids, (N,) str)
    equal ``ref_ids`` row for row: metrics pair row i of a variant with row i of the reference,
    so outputs of other or reordered examples would be judged against the wrong answers."""
    ids, ref_ids = np.asarray(ids).astype(str), np.asarray(ref_ids).astype(str)
    if ids.shape != ref_ids.shape:
        raise CorruptFileError(path, "outputs file", f"{ids.size} examples, {what} has "
                               f"{ref_ids.size}")
    bad = np.flatnonzero(ids != ref_ids)
    if bad.size:
        i = int(bad[0])
        raise CorruptFileError(path, "outputs file", f"its ids differ from {what} at {bad.size} "
                               f"row(s), first row {i}: {short_repr(str(ids[i]))} vs "
                               f"{short_repr(str(ref_ids[i]))}")

"""Validating readers of the npz files of a results folder and its cache (no MLX).

The outputs ``.npz`` files (a run's and the reference-output cache's), the head cache
(``.cache/heads``), the activation statistics (``.cache/activations``) and the early-exit heads
(``.cache/exit_heads``). Each checks the shapes its callers rely on and raises
:class:`runs.readers.CorruptFileError` naming the file, what is wrong and the fix; a missing file
is not corrupt (``FileNotFoundError`` passes through). Read with ``allow_pickle=False``.
"""

from pathlib import Path

import numpy as np

from metrics._checks import short_repr
from runs.readers import _MISSING_OK, CorruptFileError, _error

#: Required arrays of an outputs .npz (the fields of ``runs.outputs.DecisionOutputs``).
OUTPUT_FIELDS = ("ids", "task", "logits", "option_mask", "temperature", "probs", "option_scores",
                 "expected_score", "confidence", "action_probs", "labels", "human_dist")
#: Optional per-example arrays (``runs.outputs.OPTIONAL_FIELDS``; ``nonfinite_rows`` flags the
#: rows a variant answered with NaN or inf, :mod:`metrics.finite`).
OPTIONAL_OUTPUT_FIELDS = ("exit_layer", "nonfinite_rows")


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
            "labels": (1, "iu"), "human_dist": (2, "f"), "exit_layer": (1, "iu"),
            "nonfinite_rows": (1, "b")}
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
        from metrics.finite import nonfinite_rows

        m = arrays["option_mask"]
        bad = nonfinite_rows(arrays)
        flagged = arrays.get("nonfinite_rows")
        if flagged is not None and not np.array_equal(flagged, bad):
            row = int(np.flatnonzero(flagged != bad)[0])
            fail(f"nonfinite_rows does not flag the rows with NaN or inf (row {row})")
        if flagged is None and bad.any():
            row = int(np.flatnonzero(bad)[0])
            for f in ("logits", "probs", "action_probs"):
                a = arrays.get(f)
                if a is not None and not np.isfinite(a[row][m[row]] if a.shape == m.shape
                                                     else a[row]).all():
                    fail(f"{f} has NaN or inf on a valid option (row {row})")
        ok = m & ~bad[:, None]
        if "probs" in arrays and not ((arrays["probs"][ok] >= 0) & (arrays["probs"][ok] <= 1)).all():
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
    option per row; temperature (N,) finite > 0; expected_score, confidence (N,) float;
    action_probs (N, A) float; labels, exit_layer (N,) int; N, K >= 1. NaN or inf on a valid
    option (:func:`metrics.finite.nonfinite_rows`) only on rows the file's ``nonfinite_rows``
    (N,) bool flags, and every flagged row has one: a variant's overflow is saved and judged
    (``finite-outputs``), an unflagged NaN is a corrupt file.

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

"""Input validation shared by the metrics modules (private)."""

import numpy as np


def check_2d_pair(a, b, *, names):
    """Return ``a``, ``b`` as float64 (N, K) arrays; raise ValueError unless shapes are equal."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{names[0]} must be 2-D of shape (N, K), got shape {a.shape}.")
    if a.shape != b.shape:
        raise ValueError(f"{names[0]} {a.shape} and {names[1]} {b.shape} must have the same shape.")
    return a, b


def check_mask(mask, shape, *, name="option_mask"):
    """Return ``mask`` as a bool array of ``shape`` in which every row has a valid option."""
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise ValueError(f"{name} must be a bool array, got dtype {mask.dtype}.")
    if mask.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {mask.shape}.")
    empty = ~mask.any(axis=1)
    if empty.any():
        raise ValueError(
            f"{name} has {int(empty.sum())} row(s) with no valid option (first: row "
            f"{int(np.flatnonzero(empty)[0])}); every example needs at least one option."
        )
    return mask


def check_1d(a, *, name, dtype=None, n=None):
    """Return ``a`` as a 1-D array (optionally cast to ``dtype``) of length ``n`` if given."""
    a = np.asarray(a) if dtype is None else np.asarray(a, dtype=dtype)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D of shape (N,), got shape {a.shape}.")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} must have length {n}, got {a.shape[0]}.")
    return a


def check_labels(labels, n, *, name="labels"):
    """Return ``labels`` as int64 (N,); -1 (any negative value) means unknown."""
    labels = check_1d(labels, name=name, n=n)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{name} must be integers (-1 = unknown), got dtype {labels.dtype}.")
    return labels.astype(np.int64)


#: Longest echo of a user's value in an error message (a 50 MB string is cut, not echoed).
ECHO_LIMIT = 80


def short_repr(value, limit=ECHO_LIMIT):
    """``repr(value)`` cut to at most ``limit`` characters for error messages.

    A longer repr keeps its head and tail around ``...(N chars)...``, so a 50 MB clause string
    gives one readable line; ``repr`` of huge containers is never built in full for str/bytes.
    """
    if isinstance(value, (str, bytes)) and len(value) > 4 * limit:
        n = len(value)
        text = repr(value[: 2 * limit] + value[-2 * limit:])  # enough for head and tail, cheap
        unit = "chars" if isinstance(value, str) else "bytes"
    else:
        text = repr(value)
        n, unit = len(text), "chars"
    if len(text) <= limit:
        return text
    keep = max(limit - 24, 10)
    return f"{text[: keep - keep // 2]}...({n} {unit})...{text[len(text) - keep // 2:]}"


def printable(text):
    """``text`` (str) with each control character (newline, tab, ...) escaped (``\\n``): an
    error message naming a user's path or name stays one line. Other characters (``Δ``) stay."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def short_path(path, limit=2 * ECHO_LIMIT):
    """``str(path)`` for an error message, its middle cut when longer than ``limit`` characters
    (a path that does not exist is not bounded by the file system's limits); control characters
    escaped (``a\\nb``), so the message stays one line."""
    text = str(path)
    text = printable(text)  # a newline or control character: shown escaped, on one line
    if len(text) <= limit:
        return text
    keep = max(limit - 24, 10)
    return f"{text[: keep - keep // 2]}...({len(text)} chars)...{text[len(text) - keep // 2:]}"


def short_list(items, most=5, limit=ECHO_LIMIT // 2):
    """Comma-separated names for an error message: a plain short printable str as is, anything
    else through :func:`short_repr` (``limit``), at most ``most`` items ("and N more")."""
    items = list(items)
    shown = [k if isinstance(k, str) and len(k) <= limit and k.isprintable()
             else short_repr(k, limit) for k in items[:most]]
    return ", ".join(shown) + (f" and {len(items) - most} more" if len(items) > most else "")

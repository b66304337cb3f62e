"""Atomic file writes and content hashes: a killed sweep never leaves a half-written file."""

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np


def _current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _atomic(path, write, mode):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual file mode
        with os.fdopen(fd, mode) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text(path, text):
    """Write ``text`` (str) to ``path`` atomically (temp file + rename)."""
    return _atomic(path, lambda f: f.write(text), "w")


def write_json(path, obj):
    """Write ``obj`` as indented JSON atomically; NumPy scalars and arrays are converted."""
    return write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def write_npz(path, arrays):
    """Write a dict of NumPy arrays to ``path`` (.npz) atomically."""
    return _atomic(path, lambda f: np.savez(f, **arrays), "wb")


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def file_sha256(path, chunk_bytes=1 << 20):
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def digest(*parts):
    """Short (16 hex) SHA-256 over the JSON form of ``parts``: a cache key."""
    blob = json.dumps(parts, sort_keys=True, default=_json_default).encode()
    return hashlib.sha256(blob).hexdigest()[:16]

"""Atomic file writes and content hashes: a killed sweep never leaves a half-written file.

Every writer here goes through one temp file + rename (:func:`_atomic`); the temp file is
``.<name>.<8 random chars>.tmp`` next to the target (``tempfile.mkstemp``). A process killed
between the two leaves that temp file behind; :func:`remove_temp_files` deletes such leftovers
(the sweep calls it on resume, holding the run lock). A write that fails with an ``OSError``
(disk full, permission denied) raises :class:`WriteError` naming the target file.
"""

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np


def _current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()

#: Names of the temp files :func:`_atomic` makes (``mkstemp``: prefix ``.<name>.``, 8 characters
#: of ``[a-z0-9_]``, suffix ``.tmp``), and ``summary.csv.tmp``, which sweeps and ``variants
#: check`` once wrote by hand. Nothing else matches.
TEMP_FILE = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$|^summary\.csv\.tmp$")


class WriteError(OSError):
    """Writing an output file failed (disk full, permission denied, ...).

    An ``OSError`` whose ``errno`` and ``strerror`` are the original error's and whose
    ``filename`` is the target file (not the temp file); ``str()`` reads
    ``"cannot write <file>: <OS error>"``. The target file is left as it was before the write.
    """

    def __init__(self, path, error):
        super().__init__(error.errno, error.strerror or str(error), str(path))
        self.error = error

    def __str__(self):
        return f"cannot write {self.filename}: {self.error}"


class RunIncomplete(RuntimeError):
    """A run whose outputs could not all be made for a reason other than a failed write (e.g. a
    plotting bug): its run.json says ``"incomplete"``. ``file`` is the output missing, ``error``
    why (text); ``said``: what the files left behind say (default "run.json says incomplete")."""

    def __init__(self, file, error, said="run.json says incomplete"):
        self.file, self.error = file, error
        super().__init__(f"{file} not written ({error}); {said}. Rerun the same command to "
                         "retry, or report the error")


def _atomic(path, write, mode):
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual file mode
        with os.fdopen(fd, mode) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise WriteError(path, e) from e
        raise
    return path


def atomic_write(path, write, mode):
    """Write ``path`` through ``write(file)`` atomically: a temp file next to it, then rename.

    Parameters
    ----------
    path : path-like
        The target; its folder is created.
    write : callable(file)
        Writes the content into the open temp file.
    mode : str
        ``"w"`` (text) or ``"wb"`` (bytes).

    Returns
    -------
    Path

    Raises
    ------
    WriteError
        When the write fails with an ``OSError``; the target is left as it was, the temp file
        removed. Any other exception from ``write`` propagates the same way (temp file removed).
    """
    return _atomic(path, write, mode)  # looked up at call time: tests patch ``_atomic``


def remove_temp_files(folder):
    """Delete the temp files a killed writer left in ``folder`` and its subfolders.

    Only names matching :data:`TEMP_FILE` are removed (plain files, not symlinks); a missing
    ``folder`` is fine. Call it only while no other process may be writing there (the sweep
    holds the run lock, see :mod:`runs.lock`): a live writer's temp file matches too.

    Returns
    -------
    list of Path
        The files removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            p = Path(dirpath) / name
            if TEMP_FILE.match(name) and p.is_file() and not p.is_symlink():
                try:
                    p.unlink()
                except FileNotFoundError:
                    continue
                removed.append(p)
    return removed


def write_text(path, text):
    """Write ``text`` (str) to ``path`` atomically (temp file + rename)."""
    return _atomic(path, lambda f: f.write(text), "w")


def write_json(path, obj):
    """Write ``obj`` as indented JSON atomically; NumPy scalars and arrays are converted."""
    return write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def write_csv(path, frame):
    """Write a pandas DataFrame to ``path`` as CSV (no index column) atomically."""
    return _atomic(path, lambda f: frame.to_csv(f, index=False), "w")


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


def make_out_dir(out, flag):
    """Create the output folder ``out`` (named by ``flag`` in errors) before any work is done.

    Raises ValueError (exit 2), nothing created: ``out`` is an empty string, a file, or the
    folder cannot be made (a parent that is a file, a read-only or virtual file system such as
    /proc)."""
    from metrics._checks import short_path, short_repr
    from runs.names import control_problem

    if isinstance(out, str) and not out.strip():  # Path("") is the current folder
        raise ValueError(f"{flag} is empty; pass a folder")
    if control_problem(out):  # a newline made a folder "a\nb"
        raise ValueError(f"{flag} {short_repr(str(out))} {control_problem(out)}; pass a plain "
                         "path")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {short_path(out)} is a file; pass a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {short_path(out)}: cannot create the folder "
                         f"({e.strerror or type(e).__name__}); pass a writable folder") from None


def missing_folders(path):
    """``path`` and those of its parents that do not exist yet, deepest first: what creating it
    makes, for :func:`remove_empty_folders` to take back."""
    out = []
    for p in (Path(path).absolute(), *Path(path).absolute().parents):
        if p.exists() or p.is_symlink():
            break
        out.append(p)
    return out


def remove_empty_folders(folders, cache=None):
    """Remove each of ``folders`` (deepest first, as :func:`missing_folders` lists them) that is
    empty, so a command that stopped before writing leaves nothing behind; a folder something
    was written into stays. ``cache``: a results cache among them holding only its lock file,
    which goes too when no other process holds it (:func:`runs.lock.drop_cache_lock`)."""
    if cache is not None and Path(cache).absolute() in folders:
        from runs.lock import drop_cache_lock

        drop_cache_lock(cache)
    for p in folders:
        try:
            p.rmdir()
        except OSError:  # not empty, or gone already
            pass

"""One writer per run folder: an advisory lock held for the whole of a sweep (or a `check`/`plot`
that writes into the folder), and a shared lock on the results cache.

``<run>/.lock`` is locked with ``fcntl.flock`` (exclusive, non-blocking) and holds JSON naming
its holder: ``pid``, ``hostname``, ``started`` (local ISO time), ``command``. The operating system
releases a flock when its process dies, however it dies, so a lock file left by a killed process
is *stale*: the next taker gets the flock, logs the dead holder's pid and takes it over. A clean
release deletes the file. A second taker while the flock is held gets :class:`RunLocked` (a
``ValueError``: the CLI prints its one line and exits 2).

``results/.cache/.lock`` is shared: every sweep holds it with ``LOCK_SH`` while it runs; a sweep
that can take it exclusively at its start (no other sweep using this cache) removes the cache's
leftover temp files first (:func:`cache_lock`). That file is never deleted.

Linux/macOS only (``fcntl``); flock on network file systems is as reliable as the server's.
"""

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from metrics._checks import short_repr

LOCK_NAME = ".lock"


class RunLocked(ValueError):
    """The run folder's lock is held by another process; ``holder`` is its lock-file content
    (dict, possibly empty when the holder had not written it yet)."""

    def __init__(self, message, holder):
        super().__init__(message)
        self.holder = holder


def _read_holder(fd):
    try:
        data = os.pread(fd, 65536, 0)
        holder = json.loads(data.decode()) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def describe(holder):
    """One phrase naming a lock holder: ``pid 123 on host (since ..., `command`)``."""
    if not holder:
        return "a process that has not recorded itself yet"
    parts = [f"since {holder['started']}"] if holder.get("started") else []
    if holder.get("command"):
        parts.append(f"command {short_repr(str(holder['command']), 160)}")
    return (f"pid {holder.get('pid', '?')} on {holder.get('hostname', '?')}"
            + (f" ({', '.join(parts)})" if parts else ""))


def _pid_running(pid):
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # exists but not ours, or not a pid we can judge
    return True


@contextmanager
def hold(folder, *, log=print, command=None,
         fix="wait for it to finish, or choose another --run name"):
    """Hold ``folder/.lock`` exclusively for the ``with`` block.

    Parameters
    ----------
    folder : path-like
        An existing folder (a run folder ``results/<run>``).
    log : callable(str)
        Receives one line when a stale lock (holder no longer running) is taken over.
    command : str, optional
        Recorded as the holder's command (default: ``sys.argv`` joined by spaces).
    fix : str
        What the message of :class:`RunLocked` tells the second taker to do.

    Yields
    ------
    dict
        This holder's record (pid, hostname, started, command).

    Raises
    ------
    RunLocked
        If another process (or another open of the file in this process) holds the lock.
    OSError
        If the lock file cannot be created (e.g. a read-only folder).
    """
    path = Path(folder) / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            if not holder:  # the holder may be between its flock and its write
                time.sleep(0.05)
                holder = _read_holder(fd)
            os.close(fd)
            raise RunLocked(f"{folder} is in use by {describe(holder)}; {fix}",
                            holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the file we locked must still be the one at ``path`` (a releaser unlinks it)
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        old = _read_holder(fd)
        if old:
            pid = old.get("pid")
            state = ("no longer running" if not _pid_running(pid)
                     else "running but no longer holding it")
            log(f"{folder}: taking over the stale lock of {describe(old)}: that process is "
                f"{state}")
        me = {"pid": os.getpid(), "hostname": socket.gethostname(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
              "command": command if command is not None else " ".join(sys.argv)}
        data = (json.dumps(me) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        yield me
    finally:
        try:
            os.unlink(path)  # while still holding the flock: no one else has this file
        except FileNotFoundError:
            pass
        os.close(fd)


@contextmanager
def cache_lock(cache_dir, when_alone=None):
    """Hold ``cache_dir/.lock`` shared for the ``with`` block (``cache_dir`` is created).

    Parameters
    ----------
    cache_dir : path-like
        The results cache (``results/.cache``).
    when_alone : callable(), optional
        Called while the lock is held exclusively, i.e. when no other process held it at the
        start (nobody else is writing into the cache): the place to remove leftover temp files.
        The lock is then downgraded to shared.

    Yields
    ------
    bool
        Whether the lock could be taken exclusively (``when_alone`` ran).
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        if alone and when_alone is not None:
            when_alone()
        fcntl.flock(fd, fcntl.LOCK_SH)  # others hold it exclusively only for a moment
        yield alone
    finally:
        os.close(fd)


def drop_cache_lock(cache_dir):
    """Remove ``cache_dir/.lock`` when it is all the folder holds and no process holds it
    (taken exclusively first, unlinked while held); returns whether it was removed."""
    path = Path(cache_dir) / LOCK_NAME
    try:
        if [p.name for p in Path(cache_dir).iterdir()] != [LOCK_NAME]:
            return False
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(path)
        return True
    except OSError:  # held by another sweep (BlockingIOError), or gone
        return False
    finally:
        os.close(fd)

"""Moved to :mod:`runs.lock` (issue 15); this shim keeps the old import path working."""

from runs.lock import LOCK_NAME, RunLocked, cache_lock, describe, hold  # noqa: F401

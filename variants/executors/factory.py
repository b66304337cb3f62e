"""The executor of ``--executor`` / ``--workers`` / ``--ray-address``: local and process
(:mod:`variants.executors.local`) or Ray (:mod:`variants.executors.ray`), checked before any unit runs.
"""

from metrics._checks import short_repr
from variants.executors import local as ex
from variants.executors.ray import RayExecutor


def make_executor(kind, *, workers=1, ray_address=None, log=ex._stderr):
    """An executor for ``variants search --executor KIND --workers N [--ray-address A]``.

    Parameters
    ----------
    kind : {"local", "process", "ray"}
    workers : int, default=1
        Workers (processes or Ray actors), 1..``MAX_WORKERS``; ``local`` accepts only 1.
    ray_address : str, optional
        A running Ray cluster (``host:port`` of its head, ``ray://host:10001`` or ``auto``); else
        ``RAY_ADDRESS``; else a local Ray with ``workers`` CPUs. Only for ``kind="ray"``.
    log : callable(str), default: a line on stderr
        Where lost-worker lines go.

    Returns
    -------
    LocalExecutor, ProcessExecutor or variants.executors.ray.RayExecutor

    Raises
    ------
    ValueError
        Unknown ``kind`` (names --executor and the choices), ``workers`` out of range (names
        --workers), or ``ray_address`` with another kind (names --ray-address).
    ExecutorError
        ``kind="ray"`` and Ray is not installed (names the install command). An unreachable
        address is reported by ``run``, before any unit runs.
    """
    if kind not in ex.KINDS:
        raise ValueError(f"--executor must be one of {', '.join(ex.KINDS)}, got "
                         f"{short_repr(kind)}")
    if (isinstance(workers, bool) or not isinstance(workers, int)
            or not 1 <= workers <= ex.MAX_WORKERS):
        raise ValueError(f"--workers must be a whole number from 1 to {ex.MAX_WORKERS}, got "
                         f"{short_repr(workers)}")
    if kind == "local" and workers != 1:
        raise ValueError(f"--workers {workers} needs --executor process or ray (local runs one "
                         "unit at a time); choose one of those or drop --workers")
    if ray_address is not None and kind != "ray":
        raise ValueError(f"--ray-address needs --executor ray (got --executor {kind}); add "
                         "--executor ray or drop --ray-address")
    if kind == "local":
        return ex.LocalExecutor(workers, log)
    if kind == "process":
        return ex.ProcessExecutor(workers, log)
    return RayExecutor(workers, ray_address=ray_address, log=log)

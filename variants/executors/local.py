"""Run independent units (search candidates) in-process, in worker processes, or on Ray.

:func:`variants.executors.factory.make_executor` (kind, workers=..., ray_address=...) gives an
object with
``run(init, init_args, fn, specs, on_result)``:

- ``init(*init_args) -> state`` runs once per worker, in the worker (in ``variants search``: load
  the checkpoint and the cached reference outputs from paths). ``init_args`` are picklable plain
  data; ``init`` and ``fn`` are module-level importable functions.
- ``fn(state, spec) -> result`` evaluates one unit (``spec``: a plain dict; ``result``: a dict,
  possibly holding numpy arrays). The executor never changes what a unit computes, so results
  are the same whichever executor and however many workers run them.
- ``on_result(index, spec, result)`` is called on the driver, in the driver's thread, as each
  unit completes (completion order, not spec order); ``run`` returns when all are done.
- ``with executor:`` (``open()`` / ``close()``) keeps the workers across ``run`` calls, so a
  caller with many small batches (``variants search``: one per strategy step) runs each
  worker's ``init`` once; ``open`` also connects to Ray at once (an address that does not
  answer raises :class:`ExecutorError` there). Without it each ``run`` starts and stops its
  own workers.

Kinds:

- ``local``: a loop in this process (``init`` once);
- ``process``: ``workers`` spawned processes, each a one-process
  :class:`concurrent.futures.ProcessPoolExecutor` whose initializer holds the state in a module
  global. One pool per worker (not one pool of ``workers``) because a dead process breaks its
  whole pool: with one process per pool the broken pool names exactly the unit that was lost;
- ``ray``: one Ray actor per worker holding the state (:mod:`variants.executors.ray`).

Failures (process and ray): a worker that dies mid-unit (killed, out of memory, ``os._exit``)
gives one line through ``log``; the lost unit is retried once on a fresh worker and the run goes
on. A unit lost twice gets the result ``{"error": "<one line>"}`` (the caller counts it as
failed). A unit that raises an ordinary exception is a bug: :class:`UnitError` is raised on the
driver naming the unit and its spec, with the worker's exception as ``__cause__``. On Ray a lost
node takes its actors and their units with it; the fresh actor gets units only once it is up,
so where the surviving nodes have no free CPU for it the surviving actors run the retry and the
rest (fewer workers, same results); only when no worker at all is left and none comes up within
``start_timeout_s`` does ``run`` raise :class:`ExecutorError`.

Results come back as return values (pickled by the process pool; through Ray's object store),
never through files: the driver alone writes what a unit computed.

Threads: each worker uses as many MLX CPU streams as the driver (:func:`match_streams`), so
every executor computes bit-identical results; with two streams OpenBLAS runs one thread per
call, so two workers on two cores run four compute threads (not eight). One stream per worker
would fit two cores exactly but changes results in the last bits (the batch is cut differently).
Measured in bench/executors.py.
"""

import concurrent.futures as cf
import multiprocessing
import os
import sys
from collections import deque

from metrics._checks import short_repr

KINDS = ("local", "process", "ray")
MAX_WORKERS = 256
RAY_INSTALL = 'pip install -e ".[ray]"'


class ExecutorError(RuntimeError):
    """The executor cannot start (Ray missing, a Ray address that does not answer, too few CPUs
    in the cluster). One line naming the problem and the fix; raised before any unit runs."""


class UnitError(RuntimeError):
    """A unit's ``init`` or ``fn`` raised an ordinary exception (a bug, not a lost worker): the
    message names the unit's index and spec; ``__cause__`` is the worker's exception."""


class WorkerLost(Exception):
    """Internal: the worker running a unit died (the unit may be retried)."""


def _stderr(msg):
    print(msg, file=sys.stderr, flush=True)


def driver_streams():
    """MLX CPU streams this process's encoder splits over (:mod:`variants.runtime.parallel`, read
    without creating them). Workers are given the same count: the stream split decides how a
    batch is cut and packed, so a different count changes results in the last float bits."""
    from variants.runtime import parallel

    return parallel._requested()


def match_streams(n):
    """Worker set-up: use ``n`` MLX CPU streams, as the driver does (``VARIANTS_STREAMS``).

    With ``n >= 2`` :mod:`variants.runtime.parallel` also sets OpenBLAS to one thread per GEMM call, so
    ``w`` workers on a machine run ``w * n`` compute threads, never ``w * n * cores``.
    """
    os.environ["VARIANTS_STREAMS"] = str(int(n))


# ---- worker side (process pools; Ray actors reuse these) -----------------------------------
_WORKER = {"state": None, "init_error": None}


def worker_init(init, init_args, streams):
    """Pool initializer: match the driver's streams, run ``init`` once, keep the state in a
    module global.

    An exception from ``init`` is kept and re-raised by the first :func:`worker_call` (a pool
    initializer that raises would only break the pool, hiding the error behind a lost worker).
    """
    match_streams(streams)
    try:
        _WORKER["state"] = init(*init_args)
    except BaseException as e:  # noqa: BLE001 - re-raised by worker_call, with its traceback
        _WORKER["init_error"] = e


def worker_call(fn, spec):
    """Run ``fn(state, spec)`` in a worker set up by :func:`worker_init`."""
    if _WORKER["init_error"] is not None:
        raise _WORKER["init_error"]
    return fn(_WORKER["state"], spec)


# ---- driver side --------------------------------------------------------------------------
def one_line(text, limit=200):
    """The first line of ``text``, cut to ``limit`` characters."""
    text = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return text if len(text) <= limit else text[:limit] + "..."


def _unit_error(index, spec, exc):
    return UnitError(f"unit {index} (spec {short_repr(spec)}) raised "
                     f"{type(exc).__name__}: {one_line(exc)}")


class LocalExecutor:
    """Units one after another in this process (``init`` once)."""

    kind = "local"

    def __init__(self, workers=1, log=_stderr):
        self.workers = 1
        self.log = log

    def check(self):
        """Nothing to reach (the Ray executor's :meth:`~variants.executors.ray.RayExecutor.check`)."""

    def open(self):
        """Nothing to start (the process executors' :meth:`SlotExecutor.open`)."""
        return self

    def close(self):
        pass

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    def run(self, init, init_args, fn, specs, on_result):
        """See the module docstring. Raises :class:`UnitError` when ``init`` or ``fn`` raises."""
        specs = list(specs)
        if not specs:
            return
        try:
            state = init(*init_args)
        except Exception as e:
            raise _unit_error(0, specs[0], e) from e
        for i, spec in enumerate(specs):
            try:
                result = fn(state, spec)
            except Exception as e:
                raise _unit_error(i, spec, e) from e
            on_result(i, spec, result)


class SlotExecutor:
    """The driver loop shared by the process and Ray executors: ``workers`` slots, each running
    one unit at a time; a lost unit goes back to the head of the queue once, and its slot is
    replaced by a fresh worker. A replacement Ray worker gets units only once it is up (``_probe``):
    where the cluster has no room for it (its node was lost) the surviving workers take the
    retry and the rest, and the run ends without it. Subclasses provide ``_open``,
    ``_new_slot``, ``_probe``, ``_submit``, ``_wait``, ``_result``, ``_drop_slot``, ``_close``
    and ``_describe``."""

    kind = None
    #: seconds to wait for a worker to come up when no unit is running anywhere (every worker
    #: was lost): then :class:`ExecutorError`
    start_timeout_s = 600.0

    def __init__(self, workers=1, log=_stderr):
        self.workers = workers
        self.log = log
        self._kept = None  # open(): the slots kept across run() calls, and their init

    def check(self):
        """Nothing to reach for spawned processes (Ray: its address answers)."""

    def open(self):
        """Connect now (Ray: ``ray.init`` and the CPU check; raises :class:`ExecutorError`) and
        keep the workers across :meth:`run` calls until :meth:`close`: a caller running many
        small batches (a search runs one per strategy step) pays each worker's ``init`` once,
        not once per batch. The workers start at the first ``run``, ``workers`` of them;
        another ``init`` or ``init_args`` there replaces them. Returns ``self``."""
        if self._kept is None:
            self._open(self.workers)
            self._kept = {"slots": [], "init": None, "starting": {}}
        return self

    def close(self):
        """Stop the kept workers and what :meth:`open` started (no-op when not open)."""
        if self._kept is not None:
            for slot in self._kept["slots"]:
                self._drop_slot(slot)
            self._kept = None
            self._close()

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    def run(self, init, init_args, fn, specs, on_result):
        """See the module docstring. Raises :class:`UnitError` (a unit's exception) or
        :class:`ExecutorError` (the executor cannot start, or every worker was lost and none
        came up again within ``start_timeout_s``)."""
        specs = list(specs)
        if not specs:
            return
        kept = self._kept
        if kept is not None:
            n = self.workers
            if kept["init"] != (init, init_args):
                for slot in kept["slots"]:
                    self._drop_slot(slot)
                kept["slots"].clear()
                kept["starting"] = {}
                kept["init"] = (init, init_args)
            slots = kept["slots"]
        else:
            n = min(self.workers, len(specs))
            self._open(n)
            slots = []
        # handle -> (slot, index); index None: the slot's start-up (_probe), not a unit
        inflight = {h: (s, None) for h, s in (kept or {}).get("starting", {}).items()}
        starting = {s for s, _ in inflight.values()}
        free = [s for s in slots if s not in starting]

        def add(slot, first=False, replacing=True):
            slots.append(slot)
            probe = self._probe(slot) if replacing else None
            if probe is not None:  # units go to it once it is up
                inflight[probe] = (slot, None)
            elif first:
                free.insert(0, slot)
            else:
                free.append(slot)

        def units_inflight():
            return any(i is not None for _, i in inflight.values())

        try:
            # the first workers get units at once (open() checked the cluster has room for
            # them); a worker replacing a lost one, in this run or a later one, once it is up
            replacing = bool(slots)
            while len(slots) < n:
                add(self._new_slot(init, init_args, n), replacing=replacing)
            pending = deque(range(len(specs)))
            losses = [0] * len(specs)
            while pending or units_inflight():
                while pending and free:
                    slot = free.pop(0)
                    i = pending.popleft()
                    inflight[self._submit(slot, fn, specs[i])] = (slot, i)
                if not inflight:
                    raise ExecutorError(f"every {self.kind} worker was lost and none is left to "
                                        f"run the {len(pending)} unit(s) still waiting")
                idle = not units_inflight()  # only start-ups: wait for one, not forever
                done = self._wait(list(inflight), self.start_timeout_s if idle else None)
                if not done:
                    raise ExecutorError(
                        f"no {self.kind} worker came up within {self.start_timeout_s:.0f} s to "
                        f"run the {len(pending)} unit(s) still waiting (every worker was lost "
                        "and the cluster has no room for a new one); add nodes and rerun")
                for handle in done:
                    slot, i = inflight.pop(handle)
                    if i is None:  # a slot's start-up
                        try:
                            self._result(handle)
                        except Exception as e:  # noqa: BLE001 - it never came up
                            self.log(f"{self._describe(slot)} was lost while starting "
                                     f"({one_line(e)}); going on without it")
                            self._drop_slot(slot)
                            slots.remove(slot)
                        else:
                            free.append(slot)
                        continue
                    try:
                        result = self._result(handle)
                    except WorkerLost as e:
                        losses[i] += 1
                        what = self._describe(slot)
                        self._drop_slot(slot)
                        slots.remove(slot)
                        if losses[i] == 1:
                            self.log(f"{what} died running unit {i} (spec "
                                     f"{short_repr(specs[i])}): {e}; retrying it once on a "
                                     "fresh worker")
                            pending.appendleft(i)
                        else:
                            self.log(f"{what} died running unit {i} again: giving up on it "
                                     "(counted as failed)")
                            on_result(i, specs[i], {"error": (
                                f"the worker died twice running this unit ({self.kind} "
                                f"executor; last: {e}); it is counted as failed")})
                        if pending:  # a fresh worker, first in line: the retry runs there
                            add(self._new_slot(init, init_args, n), first=True)
                        continue
                    except Exception as e:
                        raise _unit_error(i, specs[i], e) from e
                    free.append(slot)
                    on_result(i, specs[i], result)
        finally:
            busy = units_inflight()
            if kept is not None and not busy:  # slots still starting stay so for the next run
                kept["starting"] = {h: s for h, (s, _) in inflight.items()}
            else:  # not kept, or aborting mid-unit: stop them all
                for slot in slots:
                    self._drop_slot(slot, wait=not busy)
                slots.clear()
                if kept is not None:
                    kept["starting"] = {}
            if kept is None:
                self._close()


class ProcessExecutor(SlotExecutor):
    """``workers`` spawned processes, one :class:`~concurrent.futures.ProcessPoolExecutor`
    (``max_workers=1``, spawn context, initializer :func:`worker_init`) each."""

    kind = "process"

    def _open(self, n):
        self._ctx = multiprocessing.get_context("spawn")
        self._count = 0

    def _new_slot(self, init, init_args, n):
        self._count += 1
        pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=self._ctx,
                                      initializer=worker_init,
                                      initargs=(init, init_args, driver_streams()))
        pool._variants_name = f"process worker {self._count}"
        return pool

    def _submit(self, pool, fn, spec):
        return pool.submit(worker_call, fn, spec)

    def _probe(self, pool):
        return None  # the process starts at the first unit; a unit may be sent at once

    def _wait(self, handles, timeout=None):
        done, _ = cf.wait(handles, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return done

    def _result(self, future):
        try:
            return future.result()
        except cf.process.BrokenProcessPool as e:
            raise WorkerLost(f"BrokenProcessPool: {one_line(e)}") from e

    def _describe(self, pool):
        return pool._variants_name

    def _drop_slot(self, pool, wait=True):
        if not wait:  # aborting (a unit raised, Ctrl-C): stop the processes still running
            for p in list((getattr(pool, "_processes", None) or {}).values()):
                p.terminate()
        pool.shutdown(wait=wait, cancel_futures=True)

    def _close(self):
        pass

"""The Ray executor: one Ray actor per worker holds the state; units go to free actors.

``ray.init(address=...)`` from ``ray_address`` or ``RAY_ADDRESS``; without either, a local Ray
with ``workers`` CPUs (started for the run and shut down after it). A Ray already initialised in
this process (``ray.is_initialized()``) is used as it is and left running. Each actor asks for
one CPU and actors are spread over the nodes (``scheduling_strategy="SPREAD"``); the state is
built once per actor by :func:`variants.executors.local.worker_init`. A unit's result (a dict of
numpy arrays, or a :class:`~runs.outputs.DecisionOutputs`) comes back to the driver through
Ray's object store, never through a file. An actor gets units once it is up (its ``ready``
method answered), so a replacement actor that no node has room for (its node was lost, the
survivors' CPUs are taken) never holds a unit: the survivors run them
(:class:`~variants.executors.local.SlotExecutor`).

Before ``ray.init`` touches a ``host:port`` address, a TCP connection to it is tried for
``PROBE_TIMEOUT_S``: Ray itself retries an unreachable GCS for a minute or more, printing
warnings, before it gives up. Ray is an optional extra: ``pip install -e ".[ray]"``.
"""

import contextlib
import os
import socket
import sys

from metrics._checks import short_repr
from variants.executors import local as ex

PROBE_TIMEOUT_S = 3.0


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ex.ExecutorError("--executor ray needs Ray, which is not installed; install it "
                               f"with: {ex.RAY_INSTALL}") from None
    return ray


def _host_port(address):
    """(host, port) of a ``host:port`` or ``ray://host:port`` address, else None (``auto``,
    ``local``)."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def probe(address, timeout=PROBE_TIMEOUT_S):
    """Raise :class:`~variants.executors.local.ExecutorError` when nothing accepts a TCP connection
    at ``address`` (``host:port``) within ``timeout`` seconds."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout):
            pass
    except OSError as e:
        raise ex.ExecutorError(
            f"Ray address {short_repr(address)} does not answer ({e.strerror or e}); start a "
            "cluster there with `ray start --head`, or drop --ray-address (and unset "
            "RAY_ADDRESS) to run a local Ray") from None


@contextlib.contextmanager
def driver_path_env():
    """``PYTHONPATH`` = this driver's ``sys.path`` while a local Ray starts: its raylet and
    workers inherit the environment, so actors import what the driver imports (as spawned
    processes do). Cheaper than a ``runtime_env`` (no runtime-env agent round trip per actor)."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


class RayExecutor(ex.SlotExecutor):
    """``workers`` Ray actors (see the module docstring)."""

    kind = "ray"

    def __init__(self, workers=1, *, ray_address=None, log=ex._stderr):
        super().__init__(workers, log)
        self.ray = _import_ray()
        self.address = ray_address or os.environ.get("RAY_ADDRESS") or None
        self._started = False
        self._count = 0

    def check(self):
        """Raise :class:`~variants.executors.local.ExecutorError` now when the Ray address (from
        ``--ray-address`` or ``RAY_ADDRESS``) does not answer (:func:`probe`), so that a command
        refuses before it loads or writes anything; a Ray already initialised here is not
        probed."""
        if self.address and not self.ray.is_initialized():
            probe(self.address)

    def _open(self, n):
        ray = self.ray
        if not ray.is_initialized():
            if self.address:
                probe(self.address)
                try:
                    ray.init(address=self.address, include_dashboard=False,
                             log_to_driver=False)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    raise ex.ExecutorError(
                        f"cannot connect to Ray at {short_repr(self.address)}: "
                        f"{ex.one_line(e)}; start it with "
                        "`ray start --head` or drop --ray-address") from None
            else:
                with driver_path_env():  # "local": a new Ray, never one another process
                    # left in /tmp/ray/ray_current_cluster (ray.init() would join that one)
                    ray.init(address="local", num_cpus=n, include_dashboard=False,
                             log_to_driver=False)
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus < n:
            self._close()
            raise ex.ExecutorError(f"--workers {n} needs {n} CPUs but the Ray cluster has "
                                   f"{cpus}; lower --workers or add nodes")
        self._streams = ex.driver_streams()
        self._actor_cls = ray.remote(num_cpus=1, max_restarts=0,
                                     scheduling_strategy="SPREAD")(_Worker)

    def _new_slot(self, init, init_args, n):
        self._count += 1
        actor = self._actor_cls.remote(init, init_args, self._streams)
        actor._variants_name = f"Ray worker {self._count}"
        return actor

    def _submit(self, actor, fn, spec):
        return actor.call.remote(fn, spec)

    def _probe(self, actor):
        return actor.ready.remote()  # done once the actor is placed and its init has run

    def _wait(self, handles, timeout=None):
        done, _ = self.ray.wait(handles, num_returns=1, timeout=timeout)
        return done

    def _result(self, ref):
        exc = self.ray.exceptions
        try:
            return self.ray.get(ref)
        except (exc.RayActorError, exc.WorkerCrashedError, exc.NodeDiedError,
                exc.OutOfMemoryError, exc.LocalRayletDiedError, exc.ObjectLostError) as e:
            # ObjectLostError: the unit finished but its result (in the lost node's object
            # store) went with the node
            raise ex.WorkerLost(f"{type(e).__name__}: {ex.one_line(e)}") from e
        except exc.RayTaskError as e:
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, Exception) else e) from e

    def _describe(self, actor):
        return getattr(actor, "_variants_name", "Ray worker")

    def _drop_slot(self, actor, wait=True):
        try:
            self.ray.kill(actor)
        except Exception:  # noqa: BLE001 - already dead or the cluster went away
            pass

    def _close(self):
        if self._started and self.ray.is_initialized():
            self.ray.shutdown()
        self._started = False


class _Worker:
    """The Ray actor: :func:`variants.executors.local.worker_init` once, then
    :func:`variants.executors.local.worker_call` per unit."""

    def __init__(self, init, init_args, streams):
        ex.worker_init(init, init_args, streams)

    def ready(self):
        """True once the actor is up (its ``init`` has run, or failed: the first unit says)."""
        return True

    def call(self, fn, spec):
        return ex.worker_call(fn, spec)

"""variants.executors.local: local, process and Ray executors give the same results; init once per
worker; a worker killed mid-unit is retried once; errors are one line."""

import os
import socket
import sys
import threading
import time

import numpy as np
import pytest

import executor_toys as toys
from variants.executors import factory as executor_factory
from variants.executors import local as ex

HAVE_RAY = True
try:
    import ray
except ImportError:
    HAVE_RAY = False

#: process and Ray workers (~1 min in all): .ci/run runs them (pytest -m executors)
pytestmark = pytest.mark.executors

needs_ray = pytest.mark.skipif(not HAVE_RAY, reason='ray not installed (pip install -e ".[ray]")')


@pytest.fixture(scope="module")
def ray_local():
    """One local two-CPU Ray for the module (start-up takes seconds)."""
    if not HAVE_RAY:
        pytest.skip('ray not installed (pip install -e ".[ray]")')
    from variants.executors.ray import driver_path_env

    with driver_path_env():  # the actors import tests/executors/executor_toys.py
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _kinds():
    return ["local", "process", pytest.param("ray", marks=needs_ray)]


def _run(kind, specs, tmp_path, workers, init=toys.init, scale=2.0):
    logs, got, threads = [], {}, set()

    def on_result(i, spec, result):
        threads.add(threading.get_ident())
        assert i not in got and spec is specs[i]
        got[i] = result

    exe = executor_factory.make_executor(kind, workers=workers, log=logs.append)
    exe.run(init, (str(tmp_path), scale), toys.fn, specs, on_result)
    assert threads <= {threading.get_ident()}  # on_result runs in the driver's thread
    return got, logs


def _specs(n, tmp_path, extra=None):
    return [dict(id=i, seed=100 + i, marker_dir=str(tmp_path), **(extra or {}).get(i, {}))
            for i in range(n)]


def _inits(tmp_path):
    return sorted(f.split("-")[1] for f in os.listdir(tmp_path) if f.startswith("init-"))


@pytest.mark.parametrize("kind", _kinds())
def test_same_results_and_one_init_per_worker(kind, tmp_path, request):
    if kind == "ray":
        request.getfixturevalue("ray_local")
    workers = 1 if kind == "local" else 2
    specs = _specs(6, tmp_path)
    got, logs = _run(kind, specs, tmp_path, workers)
    assert sorted(got) == list(range(6)) and logs == []
    for i, spec in enumerate(specs):  # the numbers fn computes, independently of the executor
        want = np.random.default_rng(100 + i).normal(size=5) * 2.0
        np.testing.assert_array_equal(got[i]["x"], want)
        assert got[i]["id"] == i
    want_streams = None if kind == "local" else str(ex.driver_streams())
    env = os.environ.get("VARIANTS_STREAMS", want_streams)
    assert {r["streams"] for r in got.values()} == {env}
    pids = _inits(tmp_path)
    assert len(pids) == workers  # init ran once per worker, in the worker
    assert {str(r["pid"]) for r in got.values()} == set(pids)
    if kind == "local":
        assert pids == [str(os.getpid())]
    else:
        assert str(os.getpid()) not in pids


@pytest.mark.parametrize("kind", ["process", pytest.param("ray", marks=needs_ray)])
def test_mlx_results_bit_identical_to_local(kind, request):
    """A real MLX forward in the workers gives the driver's bits (same stream split)."""
    if kind == "ray":
        request.getfixturevalue("ray_local")
    specs = [{"seed": s} for s in range(4)]
    runs = {}
    for k, w in (("local", 1), (kind, 2)):
        got = {}
        executor_factory.make_executor(k, workers=w).run(toys.mlx_init, (3,), toys.mlx_fn, specs,
                                          lambda i, spec, r: got.__setitem__(i, r["hidden"]))
        runs[k] = got
    for i in range(4):
        assert np.abs(runs["local"][i]).sum() > 0
        np.testing.assert_array_equal(runs[kind][i], runs["local"][i])


@pytest.mark.parametrize("kind", ["process", pytest.param("ray", marks=needs_ray)])
def test_killed_worker_retried_once_then_error(kind, tmp_path, request):
    if kind == "ray":
        request.getfixturevalue("ray_local")
    specs = _specs(5, tmp_path, {1: {"die": "once"}, 3: {"die": "always"}})
    got, logs = _run(kind, specs, tmp_path, 2)
    assert sorted(got) == list(range(5))
    for i in (0, 1, 2, 4):  # unit 1 died once and was recomputed in full on a fresh worker
        np.testing.assert_array_equal(
            got[i]["x"], np.random.default_rng(100 + i).normal(size=5) * 2.0)
    assert set(got[3]) == {"error"} and "died twice" in got[3]["error"]
    assert "\n" not in got[3]["error"]
    retried = [m for m in logs if "retrying it once" in m]
    assert sorted(m.split("running unit ")[1].split()[0] for m in retried) == ["1", "3"]
    assert sum("giving up" in m and "unit 3" in m for m in logs) == 1
    assert all("\n" not in m for m in logs) and len(logs) == 3
    # 2 workers + a fresh one after each of the first two losses (each takes the retry at once);
    # after the third, one more only if units were still waiting.
    assert len(_inits(tmp_path)) in (4, 5)


@pytest.mark.parametrize("kind", _kinds())
def test_unit_exception_reraised_with_spec(kind, tmp_path, request):
    if kind == "ray":
        request.getfixturevalue("ray_local")
    specs = _specs(3, tmp_path, {2: {"raise": True}})
    with pytest.raises(ex.UnitError, match=r"unit 2 \(spec .*'id': 2.*ValueError: unit 2 is "
                                           r"broken") as info:
        _run(kind, specs, tmp_path, 1 if kind == "local" else 2)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", _kinds())
def test_init_exception_reraised(kind, tmp_path, request):
    if kind == "ray":
        request.getfixturevalue("ray_local")
    with pytest.raises(ex.UnitError, match="RuntimeError: cannot load the checkpoint"):
        _run(kind, _specs(2, tmp_path), tmp_path, 1, init=toys.broken_init)


@needs_ray
def test_bad_ray_address_fails_fast(monkeypatch):
    with socket.socket() as s:  # a local port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # even with the module's Ray up
    exe = executor_factory.make_executor("ray", workers=2, ray_address=f"127.0.0.1:{port}")
    t = time.monotonic()
    with pytest.raises(ex.ExecutorError, match=rf"Ray address '127.0.0.1:{port}' does not "
                                               r"answer.*ray start --head.*--ray-address"):
        exe.run(toys.init, (".", 1.0), toys.fn, [{"id": 0, "seed": 0}], lambda *a: None)
    assert time.monotonic() - t < 10  # bounded by the TCP probe, not Ray's minute of retries


@needs_ray
def test_ray_address_from_env(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert executor_factory.make_executor("ray").address == "10.0.0.1:6379"
    assert executor_factory.make_executor("ray", ray_address="h:1").address == "h:1"


def test_ray_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ex.ExecutorError, match=r'not installed; install it with: pip install '
                                               r'-e "\.\[ray\]"'):
        executor_factory.make_executor("ray", workers=2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="threads"), r"--executor must be one of local, process, ray, got 'threads'"),
    (dict(kind="process", workers=0), r"--workers must be a whole number from 1 to 256, got 0"),
    (dict(kind="process", workers=1000), r"--workers .* got 1000"),
    (dict(kind="process", workers=2.0), r"--workers .* got 2\.0"),
    (dict(kind="process", workers=True), r"--workers .* got True"),
    (dict(kind="local", workers=2), r"--workers 2 needs --executor process or ray"),
    (dict(kind="process", ray_address="h:1"), r"--ray-address needs --executor ray"),
])
def test_bad_arguments(kwargs, match):
    kind = kwargs.pop("kind")
    with pytest.raises(ValueError, match=match):
        executor_factory.make_executor(kind, **kwargs)


def test_probe_address_parsing():
    from variants.executors import ray as er

    assert er._host_port("ray://head:10001") == ("head", 10001)
    assert er._host_port("[::1]:6379") == ("::1", 6379)
    assert er._host_port("auto") is None


def test_empty_specs_start_nothing(tmp_path):
    exe = executor_factory.make_executor("process", workers=2)
    exe.run(toys.init, (str(tmp_path), 1.0), toys.fn, [], lambda *a: pytest.fail("called"))
    assert _inits(tmp_path) == []


@pytest.mark.parametrize("kind", ["process", pytest.param("ray", marks=needs_ray)])
def test_open_keeps_workers_across_runs(kind, tmp_path, request):
    """open(): three run() calls (a search's strategy steps) start the workers once; a lost
    worker is replaced for the run after; close() stops them; without open() each run starts
    its own."""
    if kind == "ray":
        request.getfixturevalue("ray_local")
    logs, got = [], {}
    exe = executor_factory.make_executor(kind, workers=2, log=logs.append)
    specs = _specs(7, tmp_path, {4: {"die": "once"}})
    with exe:
        for batch in (specs[:1], specs[1:4], specs[4:]):  # 1 unit, then 3, then 3
            exe.run(toys.init, (str(tmp_path), 2.0), toys.fn, batch,
                    lambda i, spec, r: got.setdefault(spec["id"], r))
    assert sorted(got) == list(range(7)) and len(logs) == 1 and "unit 0" in logs[0]
    for i in range(7):
        np.testing.assert_array_equal(got[i]["x"],
                                      np.random.default_rng(100 + i).normal(size=5) * 2.0)
    # 2 workers at the first run (not 1 per unit, not 2 per run) + the fresh one after the loss;
    # a fresh Ray actor gets units only once it is up, so where the survivor has run the last
    # (instant) units first, close() stops it before its init has run
    assert len(_inits(tmp_path)) in ((3,) if kind == "process" else (2, 3))
    assert len({got[i]["pid"] for i in range(4)}) <= 2
    before = len(_inits(tmp_path))
    exe.run(toys.init, (str(tmp_path), 2.0), toys.fn, specs[:1], lambda *a: None)
    assert len(_inits(tmp_path)) == before + 1  # closed: a plain run starts (and stops) its own

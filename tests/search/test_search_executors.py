"""variants search on the executors (variants.executors.local): local, process and Ray give the same
search.json verdicts and costs; workers get only paths and settings and read the driver's
caches; a candidate lost twice is a failed candidate and the search goes on; bad executor
flags and a dead Ray address exit 2 with nothing written; the executor is no part of the
resume identity."""

import json

import pytest

HAVE_RAY = True
try:
    import ray  # noqa: F401
except ImportError:
    HAVE_RAY = False

#: process and Ray workers (~1 min in all): .ci/run runs them (pytest -m executors)
pytestmark = pytest.mark.executors

# --select value: on 20 search-eval rows no rate clause's bound can pass (agreement needs 122)
TINY = ["--n-fit", "100", "--n-calibration", "40", "--n-eval", "40", "--n-search", "40",
        "--chunk-size", "10", "--bits", "4", "8", "--no-finalize", "--no-progress",
        "--max-candidates", "4", "--batch", "2", "--strategy", "greedy", "--select", "value",
        # the widths alone, fp32 scales (the synthetic sensitivity has no modes)
        "--scale-dtype", "float32", "--modes", "none", "--no-unseen-rows"]
# what may differ between executors: times, and whether a record was reused
VOLATILE = ("wall_s", "saved_s", "reused", "schema_version")


def _fake_sensitivity(self):
    self.sens_path = "synthetic"
    return {(p, b): (1.0 / (i + 1)) / b for i, p in enumerate(self.layers)
            for b in self.opts.bits}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One results dir (reference caches) for the module, and the local executor's search."""
    from variants.cli import main
    from variants.search import driver

    root = tmp_path_factory.mktemp("search_exec")
    mp = pytest.MonkeyPatch()
    mp.setattr(driver.Search, "sensitivity", _fake_sensitivity)  # driver-side only
    try:
        assert main(["search", *TINY, "--results-dir", str(root / "r"), "--out",
                     str(root / "local")]) == 0
    finally:
        mp.undo()
    return root, json.loads((root / "local" / "search.json").read_text())


def _stable(res):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in res["candidates"]]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["process", pytest.param("ray", marks=pytest.mark.skipif(
    not HAVE_RAY, reason='ray not installed (pip install -e ".[ray]")'))])
def test_two_workers_give_the_local_search(kind, shared, monkeypatch):
    """Two candidates per step on two workers: the same candidates, in the same order, with
    the same costs, verdicts, failing clauses, clause values and examples used as local."""
    from variants.cli import main
    from variants.search import driver

    root, local = shared
    monkeypatch.setattr(driver.Search, "sensitivity", _fake_sensitivity)
    out = root / kind
    assert main(["search", *TINY, "--results-dir", str(root / "r"), "--out", str(out),
                 "--executor", kind, "--workers", "2"]) == 0
    res = json.loads((out / "search.json").read_text())
    assert res["executor"] == {"kind": kind, "workers": 2, "ray_address": None}
    assert local["executor"] == {"kind": "local", "workers": 1, "ray_address": None}
    assert len(local["candidates"]) == 4 and [r["step"] for r in local["candidates"]] == [1, 1, 2, 2]
    assert _stable(res) == _stable(local)
    assert res["settings"] == local["settings"]  # the executor is no part of the identity
    assert res["totals"]["examples_used"] == local["totals"]["examples_used"] > 0


def test_resume_on_another_executor_reuses_everything(shared, tmp_path, monkeypatch):
    """A search finished on local resumes on process with 2 workers: nothing re-evaluated (no
    worker even starts), the same records."""
    import shutil

    from variants.cli import main
    from variants.search import driver

    root, local = shared
    monkeypatch.setattr(driver.Search, "sensitivity", _fake_sensitivity)
    out = tmp_path / "s"
    shutil.copytree(root / "local", out)
    assert main(["search", *TINY, "--results-dir", str(root / "r"), "--out", str(out),
                 "--executor", "process", "--workers", "2"]) == 0
    res = json.loads((out / "search.json").read_text())
    assert res["totals"]["evaluated"] == 0 and res["totals"]["reused"] == 4
    assert res["executor"]["kind"] == "process" and _stable(res) == _stable(local)


def test_worker_payload_is_plain_and_reads_the_driver_caches(shared, monkeypatch):
    """init_worker's payload is JSON (paths and settings, absolute); a worker built from it
    writes nothing under the results dir and holds the driver's reference outputs."""
    import numpy as np

    from variants.search import driver, worker

    root, _ = shared
    opts = driver.SearchOptions(n_fit=100, n_calibration=40, n_eval=40, n_search=40,
                                chunk_size=10, bits=(4, 8), results_dir=str(root / "r"),
                                select="value")
    s = driver.Search(opts.validate(), log=lambda m: None)
    s.prepare()
    worker.prepare_reference(s.state, s.payload)  # the caches exist (the module's search)
    payload = s.remote_payload()
    json.dumps(payload)  # plain data only (TypeError for arrays, models, objects)
    assert payload["sweep"]["results_dir"] == str((root / "r").resolve())

    def files():
        return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in (root / "r").rglob("*")}
    before = files()
    state = worker.init_worker(payload)
    assert files() == before
    for part in ("search-calibration", "search-eval"):
        for k, v in s.state["ref"][part].items():
            np.testing.assert_array_equal(state["ref"][part][k], v)


class _LosesTheSecond:
    """A local executor whose second unit comes back as a unit lost twice."""

    workers = 1

    def __init__(self):
        from variants.executors.local import LocalExecutor

        self.inner, self.n = LocalExecutor(), 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def run(self, init, init_args, fn, specs, on_result):
        def relay(i, spec, res):
            self.n += 1
            on_result(i, spec, {"error": "the worker died twice running this unit"}
                      if self.n == 2 else res)
        self.inner.run(init, init_args, fn, specs, relay)


def test_a_lost_candidate_is_failed_and_the_search_goes_on(shared, tmp_path, monkeypatch):
    from variants.executors import factory as executor_factory
    from variants.cli import main
    from variants.search import driver

    root, local = shared
    monkeypatch.setattr(driver.Search, "sensitivity", _fake_sensitivity)
    monkeypatch.setattr(executor_factory, "make_executor", lambda *a, **k: _LosesTheSecond())
    out = tmp_path / "s"
    assert main(["search", *TINY, "--results-dir", str(root / "r"), "--out", str(out)]) == 0
    res = json.loads((out / "search.json").read_text())
    recs = res["candidates"]
    lost = [r for r in recs if "error" in r]
    assert len(lost) == 1 and lost[0]["id"] == local["candidates"][1]["id"]
    assert lost[0]["failed"] == ["worker lost"] and not lost[0]["passed"]
    assert "died twice" in lost[0]["error"] and lost[0]["n_used"] == 0
    assert res["totals"]["lost"] == 1 and len(recs) == 4  # the search went on to its cap
    assert not (out / "candidates" / f"{lost[0]['id']}.json").exists()  # retried on resume
    assert res["totals"]["examples_full"] == sum(r["n_total"] for r in recs if "error" not in r)


@pytest.mark.parametrize("argv, message", [
    (["--executor", "dask"], "--executor must be one of local, process, ray"),
    (["--workers", "2"], "--workers 2 needs --executor process or ray"),
    (["--executor", "process", "--workers", "0"], "--workers must be a whole number"),
    (["--ray-address", "127.0.0.1:1"], "--ray-address needs --executor ray"),
])
def test_bad_executor_flags_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    from variants.cli import main

    out = tmp_path / "s"
    assert main(["search", *argv, "--results-dir", str(tmp_path / "r"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "r").exists()


@pytest.mark.skipif(not HAVE_RAY, reason='ray not installed (pip install -e ".[ray]")')
@pytest.mark.parametrize("via_env", [False, True])
def test_dead_ray_address_exits_2_quickly_with_nothing_written(tmp_path, capsys, monkeypatch,
                                                               via_env):
    import socket

    from variants.cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    argv = ["search", "--executor", "ray", "--results-dir", str(tmp_path / "r"), "--out",
            str(tmp_path / "s")]
    if via_env:
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        argv += ["--ray-address", address]
    from variants.search import driver

    loaded = []
    monkeypatch.setattr(driver.Search, "prepare", lambda self: loaded.append(1))
    assert main(argv) == 2
    assert not loaded  # refused before the checkpoint and data are loaded
    err = capsys.readouterr().err.strip()
    assert f"Ray address '{address}' does not answer" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()

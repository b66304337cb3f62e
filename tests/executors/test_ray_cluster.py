"""Scale-out that survives a lost node (issue #39): a Ray cluster of a head and two worker nodes
on this machine (``ray.cluster_utils.Cluster``; the head has no CPU, so every actor lives on a
worker node, one per node) runs a small search and a sweep's quality passes through
``--executor ray --workers 2 --ray-address``; one worker node is removed while it holds a unit
(:mod:`ray_cluster_toys`: removed mid-unit every time, no sleeps). The lost unit is retried on
the surviving node (no node has room for a replacement actor, so the survivor runs it and the
rest) and the outcome equals the local executor's: the same candidates, verdicts, clause values
and winner; the same sweep outputs (bit for bit), build records and quality columns.

No result goes through a file: the workers read their inputs from their own copy of the results
folder (another path, as another machine's disk), which they leave unchanged, and their results
reach the driver as numpy arrays through Ray's object store; the driver alone writes.

Marked ``multinode`` (61 s for both tests on 2 shared cores): the default run deselects it;
``.ci/run`` runs it (``pytest -m multinode``).
"""

import functools
import json
import shutil
import threading

import numpy as np
import pandas as pd
import pytest

import ray_cluster_toys as toys

ray = pytest.importorskip("ray", reason='ray not installed (pip install -e ".[ray]")')

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

SEARCH = ["--n-fit", "100", "--n-calibration", "40", "--n-eval", "40", "--n-search", "40",
          "--chunk-size", "10", "--bits", "4", "8", "--no-finalize", "--no-progress",
          "--max-candidates", "4", "--batch", "2", "--strategy", "bisect", "--select", "value",
          # the widths alone, fp32 scales (the synthetic sensitivity has no modes)
          "--scale-dtype", "float32", "--modes", "none", "--no-unseen-rows"]
SWEEP = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
         "--timing-rounds", "2", "--timing-warmup", "0", "--cold-start", "none", "--no-progress",
         "--bits", "4", "8"]
VOLATILE = ("wall_s", "saved_s", "reused", "schema_version")  # search.json: times may differ
TIMING = ("b1_", "e2e_b1_", "timed_")  # summary.csv columns measured by the timing pass


@pytest.fixture(scope="module")
def cluster():
    """A head (0 CPUs, the gate's resource) and two one-CPU worker nodes; the driver connected.
    The nodes inherit this ``sys.path`` as ``PYTHONPATH`` (the actors import the package and
    :mod:`ray_cluster_toys`)."""
    from ray.cluster_utils import Cluster

    from variants.executors.ray import driver_path_env

    with driver_path_env():
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "resources": {"gate": 1}, "include_dashboard": False})
        for _ in range(2):
            c.add_node(num_cpus=1)
    ray.init(address=c.address, namespace=toys.NAMESPACE, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


class _GatedRay:
    """Builds the :class:`variants.executors.ray.RayExecutor` the command asks for, with each
    unit behind the gate; keeps every result the driver receives."""

    def __init__(self, gate_name):
        self.gate_name, self.results, self.made = gate_name, [], []

    def __call__(self, kind, *, workers=1, ray_address=None, log=None):
        from variants.executors.ray import RayExecutor

        assert kind == "ray"
        gate_name, results = self.gate_name, self.results

        class Gated(RayExecutor):
            def run(self, init, init_args, fn, specs, on_result):
                def keep(i, spec, result):
                    results.append(result)
                    on_result(i, spec, result)
                super().run(init, init_args, functools.partial(toys.gated, gate_name, fn),
                            specs, keep)

        exe = Gated(workers, ray_address=ray_address, log=log)
        self.made.append(exe)
        return exe


def _doom_one_node(cluster, name):
    """Two worker nodes alive (one added where an earlier test removed one); the gate dooms the
    last; a thread removes that node once it holds a unit. Returns (gate, thread, removed)."""
    while len(cluster.worker_nodes) < 2:
        from variants.executors.ray import driver_path_env

        with driver_path_env():
            cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    doomed = sorted(cluster.worker_nodes, key=lambda n: n.node_id)[-1]
    gate = ray.remote(num_cpus=0, resources={"gate": 1})(toys.Gate).options(
        name=name, namespace=toys.NAMESPACE).remote(doomed.node_id)
    removed = threading.Event()

    def remove_when_held():
        ray.get(gate.arrived.remote())
        cluster.remove_node(doomed)
        removed.set()

    thread = threading.Thread(target=remove_when_held, daemon=True)
    thread.start()
    return gate, thread, removed


def _tree(folder):
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in folder.rglob("*")}


def _one_retry(err):
    lost = [m for m in err.splitlines() if "died running unit" in m]
    assert len(lost) == 1 and "retrying it once on a fresh worker" in lost[0], err[-3000:]
    assert "giving up" not in err


def test_search_survives_a_lost_node(cluster, tmp_path, capsys, monkeypatch):
    from variants.cli import main
    from variants.executors import factory
    from variants.search import driver

    def fake_sensitivity(self):  # driver-side: the candidates are the units here
        self.sens_path = "synthetic"
        return {(p, b): (1.0 / (i + 1)) / b for i, p in enumerate(self.layers)
                for b in self.opts.bits}

    monkeypatch.setattr(driver.Search, "sensitivity", fake_sensitivity)
    res_dir = tmp_path / "r"
    assert main(["search", *SEARCH, "--results-dir", str(res_dir), "--out",
                 str(tmp_path / "local")]) == 0
    local = json.loads((tmp_path / "local" / "search.json").read_text())

    theirs = tmp_path / "worker-disk" / "r"  # the workers' own copy of the inputs and caches
    shutil.copytree(res_dir, theirs)
    before = _tree(theirs)
    real_payload = driver.Search.remote_payload
    monkeypatch.setattr(driver.Search, "remote_payload", lambda self: dict(
        real_payload(self), sweep=dict(real_payload(self)["sweep"], results_dir=str(theirs))))
    make = _GatedRay("gate-search")
    monkeypatch.setattr(factory, "make_executor", make)
    _, thread, removed = _doom_one_node(cluster, "gate-search")
    capsys.readouterr()
    assert main(["search", *SEARCH, "--results-dir", str(res_dir), "--out", str(tmp_path / "ray"),
                 "--executor", "ray", "--workers", "2", "--ray-address", cluster.address]) == 0
    thread.join(60)
    assert removed.is_set()
    _one_retry(capsys.readouterr().err)
    res = json.loads((tmp_path / "ray" / "search.json").read_text())
    assert res["executor"] == {"kind": "ray", "workers": 2, "ray_address": cluster.address}

    def stable(r):
        return [{k: v for k, v in c.items() if k not in VOLATILE} for c in r["candidates"]]
    assert len(local["candidates"]) == 4 and stable(res) == stable(local)
    # both verdicts occur (q4 fails score-error-max, q8 passes), and the winner is the same
    assert {c["passed"] for c in local["candidates"]} == {True, False}
    assert res["winner"]["name"] == local["winner"]["name"] == "q8-g64-emb"
    assert res["totals"]["examples_used"] == local["totals"]["examples_used"] > 0
    # 4 results (one per candidate; the lost unit's never arrived), arrays through the object
    # store; the workers' folder untouched
    assert len(make.results) == 4
    for r in make.results:
        assert isinstance(r["eval"]["logits"], np.ndarray) and r["eval"]["logits"].size > 0
    assert _tree(theirs) == before


def test_sweep_quality_passes_survive_a_lost_node(cluster, tmp_path, capsys, monkeypatch):
    from variants.cli import main
    from variants.executors import factory
    from variants.sweep import quality

    root = tmp_path / "r"
    assert main(["sweep", *SWEEP, "--results-dir", str(root), "--run", "local"]) == 0
    theirs = tmp_path / "worker-disk" / "r"
    shutil.copytree(root, theirs)
    before = _tree(theirs)
    real_payload = quality.payload
    monkeypatch.setattr(quality, "payload", lambda cfg: dict(
        real_payload(cfg), cfg=dict(real_payload(cfg)["cfg"], results_dir=str(theirs))))
    make = _GatedRay("gate-sweep")
    monkeypatch.setattr(factory, "make_executor", make)
    _, thread, removed = _doom_one_node(cluster, "gate-sweep")
    capsys.readouterr()
    assert main(["sweep", *SWEEP, "--results-dir", str(root), "--run", "ray", "--executor",
                 "ray", "--workers", "2", "--ray-address", cluster.address]) == 0
    thread.join(60)
    assert removed.is_set()
    _one_retry(capsys.readouterr().err)

    a, b = (pd.read_csv(root / run / "summary.csv") for run in ("local", "ray"))
    quality_cols = [c for c in a.columns if not c.startswith(TIMING)]
    assert len(quality_cols) > 60 and a["verdict"].tolist() == b["verdict"].tolist()
    pd.testing.assert_frame_equal(a[quality_cols], b[quality_cols], check_exact=True)
    for name in a["variant"]:
        for f in ("outputs.npz", "calibration_outputs.npz"):
            with np.load(root / "local" / name / f) as x, np.load(root / "ray" / name / f) as y:
                assert sorted(x.files) == sorted(y.files)
                for k in x.files:
                    np.testing.assert_array_equal(x[k], y[k])
        ba, bb = (json.loads((root / run / name / "build.json").read_text())
                  for run in ("local", "ray"))
        assert {k: v for k, v in ba.items() if k != "quality_wall_s"} == \
            {k: v for k, v in bb.items() if k != "quality_wall_s"}
    meta = json.loads((root / "ray" / "run.json").read_text())
    assert meta["executor"]["kind"] == "ray" and meta["executor"]["workers"] == 2
    # both variants' passes came back (the lost one's retry from the survivor) as arrays
    assert len(make.results) == 2
    for r in make.results:
        assert isinstance(r["outputs"]["eval"].logits, np.ndarray)
    assert _tree(theirs) == before

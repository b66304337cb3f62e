"""``variants sweep --executor process --workers 2``: the quality passes run on two spawned
workers and give the local sweep's outputs, verdicts and quality columns exactly; the timing
columns are measured in the sweep's own process (run.json says so); bad executor flags exit 2
before anything is written."""

import json

import numpy as np
import pandas as pd
import pytest

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "2", "--timing-warmup", "0", "--cold-start", "none", "--no-progress",
        "--bits", "4", "8"]
TIMING = ("b1_", "e2e_b1_", "timed_")  # summary.csv columns measured by the timing pass

#: process and Ray workers (~1 min in all): .ci/run runs them (pytest -m executors)
pytestmark = pytest.mark.executors


@pytest.mark.slow
def test_two_process_workers_give_the_local_sweep(tmp_path, capsys, monkeypatch):
    from variants.cli import main
    from variants.sweep.run import Sweep

    root = tmp_path / "r"
    assert main(["sweep", *TINY, "--results-dir", str(root), "--run", "local"]) == 0
    calls = []
    real = Sweep._outputs  # the in-process quality pass (the reference's outputs are cached)
    monkeypatch.setattr(Sweep, "_outputs", lambda self, *a: calls.append(a) or real(self, *a))
    assert main(["sweep", *TINY, "--results-dir", str(root), "--run", "proc",
                 "--executor", "process", "--workers", "2"]) == 0
    # both quality passes ran in the workers, none in this process; the timed check (the
    # timed build's eval rows against the judged ones) runs here, with the timing
    assert [c[1:] for c in calls] == [("eval", "q4-g64 (timed build)"),
                                      ("eval", "q8-g64 (timed build)")]
    assert "quality pass of 2 variant(s) on 2 process worker(s)" in capsys.readouterr().err
    a, b = (pd.read_csv(root / run / "summary.csv") for run in ("local", "proc"))
    quality_cols = [c for c in a.columns if not c.startswith(TIMING)]
    assert len(quality_cols) > 60 and a["verdict"].tolist() == b["verdict"].tolist()
    pd.testing.assert_frame_equal(a[quality_cols], b[quality_cols], check_exact=True)
    for name in a["variant"]:
        for f in ("outputs.npz", "calibration_outputs.npz"):
            with np.load(root / "local" / name / f) as x, np.load(root / "proc" / name / f) as y:
                assert sorted(x.files) == sorted(y.files)
                for k in x.files:
                    np.testing.assert_array_equal(x[k], y[k])
        ba, bb = (json.loads((root / run / name / "build.json").read_text())
                  for run in ("local", "proc"))
        assert list(ba) == list(bb)
        assert {k: v for k, v in ba.items() if k != "quality_wall_s"} == \
            {k: v for k, v in bb.items() if k != "quality_wall_s"}
    meta = json.loads((root / "proc" / "run.json").read_text())
    assert meta["executor"]["kind"] == "process" and meta["executor"]["workers"] == 2
    assert "timing and cold starts in the sweep's process" in meta["executor"]["ran"]
    assert "executor" not in json.loads((root / "local" / "run.json").read_text())


@pytest.mark.parametrize("args, says", [
    (["--executor", "cluster"], "--executor must be one of local, process, ray, got 'cluster'"),
    (["--workers", "3"], "--workers 3 needs --executor process or ray"),
    (["--executor", "process", "--workers", "0"], "--workers must be a whole number from 1"),
    (["--ray-address", "h:1"], "--ray-address needs --executor ray"),
])
def test_bad_executor_flags_exit_2_with_nothing_written(tmp_path, capsys, args, says):
    from variants.cli import main

    assert main(["sweep", *TINY, "--results-dir", str(tmp_path / "r"), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()

"""A results folder that never lies: run.json says "complete" only once every output is
in place, a failed write is an error (exit 1, run.json "incomplete"), temp files of a killed
writer are removed on resume, one sweep per run folder (lock; the second exits 2 naming the
holder, a dead holder's lock is taken over), and a completed sweep exits 0 whatever its verdicts
(``--fail-on-violation`` makes failing verdicts exit 1).

One tiny real sweep (``base``, module scope) is copied for every test that reruns it (a resume:
reference from the cache, variants reused, only judging, plots and reports run again).
"""

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

import variants
from runs import io, lock as runlock
from variants.cli import main

ARGS = ["sweep", "--bits", "8", "2", "--speed-mode", "simulated", "--run", "t", "--n-fit", "60",
        "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "1", "--timing-warmup", "0", "--cold-start", "none", "--no-progress"]
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
REPO = Path(variants.__file__).resolve().parents[1]


def sweep(root, *extra):
    return main([*ARGS, "--results-dir", str(root), *extra])


def status(run):
    return json.loads((run / "run.json").read_text())["status"]


def temp_files(folder):
    return sorted(p for p in Path(folder).rglob("*") if io.TEMP_FILE.match(p.name))


def assert_complete_means_written(run):
    """The invariant: a run.json that says complete has summary.csv, report.md and every plot
    report.md links to."""
    if status(run) != "complete":
        return False
    assert (run / "summary.csv").is_file() and (run / "report.md").is_file()
    links = re.findall(r"\]\((plots/[^)]+\.png)\)", (run / "report.md").read_text())
    assert links, "report.md of a complete run links no plot"
    for link in links:
        assert (run / link).is_file(), link
    return True


@pytest.fixture(scope="module")
def base(tmp_path_factory, real_plots):
    root = tmp_path_factory.mktemp("lifecycle") / "results"
    with real_plots():  # a complete run has its plots (conftest stubs them elsewhere)
        code = sweep(root)
    return root, code


@pytest.fixture
def copy(base, tmp_path):
    """A private copy of the base results folder (run and cache); returns its root."""
    root = tmp_path / "results"
    shutil.copytree(base[0], root)
    return root


def holder_process(folder, exit_at_once=False):
    """A Python process that takes ``folder``'s lock and sleeps (or dies holding it)."""
    code = ("import os, sys, time\nfrom runs import lock as runlock\n"
            "with runlock.hold(sys.argv[1], command='planted holder'):\n"
            "    print('ready', flush=True)\n"
            + ("    os._exit(0)\n" if exit_at_once else "    time.sleep(120)\n"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE,
                         env=env, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


# -- exit codes ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_completed_sweep_with_a_failing_variant_exits_0_and_is_complete(base):
    root, code = base
    run = root / "t"
    summary = pd.read_csv(run / "summary.csv")
    assert "FAIL" in set(summary["verdict"])  # q2 fails the default contract
    assert code == 0
    assert assert_complete_means_written(run)
    assert not (run / ".lock").exists() and temp_files(root) == []


@pytest.mark.slow
def test_fail_on_violation_exits_1_and_0_when_all_pass(copy, tmp_path, capsys):
    assert sweep(copy, "--fail-on-violation") == 1
    assert "fails its contract (--fail-on-violation)" in capsys.readouterr().err
    assert status(copy / "t") == "complete"  # the sweep itself finished
    easy = tmp_path / "easy.toml"
    easy.write_text('name = "easy"\n[[clause]]\nid = "agreement"\nmetric = "agreement"\n'
                    'statistic = "rate"\nmin = 0.5\n')
    args = [ARGS[0], "--bits", "8", *ARGS[4:]]  # q8 only (agreement 1.0 on 40 examples)
    assert main([*args, "--results-dir", str(copy), "--contract", str(easy),
                 "--fail-on-violation"]) == 0


def test_help_lists_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--fail-on-violation" in out
    assert "Exit status: 0 the sweep completed" in out and "2 bad input, the run folder in use" in out


# -- status before files; a write error is an error -------------------------------------------
def _failing_atomic(real, target, exc):
    def atomic(path, write, mode):
        if str(path).endswith("/" + target):
            def boom(f):
                raise exc
            return real(path, boom, mode)
        return real(path, write, mode)
    return atomic


@pytest.mark.slow
@pytest.mark.parametrize("target", [pytest.param("t/plots/pareto_b1.png", marks=pytest.mark.plots),
                                    "t/report.md", "t/summary.csv", "t/q8-g64/metrics.json"])
def test_a_full_disk_is_an_error_and_the_run_is_not_complete(copy, capsys, monkeypatch, target):
    run = copy / "t"
    for f in ("report.md", "summary.csv"):
        (run / f).unlink()
    shutil.rmtree(run / "plots")
    # the PNGs go through runs.io too (runs.plots.render: rio.atomic_write -> _atomic)
    monkeypatch.setattr(io, "_atomic", _failing_atomic(io._atomic, target, ENOSPC))
    assert sweep(copy) == 1
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line == (f"variants: error: cannot write {copy / target}: [Errno 28] No space left "
                    "on device; free space or fix permissions, then rerun the same command to "
                    "finish")
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "incomplete"
    assert meta["error"]["file"] == str(copy / target) and "No space left" in meta["error"]["error"]
    assert not (run / "report.md").exists()
    if not target.endswith("metrics.json"):  # (the copied run has the earlier metrics.json)
        assert not (copy / target).exists()
    assert temp_files(copy) == [] and not (run / ".lock").exists()


@pytest.mark.slow
def test_a_plotting_bug_leaves_the_run_incomplete_with_its_report(copy, capsys, monkeypatch):
    import runs.plots.render

    def buggy(run, **kw):
        raise TypeError("planted plotting bug")

    monkeypatch.setattr(runs.plots.render, "plot_run", buggy)
    assert sweep(copy) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "plots not written (TypeError: planted plotting bug)" in err
    meta = json.loads((copy / "t" / "run.json").read_text())
    assert meta["status"] == "incomplete" and "planted plotting bug" in meta["error"]["error"]
    assert (copy / "t" / "report.md").is_file()


@pytest.mark.slow
@pytest.mark.faults  # ~10 s: .ci/run runs it (pytest -m faults)
@pytest.mark.parametrize("where", [  # real plots where the invariant is checked on them
    "t/summary.csv", *(pytest.param(w, marks=pytest.mark.plots)
                       for w in ("t/plots/pareto_b1.png", "t/report.md")), "final run.json"])
def test_a_kill_at_any_step_never_leaves_a_complete_run_without_its_files(
        copy, capsys, monkeypatch, where):
    """Killed (KeyboardInterrupt) while writing each output in turn, or just before the final
    run.json: run.json says incomplete, naming the interruption (issue #39: never "running"
    once the process has ended); the previous run's report is gone (deleted here), so a
    "complete" would be a lie. The rerun completes it."""
    import variants.sweep.run

    run = copy / "t"
    for f in ("report.md", "summary.csv"):
        (run / f).unlink()
    shutil.rmtree(run / "plots")
    with monkeypatch.context() as m:
        if where == "final run.json":
            real = variants.sweep.run.write_json

            def write_json(path, obj):
                if Path(path).name == "run.json" and obj.get("status") == "complete":
                    raise KeyboardInterrupt
                return real(path, obj)
            m.setattr(variants.sweep.run, "write_json", write_json)
        else:
            m.setattr(io, "_atomic", _failing_atomic(io._atomic, where, KeyboardInterrupt()))
        assert sweep(copy) == 130
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "incomplete" and meta["error"]["error"] == "KeyboardInterrupt"
    assert not assert_complete_means_written(run)
    assert temp_files(copy) == [] and not (run / ".lock").exists()
    if where == "t/report.md":  # resume finishes it
        capsys.readouterr()
        assert sweep(copy) == 0
        assert assert_complete_means_written(run)


PHASES = {  # (module, attribute) raising in each phase after run.json first says "running"
    "save the reference": ("variants.sweep.run", "Sweep.save_reference"),
    "quality pass": ("variants.sweep.variant_steps", "quality_outputs"),
    "timing": ("variants.sweep.variant_steps", "time_pair"),
    "judging": ("variants.sweep.run", "judge_variant"),
    "summary": ("variants.sweep.run", "write_csv"),
    "report.html": ("runs.html.render", "write_beside_markdown"),
}


@pytest.mark.slow
@pytest.mark.faults  # ~12 s: .ci/run runs it (pytest -m faults)
@pytest.mark.parametrize("phase", PHASES)
def test_an_exception_in_any_phase_never_leaves_run_json_running(copy, capsys, monkeypatch,
                                                                 phase):
    """Issue #39: no exception path leaves run.json "running" after the process ends. A bug
    raised in each phase of a sweep (all variants rebuilt: their folders are removed) leaves
    run.json "incomplete" with the error; the rerun completes the run."""
    import importlib

    run = copy / "t"
    for name in ("q8-g64", "q2-g64"):
        shutil.rmtree(run / name)
    module, path = PHASES[phase]
    target = importlib.import_module(module)
    *owners, attr = path.split(".")
    for owner in owners:
        target = getattr(target, owner)

    def boom(*a, **k):
        raise RuntimeError(f"planted bug in {phase}")

    with monkeypatch.context() as m, pytest.raises(RuntimeError, match="planted bug"):
        m.setattr(target, attr, boom)
        sweep(copy)  # a bug: raised as it is (a traceback), after run.json records it
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "incomplete", phase
    assert f"planted bug in {phase}" in meta["error"]["error"]
    assert not (run / ".lock").exists()
    capsys.readouterr()
    assert sweep(copy) == 0 and status(run) == "complete"


@pytest.mark.slow
def test_sigterm_mid_sweep_leaves_run_json_incomplete_and_exits_143(copy):
    """A scheduler's stop (SIGTERM) is recorded as Ctrl-C is: run.json "incomplete" naming it,
    exit 143, the lock released; the rerun finishes the run."""
    import signal
    import time

    run = copy / "t"
    for name in ("q8-g64", "q2-g64"):
        shutil.rmtree(run / name)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "variants", *ARGS, "--results-dir", str(copy)],
                         env=env, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if status(run) == "running":
                break
        except (json.JSONDecodeError, FileNotFoundError):
            pass
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert err.strip().splitlines()[-1] == ("variants: terminated (SIGTERM); rerun the same "
                                            "command to resume")
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "incomplete" and meta["error"]["error"] == "terminated by SIGTERM"
    assert not (run / ".lock").exists()
    assert sweep(copy) == 0 and status(run) == "complete"


# -- leftovers and the lock ---------------------------------------------------------------------
def test_temp_pattern_matches_what_atomic_writes_and_nothing_else(tmp_path):
    fd, name = tempfile.mkstemp(dir=tmp_path, prefix=".outputs.npz.", suffix=".tmp")
    os.close(fd)
    assert io.TEMP_FILE.match(Path(name).name)
    for other in ("outputs.npz", "keep.tmp", ".hidden", ".x.ABCDEFGH.tmp", ".x.abc.tmp",
                  "summary.csv.tmp.bak", ".lock"):
        assert not io.TEMP_FILE.match(other), other
    assert io.TEMP_FILE.match("summary.csv.tmp")  # the old hand-written one


def test_remove_temp_files_removes_only_temp_files(tmp_path):
    planted = [tmp_path / ".run.json.ab12cd_9.tmp", tmp_path / "v" / ".outputs.npz.0123abcd.tmp",
               tmp_path / "summary.csv.tmp"]
    kept = [tmp_path / "keep.tmp", tmp_path / "v" / "outputs.npz", tmp_path / ".x.ABCDEFGH.tmp"]
    for p in planted + kept:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    assert sorted(io.remove_temp_files(tmp_path)) == sorted(planted)
    assert [p.exists() for p in planted] == [False] * 3 and all(p.exists() for p in kept)
    assert io.remove_temp_files(tmp_path / "missing") == []


def test_lock_is_exclusive_names_its_holder_and_is_removed_on_release(tmp_path):
    with runlock.hold(tmp_path, command="first") as me:
        assert me["pid"] == os.getpid()
        assert json.loads((tmp_path / ".lock").read_text())["command"] == "first"
        with pytest.raises(runlock.RunLocked, match=rf"pid {os.getpid()} on .*first.*another --run"):
            with runlock.hold(tmp_path):
                pass
    assert not (tmp_path / ".lock").exists()
    with runlock.hold(tmp_path):  # free again
        pass


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_message(tmp_path):
    p = holder_process(tmp_path, exit_at_once=True)
    assert p.wait() == 0
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == p.pid  # left behind
    logged = []
    with runlock.hold(tmp_path, log=logged.append):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert len(logged) == 1 and f"stale lock of pid {p.pid} " in logged[0]
    assert "no longer running" in logged[0]


def test_cache_temp_files_are_removed_only_when_no_other_sweep_uses_the_cache(tmp_path):
    calls = []
    with runlock.cache_lock(tmp_path) as alone:
        assert alone
        with runlock.cache_lock(tmp_path, when_alone=lambda: calls.append(1)) as alone2:
            assert not alone2 and calls == []
    with runlock.cache_lock(tmp_path, when_alone=lambda: calls.append(1)) as alone:
        assert alone and calls == [1]


@pytest.mark.slow
def test_resume_removes_leftover_temp_files_and_takes_over_a_stale_lock(copy, capsys):
    run = copy / "t"
    planted = [run / ".run.json.a1b2c3d4.tmp", run / "summary.csv.tmp",
               run / "q8-g64" / ".outputs.npz.zz99_x0y.tmp", run / "reference" / ".outputs.npz.k2j3h4g5.tmp",
               run / "plots" / ".reliability.png.qwertyui.tmp"]
    cache_planted = [next((copy / ".cache" / "reference").iterdir()).with_name(".x.npz.abcdefgh.tmp")]
    kept = [run / "notes.tmp", run / "q8-g64" / ".keep", copy / ".cache" / "mine.tmp"]
    for p in planted + cache_planted + kept:
        p.write_bytes(b"half")
    dead = holder_process(run, exit_at_once=True)
    dead.wait()
    assert sweep(copy) == 0
    err = capsys.readouterr().err
    assert f"taking over the stale lock of pid {dead.pid} " in err
    assert f"{run}: removed 5 leftover temp file(s)" in err
    assert f"{copy / '.cache'}: removed 1 leftover temp file(s)" in err
    assert not any(p.exists() for p in planted + cache_planted)
    assert all(p.read_bytes() == b"half" for p in kept)
    assert status(run) == "complete" and not (run / ".lock").exists()


@pytest.mark.slow
def test_second_sweep_plot_and_check_on_a_held_run_exit_2_naming_the_holder(copy, capsys):
    run = copy / "t"
    holder = holder_process(run)
    try:
        before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
        for argv in ([*ARGS, "--results-dir", str(copy)], ["plot", str(run)],
                     ["check", str(run), "--n-bootstrap", "0"]):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("variants: error: "), err
            assert f"is in use by pid {holder.pid} on " in err and "planted holder" in err
            assert "since " in err and "wait for it to finish" in err
        assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written
        assert main(["check", str(run), "--n-bootstrap", "0", "--output-dir",
                     str(copy / "elsewhere")]) == 0  # writing elsewhere is allowed
    finally:
        holder.kill()
        holder.wait()

"""Faults and races: signals mid-sweep, two sweeps on one run folder, commands beside a running sweep,
and the issue's NaN-returning model factory."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from harness import SEARCH_FAST, SWEEP_FAST, Case, Result, override, run_cmd, spawn

SLOW = ["sweep", *override(SWEEP_FAST, bits=["2", "3", "4", "6", "8"], run="x", timing_rounds="3")]


def wait_for(path: Path, secs=90) -> bool:
    t = time.time()
    while time.time() - t < secs:
        if path.exists():
            return True
        time.sleep(0.2)
    return False


def status(tmp, run="x") -> str:
    try:
        return json.loads((Path(tmp) / "r" / run / "run.json").read_text()).get("status", "?")
    except (OSError, ValueError) as e:
        return f"unreadable ({e.__class__.__name__})"


def finish(p, secs=300):
    try:
        out, err = p.communicate(timeout=secs)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err
    return p.returncode, out, err


def interrupt(sig, expect_rcs):
    def custom(ctx):
        tmp = Path(ctx["tmp"])
        t0 = time.time()
        p = spawn(SLOW, tmp, {})
        wait_for(tmp / "r" / "x" / "run.json")
        time.sleep(2)
        os.killpg(p.pid, sig)
        rc, out, err = finish(p, 120)
        probs = []
        st = status(tmp)
        if sig != signal.SIGKILL and st == "running":
            probs.append(f"run.json says 'running' after the {sig.name}")
        if rc not in expect_rcs:
            probs.append(f"{sig.name}: exit {rc}")
        re = run_cmd(SLOW, tmp, {}, 300)
        if re.rc != 0:
            last = (re.stderr.strip().splitlines() or [""])[-1]
            probs.append(f"rerun after {sig.name}: exit {re.rc}: {last[:200]}")
        elif status(tmp) != "complete":
            probs.append(f"rerun after {sig.name}: run.json status {status(tmp)!r}")
        note = "problem: " + "; ".join(probs) if probs else f"{sig.name} exit {rc}, status {st!r}; rerun exit 0"
        r = Result(130 if rc in expect_rcs else rc, out, err + re.stderr, time.time() - t0, note)
        r.argv = SLOW
        return r
    return custom


def beside(argv2, want_lock=True, second_env=None):
    """Start the slow sweep; once its run.json exists, run argv2; the sweep must still end 0."""
    def custom(ctx):
        tmp = Path(ctx["tmp"])
        t0 = time.time()
        p = spawn(SLOW, tmp, {})
        wait_for(tmp / "r" / "x" / "run.json")
        time.sleep(1)
        b = run_cmd(argv2, tmp, second_env or {}, 300)
        rc, out, err = finish(p, 300)
        probs = []
        if rc != 0:
            probs.append(f"the first sweep ended {rc}: {(err.strip().splitlines() or [''])[-1][:200]}")
        if b.rc == 0 and want_lock:
            probs.append("the second command ran on a folder in use (exit 0)")
        note = "problem: " + "; ".join(probs) if probs else f"first sweep exit {rc}"
        r = Result(b.rc, b.stdout, b.stderr, time.time() - t0, note)
        r.argv = argv2
        return r
    return custom


def nonfinite_ok(ctx, res):
    tmp = Path(ctx["tmp"])
    runs = [p.parent for p in tmp.glob("r/*/run.json")]
    if not runs:
        return "no run folder"
    st = json.loads((runs[0] / "run.json").read_text()).get("status")
    if st != "complete":
        return f"run.json status {st!r}"
    verdicts = list(runs[0].glob("*/verdict.json"))
    text = " ".join(v.read_text() for v in verdicts)
    if "finite-outputs" not in text or "FAIL" not in res.stdout + res.stderr:
        return "variant did not FAIL on clause finite-outputs"
    return ""


def nonfinite_ref(ctx, res):
    tmp = Path(ctx["tmp"])
    st = [json.loads(p.read_text()).get("status") for p in tmp.glob("r/*/run.json")]
    return "" if st in ([], ["incomplete"]) else f"run.json status {st}"


NF = ["sweep", *SWEEP_FAST, "--model", "tests.sweep.nonfinite_model:build"]


def fault_cases() -> list:
    out = [
        Case("fault-sigint-sweep-resume", "faults", custom=interrupt(signal.SIGINT, (130, 1, 2)), expect="either"),
        Case("fault-sigterm-sweep-resume", "faults", custom=interrupt(signal.SIGTERM, (130, 143, -15, 1, 2)),
             expect="either"),
        Case("fault-sigkill-sweep-resume", "faults", custom=interrupt(signal.SIGKILL, (-9,)), expect="either"),
        Case("race-two-sweeps-one-run", "concurrency", custom=beside(SLOW)),
        Case("race-check-during-sweep", "concurrency", custom=beside(["check", "r/x"])),
        Case("race-plot-during-sweep", "concurrency", custom=beside(["plot", "r/x"]), expect="either"),
        Case("race-export-during-sweep", "concurrency",
             custom=beside(["export", "r/x", "--variant", "q8-g64", "--out", "o"]), expect="either"),
        Case("race-other-run-same-cache", "concurrency",
             custom=beside(["sweep", *override(SWEEP_FAST, run="y")], want_lock=False), expect="accept"),
        Case("race-compare-during-sweep", "concurrency",
             custom=beside(["compare", "r/x:q4-g64", "r/x:q8-g64"]), expect="either"),
        Case("issue-nonfinite-variant-fails", "issue", NF, expect="accept", check=nonfinite_ok, timeout=200),
        Case("issue-nonfinite-reference-refused", "issue", NF, env={"VARIANTS_TEST_NONFINITE": "reference"},
             check=nonfinite_ref, timeout=200, allow_left=("r",),
             doc="issue #39: refused in one line with run.json 'incomplete' (the run folder stays)"),
        Case("issue-nonfinite-inf", "issue", NF, env={"VARIANTS_TEST_NONFINITE": "inf"}, expect="accept",
             check=nonfinite_ok, timeout=200),
        Case("issue-nonfinite-all-rows", "issue", NF, env={"VARIANTS_TEST_NONFINITE": "all"}, expect="accept",
             check=nonfinite_ok, timeout=200),
        Case("issue-sweep-n-fit-zero", "issue", ["sweep", *override(SWEEP_FAST, n_fit="0")]),
        Case("issue-timing-warmup-zero-b32", "issue", ["sweep", *override(SWEEP_FAST, timing_warmup="0",
                                                                       timing_batch_sizes=["1", "32"])],
             expect="accept", timeout=200),
        Case("issue-qkernel-banana-search", "issue", ["search", *SEARCH_FAST],
             env={"VARIANTS_QKERNEL": "banana"}),
    ]
    for c in out:
        if c.id.startswith("race-"):
            c.allow_left = ("r",)
    return out

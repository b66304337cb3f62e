"""Shared pieces of the attack harness: the case record, fixtures, process running, classification.

A case is one *kind* of bad (or odd) input, fault or race, tried as a new user would: one
command in a fresh temporary folder (its cwd), with PYTHONPATH at the repository root.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable

# Small settings that keep an accepted command to seconds.
SWEEP_FAST = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
              "--timing-rounds", "1", "--cold-start", "none", "--no-progress", "--bits", "8",
              "--results-dir", "r"]
SEARCH_FAST = ["--n-fit", "60", "--n-calibration", "100", "--n-eval", "40", "--n-search", "100",
               "--n-sensitivity", "20", "--max-candidates", "2", "--bits", "6", "8", "--timing-rounds", "1",
               "--timing-batch-sizes", "1", "--cold-start", "none", "--no-progress", "--results-dir", "r"]
SENS_FAST = ["--n-examples", "20", "--n-fit", "60", "--n-calibration", "40", "--n-search", "40", "--bits", "8",
             "--layers", r"layers\.0\.attention\.value", "--no-progress", "--results-dir", "r"]


@dataclasses.dataclass
class Case:
    id: str
    family: str
    argv: list | Callable | None = None      # after `python -m variants`; {tmp},{repo},{run},{run2},{exp} filled
    expect: str = "refuse"                  # refuse | accept | either | tolerate
    env: dict = dataclasses.field(default_factory=dict)
    setup: Callable | None = None           # setup(ctx) before the command (ctx: dict of paths)
    needs: tuple = ()                       # fixtures copied into tmp: "run", "run2", "exp", "cache"
    check: Callable | None = None           # check(ctx, res) -> problem string or ""
    custom: Callable | None = None          # custom(ctx) -> Result (concurrency, signals)
    doc: str = ""                           # where a tolerated behaviour is documented
    timeout: float = 300
    as_nobody: bool = False                 # run without root's read-everything (chmod cases)
    allow_left: tuple = ()                  # path prefixes a refusal may leave (documented, or a race's other run)

    @property
    def verb(self) -> str:
        if isinstance(self.argv, list) and self.argv:
            return str(self.argv[0])
        return self.family.split("-")[0]


def override(base: list, **flags) -> list:
    """`base` with each --flag replaced (value None: dropped; a list: several values)."""
    out, i = [], 0
    names = {"--" + k.replace("_", "-") for k in flags}
    while i < len(base):
        a = base[i]
        if a in names:
            i += 1
            while i < len(base) and not base[i].startswith("--"):
                i += 1
            continue
        out.append(a)
        i += 1
    for k, v in flags.items():
        if v is None:
            continue
        out.append("--" + k.replace("_", "-"))
        out.extend(v if isinstance(v, list) else [v])
    return out


@dataclasses.dataclass
class Result:
    rc: int | None
    stdout: str
    stderr: str
    secs: float
    note: str = ""


def env_for(case_env: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VARIANTS_")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(case_env)
    return env


def nobody_prefix() -> list:
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    return []


def spawn(argv: list, cwd: Path, env: dict, nobody: bool = False) -> subprocess.Popen:
    cmd = (nobody_prefix() if nobody else []) + [PY, "-m", "variants", *argv]
    e = env_for(env)
    if nobody:  # a home with a readable copy of the compiled kernels (see run.build_fixtures)
        e["HOME"] = os.environ.get("ATTACK_NOBODY_HOME", str(cwd))
    return subprocess.Popen(cmd, cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True, preexec_fn=_default_signals)


def _default_signals():
    """A harness started in the background (`cmd &`) inherits SIGINT ignored; a user's Ctrl-C is not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_cmd(argv: list, cwd: Path, env: dict, timeout: float, nobody: bool = False) -> Result:
    t0 = time.time()
    p = spawn(argv, cwd, env, nobody)
    try:
        out, err = p.communicate(timeout=timeout)
        return Result(p.returncode, out, err, time.time() - t0)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Result(None, out, err, time.time() - t0, f"hang: killed after {timeout:.0f} s")


def snapshot(root: Path) -> dict:
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            snap[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, p.is_dir())
    return snap


def running_runs(root: Path) -> list:
    bad = []
    for p in root.rglob("run.json"):
        try:
            if re.search(r'^  "status": "running"', p.read_text(errors="replace"), re.M):
                bad.append(str(p.relative_to(root)))
        except OSError:
            pass
    return bad


#: a complete file of the shared results cache (.cache/heads, reference, search, sensitivity)
CACHE_ENTRY = re.compile(r"(^|/)\.cache/(heads|reference|search|sensitivity)/.+\.(npz|json|csv)$")

SNAKE = re.compile(r"(?<![\w./\-'\"$])([a-z][a-z0-9]*_[a-z0-9_]+)(?![\w./\-])")
ALLOWED_SNAKE = {"run_json"} | {t for f in ("default", "strict", "lenient")
                                 for t in re.findall(r"[a-z0-9_]+", (REPO / "contracts" / f"{f}.toml").read_text())
                                 if "_" in t}


def classify(case: Case, res: Result, before: dict, after: dict, tmp: Path) -> tuple[str, str, list]:
    """(class, problem, leftovers)."""
    problems = []
    new = sorted(set(after) - set(before))
    changed = sorted(k for k in set(after) & set(before) if after[k] != before[k] and not after[k][2])
    stray = running_runs(tmp)
    if stray:
        problems.append("run.json left 'running': " + ", ".join(stray))
    err = res.stderr
    lines = [l for l in err.splitlines() if l.strip()]
    if res.rc is None:
        problems.append(res.note or "hang")
    elif res.note.startswith("problem: "):
        problems.append(res.note[len("problem: "):])
    if "Traceback (most recent call last)" in err:
        problems.append("traceback")
    if res.rc is not None and res.rc not in (0, 1, 2, 130, 143):  # 130 Ctrl-C, 143 SIGTERM
        problems.append(f"exit {res.rc}")
    leftovers = []
    kept_cache = False
    if res.rc == 2:
        errl = [l for l in lines if l.startswith("variants: error: ")]
        if not lines or not lines[-1].startswith("variants: error: "):
            problems.append("refusal's last stderr line is not 'variants: error: ...'")
        elif len(errl) > 1:
            problems.append(f"{len(errl)} error lines")
        if errl:
            # valid names listed after "one of" / "known keys" / "e.g." are vocabulary; an internal
            # name next to the flag or variable to change (--flag, VARIANTS_*) still tells the fix
            msg = re.split(r"one of|known keys|e\.g\.", errl[-1])[0]
            names_fix = re.search(r"(?<![\w-])--[a-z]|VARIANTS_[A-Z]", errl[-1])
            snakes = [] if names_fix else [s for s in SNAKE.findall(msg) if s not in ALLOWED_SNAKE]
            if snakes:
                problems.append("names internal identifiers: " + ", ".join(sorted(set(snakes))[:4]))
        # complete entries of the shared cache (a fitted head, the reference's outputs, a
        # latency table) computed before a later refusal are kept by design (results/README.md)
        new = [k for k in new if not k.startswith(case.allow_left or ("\0",))]
        cached = [k for k in new if CACHE_ENTRY.search(k) and not after[k][2]]
        cache_dirs = {str(Path(k).parent) for k in cached}
        cache_dirs |= {str(p) for k in cached for p in Path(k).parents}
        new = [k for k in new if k not in cached and not (after[k][2] and k in cache_dirs)]
        if cached:
            kept_cache = True
        leftovers = [k + ("/" if after[k][2] else "") for k in new
                     if not k.endswith(".lock") and not k.startswith(case.allow_left or ("\0",))]
        leftovers += [k + " (modified)" for k in changed
                      if not k.endswith(".lock") and not k.startswith(case.allow_left or ("\0",))]
        if leftovers:
            problems.append("left behind: " + ", ".join(leftovers[:6]) + (" ..." if len(leftovers) > 6 else ""))
        if case.expect == "accept":
            problems.append("valid input refused")
    elif res.rc in (0, 1):
        if case.expect == "refuse":
            problems.append(f"bad input accepted (exit {res.rc})")
    if case.check and not problems:
        extra = case.check({"tmp": tmp}, res)
        if extra:
            problems.append(extra)
    if problems:
        return "unclean", "; ".join(problems), leftovers
    if case.expect == "tolerate" and res.rc in (0, 1):
        return "tolerated", case.doc, leftovers
    if kept_cache:
        return "tolerated", ("refused after computing complete cache entries, kept for the next "
                             "run (results/README.md, 'refused commands')"), leftovers
    return "clean", "", leftovers

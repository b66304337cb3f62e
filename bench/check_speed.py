"""`variants check` on one run folder: this tree against an older commit, alternated, and whether
both write the same files.

Each round runs ``variants check RUN --output-dir OUT`` once from each tree, in a fresh process,
alternating which goes first (ABBA), and records wall, user and system CPU seconds of the child
(``resource.getrusage``). CPU seconds are the figure to read on a shared machine (wall time
also counts the other processes' load). At the end the two output folders are compared file by
file (``report.json``, ``verdict.json``, ``metrics.json`` of each variant, ``summary.csv``).

The older tree is ``git archive <commit>`` unpacked into a temporary folder and run with that
folder first on ``sys.path`` (the editable install is bypassed), so its own code runs.

Run (the figure in docs/user-guide.md: the redesign's base is a85402a)::

    python bench/check_speed.py results/minilm-sentiment-quant-g64 --base a85402a --rounds 3
"""

import argparse
import filecmp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_RUNNER = """
import runpy, sys
tree = sys.argv[1]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, tree)
sys.argv = ["variants"] + sys.argv[2:]
runpy.run_module("variants", run_name="__main__", alter_sys=True)
"""
COMPARED = ("report.json", "verdict.json", "metrics.json")


def run_check(tree, run, out, runner):
    """(wall s, user s, sys s) of one ``variants check`` from ``tree``, in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, runner, str(tree), "check", str(run),
                           "--output-dir", str(out)], cwd=tempfile.gettempdir(),
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        sys.exit(f"check_speed: {tree} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def same_files(a, b):
    """Names of compared files that differ between output folders ``a`` and ``b``."""
    diff = [] if filecmp.cmp(a / "summary.csv", b / "summary.csv", shallow=False) \
        else ["summary.csv"]
    for v in sorted(p.name for p in a.iterdir() if (p / "verdict.json").is_file()):
        diff += [f"{v}/{f}" for f in COMPARED
                 if not filecmp.cmp(a / v / f, b / v / f, shallow=False)]
    return diff


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a run folder (a finished `variants sweep`)")
    p.add_argument("--base", default="a85402a", help="the older commit to compare against")
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    args = p.parse_args()
    if not (args.run / "run.json").is_file():
        sys.exit(f"check_speed: {args.run} has no run.json; pass a finished sweep's folder")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runner = tmp / "runner.py"
        runner.write_text(_RUNNER)
        base = tmp / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        trees = {"base": base, "this": ROOT}
        times = {k: [] for k in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for name in order:
                times[name].append(run_check(trees[name], args.run, tmp / name, runner))
                w, u, s = times[name][-1]
                print(f"round {r + 1} {name:4s}  wall {w:6.2f} s  user {u:6.2f} s  sys {s:5.2f} s",
                      flush=True)
        med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in times.items()}
        for k, (w, u, s) in med.items():
            print(f"median {k:4s}  wall {w:6.2f} s  user {u:6.2f} s  sys {s:5.2f} s  "
                  f"cpu {u + s:6.2f} s")
        b, t = med["base"], med["this"]
        print(f"speed-up: cpu {(b[1] + b[2]) / (t[1] + t[2]):.2f}x, wall {b[0] / t[0]:.2f}x "
              f"({os.cpu_count()} cores, {args.rounds} rounds)")
        diff = same_files(tmp / "base", tmp / "this")
        print("outputs: identical" if not diff else f"outputs differ: {', '.join(diff)}")


if __name__ == "__main__":
    main()

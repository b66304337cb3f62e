"""Run the attack: every case in a fresh temporary folder, one at a time; write a CSV and a summary.

    PYTHONPATH=. .venv/bin/python scripts/attack/run.py [--only SUBSTR ...] [--list] [--out FILE]

Prints "N kinds: C clean, T tolerated, U unclean" last. The shared fixtures (one tiny sweep, two
more for compare, one export) are built once under --work and copied into each case that needs
them.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, SWEEP_FAST, Result, classify, override, run_cmd, snapshot  # noqa: E402
import cases  # noqa: E402


def build_fixtures(work: Path) -> dict:
    fx = work / "fx"
    r = fx / "r"
    done = fx / ".done"
    if not done.exists():
        shutil.rmtree(fx, ignore_errors=True)
        fx.mkdir(parents=True)
        for run, bits in (("base", ["8"]), ("other", ["6"]), ("two", ["4", "6"])):
            res = run_cmd(["sweep", *override(SWEEP_FAST, results_dir=str(r), run=run, bits=bits)], fx, {}, 600)
            if res.rc != 0:
                sys.exit(f"fixture sweep {run} failed (exit {res.rc}): {res.stderr[-2000:]}")
        res = run_cmd(["export", str(r / "base"), "--variant", "q8-g64", "--out", str(fx / "exp")], fx, {}, 600)
        if res.rc != 0:
            sys.exit(f"fixture export failed (exit {res.rc}): {res.stderr[-2000:]}")
        done.write_text("ok\n")
    home = work / "home"
    if not home.exists():
        src = Path.home() / ".cache" / "mlx-variants"
        if src.exists():
            shutil.copytree(src, home / ".cache" / "mlx-variants")
        home.mkdir(exist_ok=True)
        os.system(f"chmod -R a+rwX '{home}'")
    os.environ["ATTACK_NOBODY_HOME"] = str(home)
    return {"r": r, "exp": fx / "exp"}


def place(fx: dict, tmp: Path, needs) -> dict:
    ctx = {"tmp": str(tmp), "repo": str(REPO), "run": "r/base", "run2": "r/other", "run3": "r/two",
           "exp": "exp", "ex": str(REPO / "examples")}
    if {"run", "run2", "run3", "cache"} & set(needs):
        (tmp / "r").mkdir()
    for need, name in (("run", "base"), ("run2", "other"), ("run3", "two"), ("cache", ".cache")):
        if need in needs:
            shutil.copytree(fx["r"] / name, tmp / "r" / name, symlinks=True)
    if "exp" in needs:
        def copy(src, dst):
            if os.path.getsize(src) > 10_000_000:
                os.link(src, dst)  # tamper helpers unlink before writing
            else:
                shutil.copy2(src, dst)
        shutil.copytree(fx["exp"], tmp / "exp", copy_function=copy)
    return ctx


def fill(argv, ctx):
    if callable(argv):
        argv = argv(ctx)
    return [a.format(**ctx) if isinstance(a, str) and "{" in a and "}" in a and "\\" not in a else a
            for a in argv]


def run_case(case, fx, work: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"{case.id[:40]}-", dir=work / "cases"))
    os.chmod(tmp, 0o777)
    ctx = place(fx, tmp, case.needs)
    ctx["ctxdir"] = tmp
    argv = []
    try:
        if case.setup:
            case.setup(ctx)
        before = snapshot(tmp)
        if case.custom:
            res = case.custom(ctx)
            argv = getattr(res, "argv", [])
        else:
            argv = fill(case.argv, ctx)
            res = run_cmd(argv, tmp, case.env, case.timeout, nobody=case.as_nobody)
    except Exception as e:  # a harness fault, not the program's
        res, before = Result(None, "", "", 0.0, f"harness error: {e!r}"), {}
    after = snapshot(tmp)
    cls, problem, left = classify(case, res, before, after, tmp)
    if res.note.startswith("harness error"):
        cls, problem = "harness-error", res.note
    errl = [l for l in res.stderr.splitlines() if l.strip()]
    envs = " ".join(f"{k}={v!r}" for k, v in case.env.items())
    cmd = (envs + " " if envs else "") + "variants " + " ".join(repr(a) if (not a or any(
        c in a for c in " \n\t'\"$\\")) else a for a in map(str, argv))
    row = {"id": case.id, "family": case.family, "verb": case.verb, "expect": case.expect, "class": cls,
           "rc": res.rc, "secs": round(res.secs, 1), "problem": problem,
           "stderr_first": errl[0][:300] if errl else "", "stderr_last": errl[-1][:300] if errl else "",
           "leftovers": " ".join(left[:10]), "note": res.note, "cmd": cmd[:600], "doc": case.doc}
    if cls == "clean":
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        row["tmp"] = str(tmp)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="run the cases whose id or family contains one of these")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "variants-attack"))
    ap.add_argument("--out", default=None, help="CSV path (default: WORK/attack.csv)")
    ap.add_argument("--merge", default=None, metavar="CSV",
                    help="an earlier full run's CSV: its rows for the cases not rerun here are kept, so the "
                         "summary covers the whole table")
    a = ap.parse_args()
    table = cases.all_cases()
    ids = [c.id for c in table]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        sys.exit(f"duplicate case ids: {sorted(dup)}")
    if a.only:
        table = [c for c in table if any(s in c.id or s in c.family for s in a.only)]
    if a.list:
        for c in table:
            print(f"{c.id:50s} {c.family:20s} {c.expect}")
        print(f"{len(table)} kinds")
        return 0
    work = Path(a.work)
    (work / "cases").mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o777)
    os.chmod(work / "cases", 0o777)
    t0 = time.time()
    fx = build_fixtures(work)
    out = Path(a.out) if a.out else work / "attack.csv"
    fields = ["id", "family", "verb", "expect", "class", "rc", "secs", "problem", "stderr_first",
              "stderr_last", "leftovers", "note", "cmd", "doc", "tmp"]
    counts = {"clean": 0, "tolerated": 0, "unclean": 0, "harness-error": 0}
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for i, case in enumerate(table, 1):
            row = run_case(case, fx, work)
            counts[row["class"]] += 1
            w.writerow(row)
            f.flush()
            mark = "" if row["class"] == "clean" else f"  <- {row['class']}: {row['problem'][:160]}"
            print(f"[{i}/{len(table)}] {case.id} rc={row['rc']} {row['secs']}s{mark}", flush=True)
    if a.merge:  # keep the earlier rows of the cases not rerun (same table order)
        with open(a.merge, newline="") as f:
            old = {r["id"]: r for r in csv.DictReader(f)}
        with open(out, newline="") as f:
            new = {r["id"]: r for r in csv.DictReader(f)}
        rows = [new.get(c.id) or old.get(c.id) for c in cases.all_cases()]
        missing = [c.id for c, r in zip(cases.all_cases(), rows) if r is None]
        rows = [r for r in rows if r]
        with open(out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        counts = {k: sum(r["class"] == k for r in rows) for k in counts}
        table = rows
        if missing:
            print(f"{len(missing)} kinds in neither CSV: {', '.join(missing[:10])}")
    wall = time.time() - t0
    extra = f", {counts['harness-error']} harness errors" if counts["harness-error"] else ""
    print(f"wrote {out}; wall {wall / 60:.1f} min")
    print(f"{len(table)} kinds: {counts['clean']} clean, {counts['tolerated']} tolerated, "
          f"{counts['unclean']} unclean{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

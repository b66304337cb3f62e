"""Identical results across refactors: ``variants check`` on the saved fixture runs (one per
family) writes the same ``report.json``, ``verdict.json``, ``metrics.json``, ``summary.csv`` and
``check.json`` as the goldens in ``tests/fixtures/golden_check/<run>/`` (the files themselves;
``check.json`` without ``run``, the path the command was given). These files hold no timestamps
or wall times (the run's own timing lives in ``timing.json``/``run.json``, which ``check`` only
reads), so nothing else is excluded.

Compared by value, not by bytes: every key, list length, string (verdicts, statuses, clause ids,
names), integer (counts) and boolean exactly; floats to a relative 1e-9 with an absolute floor of
1e-12. Why a tolerance: NumPy picks its SIMD kernels per CPU, and its float64 reductions (sums,
means, quantiles) add in another order with AVX-512 than with AVX2 (or NEON on a Mac). Between
those two paths ``check`` on these runs writes a few hundred of ~14,000 floats differently, at
most 3.4e-10 apart relative where the value is not tiny; values that are themselves round-off
(a drift's minimum of ~2e-8 made of ``1 - p`` with ``p`` near 1) differ by one ulp of 1.0
(2.2e-16), which the absolute floor covers. A real change of a statistic moves it far more than
1e-9 relative, and any change of a verdict, status or count is caught exactly.
``.ci/run`` runs this file a second time with NumPy's AVX-512 kernels switched off
(``NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL"``), so both paths are checked on every CI run.

A change that is *meant* to change these numbers regenerates the goldens, deliberately, and says
in its commit which numbers moved and why::

    VARIANTS_REGENERATE_GOLDEN=1 NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL" \\
        python -m pytest tests/runs/test_identical_results.py

(the variable keeps the goldens on the AVX2 path they were made on, so a regeneration's diff
shows only what the change moved; to see a difference in full, run ``variants check FIXTURE
--output-dir A`` and diff A against the golden folder).
"""

import csv
import io
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from variants.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures"
GOLDEN = FIXTURES / "golden_check"
#: the saved runs: quant (two models), lowrank, prune, exit
RUNS = ["sweep_small", "sweep_small_choice", "sweep_small_lowrank", "sweep_small_prune",
        "sweep_small_exit"]
FILES = ("report.json", "verdict.json", "metrics.json")
#: float tolerance (see the module docstring): relative, and an absolute floor for round-off
REL, ABS = 1e-9, 1e-12


def _outputs(folder):
    """{relative path: text} of the files compared (check.json without ``run``)."""
    folder = Path(folder)
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.name in FILES or rel == "summary.csv":
            out[rel] = p.read_text()
        elif rel == "check.json":
            d = json.loads(p.read_text())
            d.pop("run", None)
            out[rel] = json.dumps(d, indent=2, sort_keys=True) + "\n"
    return out


def _float(a):
    """``a`` as a float when it is one (JSON float, or a CSV cell that parses as one and is not
    an integer), else None."""
    if isinstance(a, float):
        return a
    if isinstance(a, str):
        try:
            int(a)
            return None
        except ValueError:
            pass
        try:
            return float(a)
        except ValueError:
            return None
    return None


def _close(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)


def differences(want, got, where=""):
    """Where ``got`` differs from ``want`` (parsed JSON, or CSV rows of strings): a list of
    ``"path: want != got"``. Dicts must have the same keys, lists the same length, ints, bools,
    None and non-numeric strings must be equal; floats (and CSV cells holding floats) must be
    within ``REL`` relative or ``ABS`` absolute (NaN equals NaN)."""
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(want) != sorted(got):
            return [f"{where}: keys {sorted(want)} != {sorted(got)}"]
        return [d for k in want for d in differences(want[k], got[k], f"{where}/{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: length {len(want)} != {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(want, got))
                for d in differences(a, b, f"{where}[{i}]")]
    fa, fb = _float(want), _float(got)
    if fa is not None and fb is not None and type(want) is type(got):
        return [] if _close(fa, fb) else [f"{where}: {want!r} != {got!r}"]
    if type(want) is not type(got) or want != got:
        return [f"{where}: {want!r} != {got!r}"]
    return []


def _parsed(rel, text):
    return list(csv.reader(io.StringIO(text))) if rel.endswith(".csv") else json.loads(text)


@pytest.mark.parametrize("run", RUNS)
def test_check_writes_the_golden_files(run, tmp_path):
    assert main(["check", str(FIXTURES / run), "--output-dir", str(tmp_path)]) == 0
    got = _outputs(tmp_path)
    assert len(got) >= 5, sorted(got)
    golden = GOLDEN / run
    if os.environ.get("VARIANTS_REGENERATE_GOLDEN"):
        shutil.rmtree(golden, ignore_errors=True)
        for rel, text in got.items():
            (golden / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden / rel).write_text(text)
    want = {p.relative_to(golden).as_posix(): p.read_text()
            for p in sorted(golden.rglob("*")) if p.is_file()}
    assert sorted(got) == sorted(want)
    differ = [d for rel in want for d in differences(_parsed(rel, want[rel]),
                                                     _parsed(rel, got[rel]), f"{run}/{rel}")]
    assert not differ, f"{len(differ)} values differ from the golden:\n" + "\n".join(differ[:20])


def test_the_comparison_catches_what_matters():
    """The tolerance lets the SIMD paths' round-off through and nothing else: a verdict, a
    count, a key, a float moved by 1e-8 relative, a CSV cell."""
    want = {"verdict": "PASS", "n": 40, "ok": True, "x": 0.14811914905428347, "tiny": 1.79e-08,
            "rows": [1.0, float("nan")]}
    assert differences(want, json.loads(json.dumps(want))) == []
    # the largest differences measured between NumPy's AVX-512 and AVX2 paths pass
    assert differences(want, {**want, "x": 0.14811914910515542, "tiny": 1.79e-08 + 2.2e-16}) == []
    for k, v in [("verdict", "FAIL"), ("n", 41), ("ok", False), ("x", 0.14811914905428347 * (1 + 1e-8)),
                 ("tiny", 1.8e-08), ("rows", [1.0, 0.0]), ("n", 40.0)]:
        assert differences(want, {**want, k: v}), k
    assert differences({**want, "extra": 1}, want)
    csv_want = [["variant", "agreement", "n"], ["q8-g64", "0.975", "40"]]
    assert differences(csv_want, [["variant", "agreement", "n"], ["q8-g64", "0.9750000000001", "40"]]) == []
    assert differences(csv_want, [["variant", "agreement", "n"], ["q8-g64", "0.976", "40"]])
    assert differences(csv_want, [["variant", "agreement", "n"], ["q8-g64", "0.975", "40.0"]])
    assert differences(csv_want, [["variant", "agreement", "n"], ["q4-g64", "0.975", "40"]])

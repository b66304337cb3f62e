"""Identical results across refactors (issue 15): ``variants check`` on the saved fixture runs
(one per family) writes the same ``report.json``, ``verdict.json``, ``metrics.json``,
``summary.csv`` and ``check.json`` as when the goldens were made: their SHA-256 digests are in
``tests/fixtures/golden_check.json`` (to see a difference, run ``variants check FIXTURE
--output-dir A`` at the golden's commit and at yours, and diff A and B).

Byte-identical, except ``check.json``'s ``run`` (the path the command was given). Nothing else is
excluded: these files hold no timestamps or wall times (the run's own timing lives in
``timing.json``/``run.json``, which ``check`` only reads).

A change that is *meant* to change these numbers regenerates the goldens and says why in its
commit: ``VARIANTS_REGENERATE_GOLDEN=1 python -m pytest tests/test_identical_results.py``.
"""

import hashlib
import json
import os
from pathlib import Path

import pytest

from variants.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden_check.json"
#: the saved runs: quant (two models), lowrank, prune, exit
RUNS = ["sweep_small", "sweep_small_choice", "sweep_small_lowrank", "sweep_small_prune",
        "sweep_small_exit"]
FILES = ("report.json", "verdict.json", "metrics.json")


def _outputs(folder):
    """{relative path: bytes} of the files compared (check.json without ``run``)."""
    folder = Path(folder)
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.name in FILES or rel == "summary.csv":
            out[rel] = p.read_bytes()
        elif rel == "check.json":
            d = json.loads(p.read_text())
            d.pop("run", None)
            out[rel] = json.dumps(d, indent=2, sort_keys=True).encode()
    return out


@pytest.mark.parametrize("run", RUNS)
def test_check_writes_the_golden_files(run, tmp_path):
    assert main(["check", str(FIXTURES / run), "--output-dir", str(tmp_path)]) == 0
    got = _outputs(tmp_path)
    assert len(got) >= 5, sorted(got)
    digests = {rel: hashlib.sha256(blob).hexdigest() for rel, blob in got.items()}
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("VARIANTS_REGENERATE_GOLDEN"):
        golden[run] = digests
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    want = golden[run]
    assert sorted(digests) == sorted(want)
    differ = [rel for rel in want if digests[rel] != want[rel]]
    assert not differ, f"{run}: {differ} differ from the golden"

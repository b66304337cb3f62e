"""The CLI routes each verb lazily: `variants check`, `list` and `plot --help` run in a
fresh interpreter without importing MLX (only `sweep` loads the model side); the family registry
and every family's flags, ladder and report lines are readable without MLX too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "sweep_small"

PROBE = """
import json, sys
from variants.cli import main
try:
    code = main({argv!r})
except SystemExit as e:  # --help exits 0 through argparse
    code = e.code
print(json.dumps({{"code": code, "mlx": sorted(m for m in sys.modules
                                              if m == "mlx" or m.startswith("mlx."))}}))
"""


def _run(argv):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["list"], ["plot", "--help"], ["check", "--help"],
                                  ["selftest", "--help"]])
def test_reading_verbs_import_no_mlx(argv):
    out, res = _run(argv)
    assert res == {"code": 0, "mlx": []}
    if argv == ["list"]:
        assert "families: quant, lowrank, prune, exit" in out
        assert "minilm-sentiment" in out


def test_check_on_a_saved_run_imports_no_mlx(tmp_path):
    out, res = _run(["check", str(FIXTURE), "--output-dir", str(tmp_path)])
    assert res == {"code": 0, "mlx": []}
    assert (tmp_path / "report.md").exists() and (tmp_path / "summary.csv").exists()


def test_sweep_help_lists_every_family_flag_group():
    """The sweep verb (which may load MLX) still gets every family's flag group."""
    out, res = _run(["sweep", "--help"])
    assert res["code"] == 0
    for group in ("quant family", "lowrank family", "prune family", "exit family",
                  "exact family", "w8a8 family"):
        assert group in out


def test_families_read_without_mlx():
    """Registry, configs, ladders and describe() of every family: a fresh interpreter, no MLX."""
    code = """
import json, sys
from variants.families import FAMILIES, get_family
fams = {n: get_family(n) for n in FAMILIES}
ladders = {n: [c.name for c in f.ladder()] for n, f in fams.items()}
text = fams["prune"].describe({"schedule": [[2, 0.5]], "score": "received",
    "protected_tokens": ["[CLS]", "[SEP]"], "n_layers": 6, "work_ratio": 0.5833,
    "ideal_speedup": 1.714}, None)
print(json.dumps({"names": list(fams), "ladders": ladders, "quant": fams["quant"].describe({}, None),
                  "prune": text, "mlx": any(m == "mlx" or m.startswith("mlx.") for m in sys.modules)}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["mlx"] is False
    assert res["names"] == ["quant", "lowrank", "prune", "exit", "student", "exact", "w8a8",
                            "composed", "onnx"]
    assert res["ladders"]["w8a8"] == ["w8a8", "w8a8-sq"]
    assert res["ladders"]["student"][0] == "student-l1-entropy-ag0.99"
    assert res["ladders"]["exact"] == ["dedup", "cache-4096"]
    assert res["ladders"]["quant"] == ["q2-g64", "q3-g64", "q4-g64", "q6-g64", "q8-g64"]
    assert res["ladders"]["prune"][0] == "prune-a1-r0.70"
    assert res["quant"] is None  # quant has nothing to add to the report
    # a/N + (1 - a/N)·ρ = 2/6 + 4/6 · 0.5 = 0.5833 (given), shown to 3 decimals
    assert res["prune"].startswith("- pruning: after layer 2 keep 0.50 of each text's real tokens")
    assert "work ratio 0.583 → ideal speed-up 1.71×" in res["prune"]

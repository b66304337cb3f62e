"""bench/modernbert_window.py: the slope fit and the A/B timing on known inputs, and one tiny
run of the whole benchmark (the table and the slopes are printed)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import modernbert_window as bench  # noqa: E402


def test_slope_recovers_known_exponents():
    L = [512, 1024, 2048]
    assert bench.slope(L, [3e-3 * n for n in L]) == pytest.approx(1.0)
    assert bench.slope(L, [1e-7 * n * n for n in L]) == pytest.approx(2.0)
    assert bench.slope([1, 2, 4], [1.0, 3.0, 4.0]) == pytest.approx(1.0, abs=1e-9)  # lsq: 2/2


def test_ab_alternates_and_takes_medians():
    calls = []
    out = bench.ab({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then a b / b a / a b
    assert set(out) == {"a", "b"} and all(v >= 0 for v in out.values())


def test_a_tiny_run_prints_the_table_and_slopes(capsys):
    bench.main(["--lengths", "16", "32", "64", "--layers", "2", "--rounds", "1",
                "--forward-rounds", "1", "--slope-from", "16", "--crossover"])
    out = capsys.readouterr().out
    assert "B=1" in out and "slope of log(time) over log(L), L in [16, 32, 64]" in out
    rows = [line for line in out.splitlines() if line.strip().split(" ")[0] in ("16", "32", "64")]
    assert len(rows) == 3

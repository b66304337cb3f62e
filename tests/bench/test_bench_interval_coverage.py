"""bench/interval_coverage.py: its enumerations against direct sums over every table, and the
table on a tiny grid."""

import sys
from itertools import product
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom, multinomial

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import interval_coverage as ic  # noqa: E402

from metrics.intervals import clopper_pearson  # noqa: E402
from metrics.paired import newcombe_paired_interval, tango_intervals  # noqa: E402


def test_paired_coverage_equals_the_sum_over_every_table():
    """n = 30: every (b, c) with b + c <= 30, weighted by the trinomial pmf."""
    n, p10, p01 = 30, 0.1, 0.05
    b, c = np.array([t for t in product(range(n + 1), repeat=2) if sum(t) <= n]).T
    pr = multinomial.pmf(np.stack([b, c, n - b - c], 1), n, [p10, p01, 1 - p10 - p01])
    low, high = tango_intervals(b, c, n)
    cov = pr @ ((low <= p10 - p01) & (p10 - p01 <= high))
    width, passes = pr @ (high - low), pr @ (high <= 0.2)
    r = ic.paired_coverage("tango", n, p10, p01, threshold=0.2)
    assert r["coverage"] == pytest.approx(cov, abs=1e-10)
    assert r["width"] == pytest.approx(width, abs=1e-10)
    assert r["pass"] == pytest.approx(passes, abs=1e-10)


def test_newcombe_coverage_equals_the_sum_over_every_four_cell_table():
    """n = 25, reference accuracy 0.8: (a, b, c, d) ~ Multinomial(25; 0.7, 0.1, 0.05, 0.15)."""
    n, probs = 25, [0.7, 0.1, 0.05, 0.15]
    cov = width = 0.0
    for a, b, c in product(range(n + 1), repeat=3):
        if a + b + c <= n:
            pr = multinomial.pmf([a, b, c, n - a - b - c], n, probs)
            low, high = newcombe_paired_interval(b, c, n, a=a)
            cov += pr * (low <= 0.05 <= high)
            width += pr * (high - low)
    r = ic.paired_coverage("newcombe", n, 0.1, 0.05, reference_accuracy=0.8)
    assert r["coverage"] == pytest.approx(cov, abs=1e-9)
    assert r["width"] == pytest.approx(width, abs=1e-9)


def test_rate_coverage_equals_the_sum_over_every_count():
    n, p = 40, 0.1
    k = np.arange(n + 1)
    ends = np.array([clopper_pearson(int(x), n) for x in k])
    want = binom.pmf(k, n, p) @ ((ends[:, 0] <= p) & (p <= ends[:, 1]))
    assert ic.rate_coverage(n, p)["coverage"] == pytest.approx(want, abs=1e-10)


def test_table_runs_on_a_tiny_grid():
    rows = ic.table(bootstrap_reps=5, n_boot=50, sizes=(50,), rates=(0.1,),
                    discordant=((0.1, 0.05),), bootstrap_sizes=(30,))
    assert [r["method"] for r in rows] == ["clopper-pearson", "tango", "newcombe",
                                           "cp-bonferroni", "bootstrap-percentile",
                                           "bootstrap-percentile"]
    assert rows[1]["E[b+c]"] == "7.5"
    text = ic.markdown(rows)
    assert text.count("\n") == len(rows) + 1 and text.startswith("| method | n | rates |")

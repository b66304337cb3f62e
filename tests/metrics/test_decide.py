"""Rows a clause compared on its interval needs, and the smallest violation n rows show
(metrics/decide.py, issue #38 items 2 and 7), against closed forms worked by hand."""

import math

import pytest
from scipy.stats import beta, norm

from metrics.decide import rows_to_decide, smallest_detectable
from metrics.paired import tango_interval

Z2 = norm.ppf(0.975) ** 2
CP, TANGO, BOOT = "clopper-pearson", "tango-paired-score", "bootstrap-percentile"


def test_rows_to_decide_clopper_pearson_at_zero_and_all_events():
    """0 of n: upper end 1 - 0.025^(1/n) <= 0.01 from n >= ln 0.025 / ln 0.99 = 367.04; n of n:
    lower end 0.025^(1/n) >= 0.97 from n >= ln 0.025 / ln 0.97 = 121.1."""
    assert math.log(0.025) / math.log(0.99) == pytest.approx(367.04, abs=0.01)
    assert rows_to_decide(CP, k=0, n=20, threshold=0.01, op="<=") == 368
    assert rows_to_decide(CP, k=20, n=20, threshold=0.97, op=">=") == 122
    assert rows_to_decide(CP, k=0, n=1000, threshold=0.01, op="<=") == 1000  # decided already
    assert rows_to_decide(CP, k=5, n=100, threshold=0.01, op="<=") is None  # 0.05 > 0.01
    assert rows_to_decide(CP, k=1, n=100, threshold=0.01, op="<=") is None  # 0.01: not inside


def test_rows_to_decide_clopper_pearson_with_events_is_the_first_crossing():
    """k = 3 of 1000 held (rate 0.003): the first n' whose upper end at round(0.003 n') events
    is <= 0.01, found by a linear scan with scipy's beta quantile."""
    got = rows_to_decide(CP, k=3, n=1000, threshold=0.01, op="<=")
    scan = next(m for m in range(1000, 5000)
                if beta.ppf(0.975, round(0.003 * m) + 1, m - round(0.003 * m)) <= 0.01)
    assert got == scan


def test_rows_to_decide_tango():
    """b = c = 0: upper end z^2 / (n + z^2) <= 0.01 from n >= 99 z^2 = 380.3."""
    assert 99 * Z2 == pytest.approx(380.3, abs=0.05)
    assert rows_to_decide(TANGO, b=0, c=0, n=20, threshold=0.01, op="<=") == 381
    got = rows_to_decide(TANGO, b=4, c=2, n=800, threshold=0.01, op="<=")

    def upper(m):
        return tango_interval(round(4 / 800 * m), round(2 / 800 * m), m)[1]
    assert upper(got) <= 0.01 < upper(got - 1)
    assert all(upper(m) > 0.01 for m in range(800, got))  # no earlier crossing
    assert rows_to_decide(TANGO, b=12, c=2, n=800, threshold=0.01, op="<=") is None  # 0.0125


def test_rows_to_decide_bootstrap_scales_the_half_width():
    """value 0.005, half-width 0.01 on 100 rows: 0.01 sqrt(100/n') <= 0.005 from n' = 400."""
    assert rows_to_decide(BOOT, value=0.005, half_width=0.01, n=100, threshold=0.01,
                          op="<=") == 400
    assert rows_to_decide(BOOT, value=0.98, half_width=0.02, n=100, threshold=0.97,
                          op=">=") == 400
    assert rows_to_decide(BOOT, value=0.02, half_width=0.01, n=100, threshold=0.01,
                          op="<=") is None


def test_smallest_detectable_clopper_pearson():
    """n = 100, max 0.01: the lower end first exceeds 0.01 at k = 4 (Beta.ppf(0.025; 4, 97));
    min 0.97: the upper end Beta.ppf(0.975; k + 1, n - k) is last below it at k = 92."""
    assert beta.ppf(0.025, 3, 98) <= 0.01 < beta.ppf(0.025, 4, 97)
    assert smallest_detectable(CP, 100, threshold=0.01, op="<=") == pytest.approx(0.03, abs=1e-12)
    assert beta.ppf(0.975, 93, 8) < 0.97 <= beta.ppf(0.975, 94, 7)
    assert smallest_detectable(CP, 100, threshold=0.97, op=">=") == pytest.approx(0.05, abs=1e-12)
    assert smallest_detectable(CP, 100, threshold=1.0, op="<=") is None


def test_smallest_detectable_tango_holds_the_other_count():
    """c = 0 of 800, max 0.01: past b / (2n - b) Tango's lower end is Wilson's, (b + z^2/2 -
    z sqrt(b (n - b)/n + z^2/4)) / (n + z^2): 0.00952 at b = 13, 0.01045 at b = 14, so the
    violation shown is 14/800 - 0.01 = 0.0075."""
    def wilson_low(b, n=800):
        return (b + Z2 / 2 - math.sqrt(Z2) * math.sqrt(b * (n - b) / n + Z2 / 4)) / (n + Z2)
    assert round(wilson_low(13), 5) == 0.00952 and round(wilson_low(14), 5) == 0.01045
    assert smallest_detectable(TANGO, 800, threshold=0.01, op="<=", c=0) == pytest.approx(0.0075)
    # positive flips held at 4: the smallest b whose lower end clears 0.01, by a linear scan
    b = next(b for b in range(4, 796) if tango_interval(b, 4, 800)[0] > 0.01)
    assert smallest_detectable(TANGO, 800, threshold=0.01, op="<=", c=4) == pytest.approx(
        (b - 4) / 800 - 0.01)
    # a min clause on the difference mirrors it: b = 0 held, c grows
    assert smallest_detectable(TANGO, 800, threshold=-0.01, op=">=", b=0) == pytest.approx(0.0075)


def test_smallest_detectable_bootstrap_is_its_half_width():
    assert smallest_detectable(BOOT, 800, threshold=0.5, op="<=", half_width=0.03) == 0.03


@pytest.mark.parametrize("call, msg", [
    (lambda: rows_to_decide("wald", k=0, n=20, threshold=0.01, op="<="), "method must be"),
    (lambda: rows_to_decide(CP, k=0, n=20, threshold=0.01, op="<"), "op must be"),
    (lambda: rows_to_decide(CP, k=0, n=0, threshold=0.01, op="<="), "n must be"),
    (lambda: rows_to_decide(CP, n=20, threshold=0.01, op="<="), "k is required"),
    (lambda: rows_to_decide(TANGO, b=1, n=20, threshold=0.01, op="<="), "c is required"),
    (lambda: rows_to_decide(TANGO, b=15, c=10, n=20, threshold=0.01, op="<="), r"b \+ c <= n"),
    (lambda: rows_to_decide(BOOT, value=0.0, n=20, threshold=0.01, op="<="),
     "half_width is required"),
    (lambda: smallest_detectable(TANGO, 20, threshold=0.01, op="<="), "c is required"),
    (lambda: smallest_detectable(TANGO, 20, threshold=0.01, op=">=", b=30), "0 <= b <= n"),
    (lambda: smallest_detectable(CP, 20, threshold=0.01, op="<=", confidence=0), "confidence"),
])
def test_bad_arguments_say_what_is_wrong(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()

"""Equal-mass (quantile) ECE bins by value: tied confidences share one bin, so the result is a
function of the multiset of (confidence, hit) pairs, not of the rows' order.

Splitting the sorted rows by position put copies of one confidence into neighbouring bins by
where they happened to stand: 100 rows all at 0.8, 50 of them right, gave 0.496 in one order and
0.30-0.33 in others; the same data in one bin is |0.5 - 0.8| = 0.3 in any order (as equal-width
bins give). Float sums inside a bin may add in another order after a shuffle, hence the 1e-12.
"""

import numpy as np
import pytest

from metrics.calibration import calibration_error, reliability_diagram
from metrics.set_metrics import ece_binned, ece_mass_sorted, equal_mass_bins

N_BINS = 15


def _two_option(conf, hit):
    """(probs, labels, mask) of two-option rows whose top option (0) has ``conf`` and is the
    label where ``hit``."""
    conf = np.asarray(conf, dtype=np.float64)
    probs = np.stack([conf, 1.0 - conf], axis=1)
    return probs, np.where(np.asarray(hit, bool), 0, 1), np.ones(probs.shape, bool)


def _all_paths(conf, hit, n_bins):
    """Equal-mass ECE of one set by the three code paths: the one-set function, the set metric's
    point value and its bootstrap arithmetic (on the identity resample)."""
    conf, hit = np.asarray(conf, np.float64), np.asarray(hit, np.float64)
    one = calibration_error(*_two_option(conf, hit), n_bins=n_bins, strategy="quantile")
    point = ece_binned(conf[None], hit[None], equal_mass_bins(conf[None], n_bins), n_bins)[0]
    boot = ece_mass_sorted(conf, hit, np.arange(conf.size)[None], n_bins)[0]
    return one, point, boot


@pytest.mark.parametrize("seed", [None, 0, 1, 2, 3, 4, 5, 6, 7])
def test_all_tied_is_one_bin_in_any_order(seed):
    """100 rows at confidence 0.8, 50 right: one bin, |0.5 - 0.8| = 0.3, sorted or shuffled."""
    hit = np.r_[np.zeros(50), np.ones(50)]  # sorted: the wrong ones first
    if seed is not None:
        hit = np.random.default_rng(seed).permutation(hit)
    conf = np.full(100, 0.8)
    for value in _all_paths(conf, hit, N_BINS):
        assert value == pytest.approx(0.3, abs=1e-12)
    d = reliability_diagram(*_two_option(conf, hit), n_bins=N_BINS, strategy="quantile")
    assert d["count"].tolist() == [100] + [0] * 14
    assert d["lower"][0] == d["upper"][0] == 0.8


@pytest.mark.parametrize("swap", [False, True])
def test_a_tie_across_a_bin_edge_goes_with_its_first_copy(swap):
    """Confidences 0.6, 0.7, 0.7, 0.9 in 2 bins: by position the edge falls between the two 0.7s
    (0.225 or 0.425 depending on which stands first); by value both join the first bin:
    bin 1 {0.6, 0.7, 0.7} accuracy 1/3, confidence 2/3 -> 3/4 * 1/3 = 0.25; bin 2 {0.9}
    accuracy 1 -> 1/4 * 0.1 = 0.025; ECE 0.275 either way."""
    conf = [0.6, 0.7, 0.7, 0.9]
    hit = [0, 0, 1, 1] if swap else [0, 1, 0, 1]
    for value in _all_paths(conf, hit, 2):
        assert value == pytest.approx(0.275, abs=1e-12)
    d = reliability_diagram(*_two_option(conf, hit), n_bins=2, strategy="quantile")
    assert d["count"].tolist() == [3, 1]
    np.testing.assert_allclose(d["accuracy"], [1 / 3, 1.0], rtol=1e-12)


def test_untied_rows_keep_equal_mass_bins():
    """Distinct confidences still split as numpy.array_split: 40 rows in 15 bins hold 3 (ten
    bins) and 2 (five bins)."""
    conf = np.linspace(0.5, 0.99, 40)
    hit = (np.arange(40) % 3 == 0).astype(float)
    d = reliability_diagram(*_two_option(conf, hit), n_bins=N_BINS, strategy="quantile")
    assert d["count"].tolist() == [3] * 10 + [2] * 5


def test_a_function_of_the_multiset():
    """Many ties (confidences rounded to 0.05): every shuffle, and every resample that is a
    permutation, gives the same ECE by every path, and equal to the one-set function."""
    rng = np.random.default_rng(11)
    conf = np.round(rng.uniform(0.5, 1.0, 300) / 0.05) * 0.05
    hit = (rng.uniform(size=300) < conf).astype(float)
    want = _all_paths(conf, hit, N_BINS)
    assert want[0] == pytest.approx(want[1], abs=1e-12) and want[0] == pytest.approx(want[2], abs=1e-12)
    perms = np.stack([rng.permutation(300) for _ in range(20)])
    for p in perms:
        assert _all_paths(conf[p], hit[p], N_BINS) == pytest.approx(want, abs=1e-12)
    # the bootstrap arithmetic on permuted index rows of one set: one value
    np.testing.assert_allclose(ece_mass_sorted(conf, hit, perms, N_BINS), want[2], rtol=0, atol=1e-12)
    point = ece_binned(conf[perms], hit[perms], equal_mass_bins(conf[perms], N_BINS), N_BINS)
    np.testing.assert_allclose(point, want[1], rtol=0, atol=1e-12)

"""``kl_divergence`` judges only distributions: hand-computed values, scipy as the independent
implementation, ``inf`` where the variant has no mass and the reference has, and one-line
refusals (the argument, the row, the fix) of what is not a distribution. The renormalising
behaviour is the named ``normalize=True``; the floor the named ``floor=``."""

import numpy as np
import pytest
from scipy.special import rel_entr
from scipy.stats import entropy

from metrics.divergence import PROB_FLOOR, kl_divergence

TWO = np.ones((1, 2), bool)


@pytest.mark.parametrize("p, q, expected", [
    # .5 ln(.5/.3) + .5 ln(.5/.7) = 0.0872
    ([.5, .5], [.3, .7], 0.5 * np.log(0.5 / 0.3) + 0.5 * np.log(0.5 / 0.7)),
    ([.5, .5], [.25, .75], 0.5 * np.log(4 / 3)),
    ([.9, .1], [.5, .5], 0.9 * np.log(1.8) + 0.1 * np.log(0.2)),
    ([1., 0.], [.5, .5], np.log(2)),  # 0 log 0 = 0
    ([.2, .3, .5], [.2, .3, .5], 0.0),
])
def test_kl_hand_computed_and_as_scipy(p, q, expected):
    mask = np.ones((1, len(p)), bool)
    kl = kl_divergence([p], [q], mask)[0]
    assert kl == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert kl == pytest.approx(rel_entr(p, q).sum(), rel=1e-12, abs=1e-15)
    assert kl == pytest.approx(entropy(p, q), rel=1e-12, abs=1e-15)


def test_a_zero_in_q_where_p_has_mass_is_infinite():
    assert kl_divergence([[.5, .5]], [[1., 0.]], TWO)[0] == np.inf
    assert entropy([.5, .5], [1., 0.]) == np.inf  # as scipy says
    # the named floor keeps it finite: q -> [1, 1e-12], renormalised
    floored = kl_divergence([[.5, .5]], [[1., 0.]], TWO, floor=PROB_FLOOR)[0]
    assert floored == pytest.approx(0.5 * np.log(0.5) + 0.5 * np.log(0.5 / 1e-12), rel=1e-9)
    # zero reference mass where the variant has mass costs nothing
    assert kl_divergence([[1., 0.]], [[1., 0.]], TWO)[0] == 0.0


def test_float32_softmax_rows_are_accepted_as_distributions():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(200, 7)) * 5
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    q = np.exp(z + rng.normal(size=z.shape)) / np.exp(z + rng.normal(size=z.shape)).sum(
        axis=1, keepdims=True)
    q = q / q.sum(axis=1, keepdims=True)
    p32, q32 = p.astype(np.float32), q.astype(np.float32)
    assert np.abs(p32.sum(axis=1, dtype=np.float64) - 1).max() > 0  # not exactly 1
    kl = kl_divergence(p32, q32, np.ones(z.shape, bool))
    expected = [entropy(a, b) for a, b in zip(p32.astype(np.float64), q32.astype(np.float64))]
    np.testing.assert_allclose(kl, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("p, q, says", [
    ([[.5, .5]], [[.3, .3]], "p_var row 0 sums to 0.6 over its valid options, not 1"),
    ([[.5, .5], [.3, .3]], [[.5, .5], [.5, .5]], "p_ref row 1 sums to 0.6"),
    ([[1.5, -.5]], [[.5, .5]], "p_ref row 0 has a negative value"),
    ([[.5, .5]], [[np.nan, 1.]], "p_var row 0 has NaN"),
    ([[.5, .5]], [[.5, .5 + 1e-3]], "p_var row 0 sums to 1.001"),
    ([[2., 2.]], [[.5, .5]], "p_ref row 0 sums to 4"),
])
def test_what_is_not_a_distribution_is_refused_in_one_line(p, q, says):
    with pytest.raises(ValueError) as e:
        kl_divergence(p, q, np.ones(np.shape(p), bool))
    msg = str(e.value)
    assert says in msg and "\n" not in msg, msg
    assert "pass probabilities" in msg


def test_normalize_is_the_named_renormalising_option():
    # the old behaviour, asked for by name: [.3, .3] is read as [.5, .5]
    assert kl_divergence([[.5, .5]], [[.3, .3]], TWO, normalize=True)[0] == 0.0
    assert kl_divergence([[.5, .5]], [[.3, .7]], TWO, normalize=True)[0] == pytest.approx(
        entropy([.5, .5], [.3, .7]), rel=1e-12)
    with pytest.raises(ValueError, match="p_var row 0 has no mass on its valid options"):
        kl_divergence([[.5, .5]], [[0., 0.]], TWO, normalize=True)


def test_padded_entries_outside_the_mask_are_not_part_of_the_distribution():
    p = np.array([[0.5, 0.5, 0.0]])
    q = np.array([[0.25, 0.75, 0.7]])  # 0.7 is a padded entry: ignored
    mask = np.array([[True, True, False]])
    assert kl_divergence(p, q, mask)[0] == pytest.approx(0.5 * np.log(4 / 3), rel=1e-12)

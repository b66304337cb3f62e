"""Human near-ties: items whose raters split between their two most chosen options.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; a smaller
``human_top2_gap`` is a more contested item.
"""

import numpy as np

from metrics._checks import check_mask
from metrics.defaults import HUMAN_TIE_GAP


def human_top2_gap(human_dist, option_mask):
    """Share of raters on the most chosen option minus the share on the second, per example.

    Parameters
    ----------
    human_dist : array-like of shape (N, K), float
        Share of raters per option (rows sum to 1 over valid options); NaN where no raters.
    option_mask : array-like of shape (N, K), bool

    Returns
    -------
    gap : ndarray of shape (N,), float64
        In [0, 1]; NaN for a row without raters; 1 for a single-option row.
    """
    h = np.asarray(human_dist, dtype=np.float64)
    mask = check_mask(option_mask, h.shape)
    rated = ~np.isnan(np.where(mask, h, 0.0)).any(axis=1) & (np.nansum(np.where(mask, h, 0.0), axis=1) > 0)
    z = np.where(mask, np.nan_to_num(h, nan=0.0), -np.inf)
    top = -np.sort(-z, axis=1)
    second = top[:, 1] if h.shape[1] > 1 else np.full(h.shape[0], -np.inf)
    gap = np.where(np.isfinite(second), top[:, 0] - second, 1.0)
    return np.where(rated, gap, np.nan)


def human_near_tie(gap, *, tie_gap=HUMAN_TIE_GAP):
    """Items whose raters split: ``gap <= tie_gap`` (False where there are no raters).

    Parameters
    ----------
    gap : array-like of shape (N,), float
        :func:`human_top2_gap`.
    tie_gap : float, default=HUMAN_TIE_GAP (0.2, :mod:`metrics.defaults`)
        In [0, 1].

    References
    ----------
    The human-disagreement strata of B. Plank, "The 'Problem' of Human Label Variation",
    EMNLP 2022; VADER's ratings: C. Hutto and E. Gilbert, ICWSM 2014.
    """
    if not 0.0 <= tie_gap <= 1.0:
        raise ValueError(f"tie_gap must be in [0, 1], got {tie_gap}.")
    g = np.asarray(gap, dtype=np.float64)
    return ~np.isnan(g) & (np.nan_to_num(g, nan=2.0) <= tie_gap)

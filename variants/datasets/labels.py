"""Labels of the VADER items: the corpus' domains and rating scale, sentiment classes binned
from the mean human rating, the raters' distribution over the same bins, the domain index.
NumPy only; the corpus reader is :mod:`variants.datasets.bundled`.

References
----------
.. [1] C.J. Hutto and E. Gilbert, "VADER: A Parsimonious Rule-based Model for Sentiment Analysis
   of Social Media Text", ICWSM 2014, Sec. "Ground Truth in Multiple Domain Contexts".
"""

from __future__ import annotations

import numpy as np

# domain -> file stem in the VADER release; the order here is the order of DOMAINS and of rows
# (one table, shared with the reports' text lookup in runs.texts)
from runs.texts import VADER_CORPORA  # noqa: E402
DOMAINS = tuple(VADER_CORPORA)
RATING_MIN, RATING_MAX = -4, 4

# Full bin edges on the rating scale [-4, 4]. Interior edges <= 0 belong to the bin above them
# ([a, b) below zero), interior edges > 0 to the bin below them ((a, b] above zero), so the
# neutral bin [-0.5, 0.5] is closed and the bins are symmetric; for 2 classes 0 is positive.
SENTIMENT_BINS = {
    2: (-4.0, 0.0, 4.0),
    3: (-4.0, -0.5, 0.5, 4.0),
    5: (-4.0, -2.0, -0.5, 0.5, 2.0, 4.0),
}
SENTIMENT_OPTIONS = {
    2: ("negative", "positive"),
    3: ("negative", "neutral", "positive"),
    5: ("very negative", "negative", "neutral", "positive", "very positive"),
}


def _domain_order(domain: str) -> tuple[int, str]:
    return (DOMAINS.index(domain) if domain in DOMAINS else len(DOMAINS), str(domain))


def _check_n_classes(n_classes: int) -> tuple[float, ...]:
    if n_classes not in SENTIMENT_BINS:
        raise ValueError(
            f"n_classes must be one of {sorted(SENTIMENT_BINS)}, got {n_classes!r}."
        )
    return SENTIMENT_BINS[n_classes]


def _bin(values: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    """Class index of each value: edges <= 0 open upward ([a, b)), edges > 0 downward ((a, b])."""
    label = np.zeros(values.shape, dtype=np.int64)
    for edge in edges[1:-1]:
        label += (values >= edge) if edge <= 0 else (values > edge)
    return label


def sentiment_label(mean_rating, n_classes: int) -> np.ndarray:
    """Sentiment class of each mean rating, binned by ``SENTIMENT_BINS[n_classes]``.

    Bins (names in ``SENTIMENT_OPTIONS[n_classes]``):

    - 2: negative ``< 0``, positive ``>= 0`` (an exact 0 counts as positive).
    - 3: negative ``< -0.5``, neutral ``[-0.5, 0.5]``, positive ``> 0.5``.
    - 5: very negative ``[-4, -2)``, negative ``[-2, -0.5)``, neutral ``[-0.5, 0.5]``,
      positive ``(0.5, 2]``, very positive ``(2, 4]``.

    Parameters
    ----------
    mean_rating : array-like of float of shape (n_items,)
        Ratings on the VADER scale [-4, 4].
    n_classes : {2, 3, 5}

    Returns
    -------
    labels : ndarray of int64 of shape (n_items,), values in ``0..n_classes-1``.

    Raises
    ------
    ValueError
        If ``n_classes`` is not 2, 3 or 5, or a rating is not finite or outside [-4, 4].

    Examples
    --------
    >>> sentiment_label([-2.0, -0.5, 0.0, 0.51, 2.01], 5).tolist()
    [1, 2, 2, 3, 4]
    """
    edges = _check_n_classes(n_classes)
    values = np.asarray(mean_rating, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"mean_rating must be 1-D, got shape {values.shape}.")
    if not np.all((values >= RATING_MIN) & (values <= RATING_MAX)):
        raise ValueError("mean_rating has values outside [-4, 4] (or NaN).")
    return _bin(values, edges)


def rater_distribution(rater_scores, n_classes: int) -> np.ndarray:
    """Share of each item's raters in each sentiment class, with the bins of `sentiment_label`.

    Parameters
    ----------
    rater_scores : sequence of sequence of int, length n_items
        Each item's rater scores, integers in -4..4 (the ``rater_scores`` column).
    n_classes : {2, 3, 5}

    Returns
    -------
    distribution : ndarray of float32 of shape (n_items, n_classes)
        Rows sum to 1. With integer scores: 3 classes put 0 in neutral; 5 classes map
        -4,-3 / -2,-1 / 0 / 1,2 / 3,4 to the five classes; 2 classes put 0 in positive.

    Raises
    ------
    ValueError
        If ``n_classes`` is not 2, 3 or 5, an item has no scores, or a score is not an
        integer in -4..4.

    Examples
    --------
    >>> rater_distribution([(-1, 0, 0, 3)], 3).tolist()
    [[0.25, 0.5, 0.25]]
    """
    edges = _check_n_classes(n_classes)
    lengths = np.fromiter((len(s) for s in rater_scores), dtype=np.int64)
    if lengths.size and lengths.min() == 0:
        raise ValueError(
            f"rater_scores item {int(np.argmin(lengths))} is empty; every item needs raters."
        )
    flat = np.asarray(
        [score for scores in rater_scores for score in scores], dtype=np.float64
    )
    if not np.all(np.isin(flat, np.arange(RATING_MIN, RATING_MAX + 1))):
        raise ValueError("rater_scores has values that are not integers in -4..4.")
    counts = np.zeros((lengths.size, n_classes), dtype=np.float64)
    rows = np.repeat(np.arange(lengths.size), lengths)
    np.add.at(counts, (rows, _bin(flat, edges)), 1.0)
    return (counts / np.maximum(lengths, 1)[:, None]).astype(np.float32)


def domain_label(domain) -> np.ndarray:
    """Index of each domain in ``DOMAINS`` (the 4-option domain task; no rater distribution).

    Parameters
    ----------
    domain : array-like of str of shape (n_items,)

    Returns
    -------
    labels : ndarray of int64 of shape (n_items,), values in 0..3.

    Raises
    ------
    ValueError
        If a value is not one of ``DOMAINS``.
    """
    values = np.asarray(domain, dtype=object)
    lookup = {name: i for i, name in enumerate(DOMAINS)}
    unknown = sorted({str(v) for v in values if v not in lookup})
    if unknown:
        raise ValueError(f"domain has values {unknown[:5]} not in DOMAINS {DOMAINS}.")
    return np.fromiter((lookup[v] for v in values), dtype=np.int64, count=values.size)

"""Labeled accuracy of top-1 predictions.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``accuracy`` is higher-is-better.
"""

import numpy as np

from metrics._checks import check_1d, check_labels


def correct(pred, labels):
    """Whether each prediction equals its label (False where the label is unknown).

    Parameters
    ----------
    pred : array-like of shape (N,), int
    labels : array-like of shape (N,), int
        Gold option index; negative (-1) = unknown.

    Returns
    -------
    is_correct : ndarray of shape (N,), bool

    Raises
    ------
    ValueError
        If the inputs are not 1-D of equal length or ``labels`` are not integers.
    """
    pred = check_1d(pred, name="pred").astype(np.int64)
    labels = check_labels(labels, pred.shape[0])
    return (labels >= 0) & (pred == labels)


def accuracy(pred, labels):
    """Share of labeled examples whose prediction equals the label.

    Parameters
    ----------
    pred : array-like of shape (N,), int
    labels : array-like of shape (N,), int
        Gold option index; negative (-1) = unknown, excluded from numerator and denominator.

    Returns
    -------
    accuracy : float
        In [0, 1]; NaN when no example is labeled. Higher is better.

    Raises
    ------
    ValueError
        As :func:`correct`.

    See Also
    --------
    sklearn.metrics.accuracy_score : the same on the labeled rows.
    """
    is_correct = correct(pred, labels)
    known = np.asarray(labels) >= 0
    if not known.any():
        return float("nan")
    return float(is_correct[known].mean())

"""Top-1 predictions and prediction flips between a reference and a variant.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; ``agreement``
is higher-is-better and every ``*flip`` is lower-is-better (except ``positive_flip``, a gain).
"""

import numpy as np

from metrics._checks import check_1d, check_labels, check_mask


def _check_preds(ref_pred, var_pred):
    ref_pred = check_1d(ref_pred, name="ref_pred")
    var_pred = check_1d(var_pred, name="var_pred", n=ref_pred.shape[0])
    return ref_pred.astype(np.int64), var_pred.astype(np.int64)


def top1(logits, option_mask):
    """Index of the largest logit among each example's valid options.

    Parameters
    ----------
    logits : array-like of shape (N, K), float
        Raw logits (or probabilities: any score whose argmax is the prediction). Entries outside
        ``option_mask`` are ignored, however large.
    option_mask : array-like of shape (N, K), bool
        True for valid options; every row needs at least one.

    Returns
    -------
    pred : ndarray of shape (N,), int64
        Option index in ``[0, K)``; ties go to the lowest index (``numpy.argmax``).

    Raises
    ------
    ValueError
        If ``logits`` is not 2-D, the mask's shape or dtype differs, or a row has no valid option.

    Examples
    --------
    >>> top1([[1.0, 9.0, 2.0]], [[True, False, True]])
    array([2])
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2:
        raise ValueError(f"logits must be 2-D of shape (N, K), got shape {logits.shape}.")
    mask = check_mask(option_mask, logits.shape)
    return np.argmax(np.where(mask, logits, -np.inf), axis=1).astype(np.int64)


def agreement(ref_pred, var_pred):
    """Whether the variant's top-1 option equals the reference's.

    Parameters
    ----------
    ref_pred, var_pred : array-like of shape (N,), int
        Top-1 predictions (see :func:`top1`).

    Returns
    -------
    agree : ndarray of shape (N,), bool
        Higher rate is better.

    Raises
    ------
    ValueError
        If the inputs are not 1-D of equal length.
    """
    ref_pred, var_pred = _check_preds(ref_pred, var_pred)
    return ref_pred == var_pred


def flip(ref_pred, var_pred):
    """Whether the top-1 option changed: ``not agreement(ref_pred, var_pred)``.

    Parameters
    ----------
    ref_pred, var_pred : array-like of shape (N,), int

    Returns
    -------
    flipped : ndarray of shape (N,), bool
        Lower rate is better.
    """
    return ~agreement(ref_pred, var_pred)


def negative_flip(ref_pred, var_pred, labels):
    """Examples the reference got right and the variant gets wrong.

    Parameters
    ----------
    ref_pred, var_pred : array-like of shape (N,), int
    labels : array-like of shape (N,), int
        Gold option index; negative (-1) = unknown. Unknown rows are always False.

    Returns
    -------
    negative : ndarray of shape (N,), bool
        Lower is better. The negative flip rate is its sum over the number of labeled examples.

    Raises
    ------
    ValueError
        If the inputs are not 1-D of equal length or ``labels`` are not integers.

    References
    ----------
    S. Yan et al., "Positive-Congruent Training: Towards Regression-Free Model Updates",
    CVPR 2021 (arXiv:2011.09161, 2020), Sec. 3, negative flip rate.
    """
    ref_pred, var_pred = _check_preds(ref_pred, var_pred)
    labels = check_labels(labels, ref_pred.shape[0])
    known = labels >= 0
    return known & (ref_pred == labels) & (var_pred != labels)


def positive_flip(ref_pred, var_pred, labels):
    """Examples the reference got wrong and the variant gets right (unknown labels: False).

    Parameters
    ----------
    ref_pred, var_pred : array-like of shape (N,), int
    labels : array-like of shape (N,), int
        Gold option index; negative (-1) = unknown.

    Returns
    -------
    positive : ndarray of shape (N,), bool

    See Also
    --------
    negative_flip : the regression counterpart (Yan et al. 2020).
    """
    ref_pred, var_pred = _check_preds(ref_pred, var_pred)
    labels = check_labels(labels, ref_pred.shape[0])
    known = labels >= 0
    return known & (ref_pred != labels) & (var_pred == labels)

"""Drift of the outputs beyond top-1: expected score and action probabilities.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``abs_score_error`` and ``action_max_abs_diff`` are lower-is-better, ``action_agreement`` higher.
(``abs_score_error`` is the error of the *expected score* output, not a ``*_score`` metric.)
"""

import numpy as np

from metrics._checks import check_1d, check_2d_pair


def abs_score_error(ref_expected_score, var_expected_score):
    """Absolute change of the expected score ``sum_k p_k s_k``, per example.

    Parameters
    ----------
    ref_expected_score, var_expected_score : array-like of shape (N,), float
        ``DecisionOutputs.expected_score``; NaN where the task has no option scores.

    Returns
    -------
    err : ndarray of shape (N,), float64
        ``|var - ref|``, NaN where either is NaN; lower is better.

    Raises
    ------
    ValueError
        If the inputs are not 1-D of equal length.
    """
    ref = check_1d(ref_expected_score, name="ref_expected_score", dtype=np.float64)
    var = check_1d(var_expected_score, name="var_expected_score", dtype=np.float64, n=ref.shape[0])
    return np.abs(var - ref)


def action_max_abs_diff(ref_action_probs, var_action_probs):
    """Largest absolute change of an action probability, per example.

    Parameters
    ----------
    ref_action_probs, var_action_probs : array-like of shape (N, A), float
        ``DecisionOutputs.action_probs``.

    Returns
    -------
    diff : ndarray of shape (N,), float64
        ``max_a |Δ p_a|`` in [0, 1], lower is better; NaN for every row when A = 0, and NaN
        where a row holds NaN.

    Raises
    ------
    ValueError
        If the inputs are not 2-D of equal shape.
    """
    ref, var = check_2d_pair(ref_action_probs, var_action_probs,
                             names=("ref_action_probs", "var_action_probs"))
    if ref.shape[1] == 0:
        return np.full(ref.shape[0], np.nan)
    return np.max(np.abs(var - ref), axis=1)


def action_agreement(ref_action_probs, var_action_probs):
    """Whether the most probable action is the same, per example.

    Parameters
    ----------
    ref_action_probs, var_action_probs : array-like of shape (N, A), float
        ``DecisionOutputs.action_probs``.

    Returns
    -------
    agree : ndarray of shape (N,), bool
        ``argmax_a ref == argmax_a var`` (ties to the lowest index, so rows of all zeros agree);
        True for every row when A = 0. Higher rate is better.

    Raises
    ------
    ValueError
        If the inputs are not 2-D of equal shape.
    """
    ref, var = check_2d_pair(ref_action_probs, var_action_probs,
                             names=("ref_action_probs", "var_action_probs"))
    if ref.shape[1] == 0:
        return np.ones(ref.shape[0], dtype=bool)
    return np.argmax(ref, axis=1) == np.argmax(var, axis=1)

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


def total_variation(p_ref, p_var):
    """Total variation ``0.5 Σ |p' - p|`` between two distributions per example (NaN-safe).

    Parameters
    ----------
    p_ref, p_var : array-like of shape (N, K), float
        Option or action probabilities; entries that are NaN in either are ignored.

    Returns
    -------
    tv : ndarray of shape (N,), float64
        In [0, 1], lower is better; NaN for every row when K = 0.

    References
    ----------
    D. A. Levin, Y. Peres and E. L. Wilmer, "Markov Chains and Mixing Times", 2009, Sec. 4.1.
    """
    ref, var = check_2d_pair(p_ref, p_var, names=("p_ref", "p_var"))
    if ref.shape[1] == 0:
        return np.full(ref.shape[0], np.nan)
    d = np.abs(var - ref)
    return 0.5 * np.sum(np.where(np.isnan(d), 0.0, d), axis=1)


def delta_top_prob(p_ref, p_var, option_mask):
    """Signed change of the probability of the reference's top option, ``p'_r - p_r``.

    Parameters
    ----------
    p_ref, p_var : array-like of shape (N, K), float
    option_mask : array-like of shape (N, K), bool

    Returns
    -------
    delta : ndarray of shape (N,), float64
        In [-1, 1]; negative = the variant is less sure of the reference's answer.
    """
    from metrics._checks import check_mask

    ref, var = check_2d_pair(p_ref, p_var, names=("p_ref", "p_var"))
    mask = check_mask(option_mask, ref.shape)
    r = np.argmax(np.where(mask, ref, -np.inf), axis=1)
    rows = np.arange(ref.shape[0])
    return var[rows, r] - ref[rows, r]


def confidence_drift(ref_confidence, var_confidence):
    """Absolute change of the entropy confidence ``1 - H(p)/log K``, per example.

    Returns
    -------
    drift : ndarray of shape (N,), float64
        In [0, 1], lower is better.
    """
    ref = check_1d(ref_confidence, name="ref_confidence", dtype=np.float64)
    var = check_1d(var_confidence, name="var_confidence", dtype=np.float64, n=ref.shape[0])
    return np.abs(var - ref)


#: Floor under ``log p`` in the entropy (only ``p > 0`` terms count; a term below it is < 1e-297).
LOG_FLOOR = 1e-300


def entropy_confidence(probs, option_mask):
    """Entropy confidence ``1 - H(p)/log K_i`` (1 for single-option rows), per example.

    The definition of ``DecisionOutputs.confidence`` (the evaluation uses it when saved outputs
    lack the field). ``probs`` (N, K) float, ``option_mask``
    (N, K) bool; entries off the mask are ignored. ValueError if the mask's shape differs or a row
    has no valid option.

    Returns
    -------
    confidence : ndarray of shape (N,), float64
        In [0, 1]; 1 = all mass on one option, 0 = uniform.
    """
    from metrics._checks import check_mask

    p = np.asarray(probs, dtype=np.float64)
    mask = check_mask(option_mask, p.shape)
    p = np.where(mask, p, 0.0)
    h = -np.sum(np.where(p > 0, p * np.log(np.maximum(p, LOG_FLOOR)), 0.0), axis=1)
    k = mask.sum(axis=1)
    return np.clip(np.where(k > 1, 1.0 - h / np.log(np.maximum(k, 2)), 1.0), 0.0, 1.0)

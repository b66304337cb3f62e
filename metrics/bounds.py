"""What a logit-drift bound ε implies for the probabilities, actions and scores an API exposes.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better; every
function here returns a bound or an observed drift, lower is better.

If every valid raw logit of an example moves by at most ε and probabilities are
``softmax(logits / T)``, then each scaled logit moves by at most ε/T and the log-normaliser by at
most ε/T, so for every option ``|log p'_k - log p_k| <= 2ε/T``. Everything else follows:

- ratio of any option probability, and of any sum of them (an action probability):
  ``p'/p in [exp(-2ε/T), exp(2ε/T)]``;
- total variation ``TV(p, p') = sum_k (p_k - p'_k)_+ <= sum_k p_k (1 - exp(-2ε/T)) = 1 - exp(-2ε/T)``;
- expected score ``|Σ (p' - p) s| <= TV * (max s - min s)``;
- ``KL(p || p') = Σ p log(p/p') <= 2ε/T``.

A temperature of 0.1 multiplies ε by 10 in all of these.
"""

import numpy as np

from metrics._checks import check_2d_pair, check_mask

#: Probabilities below this (float32 underflow and denormals) are compared as equal to it, so a
#: ratio of two underflowed values is 1, not noise.
TINY_PROB = 1e-30


def _scaled(epsilon, temperature):
    eps = np.asarray(epsilon, dtype=np.float64)
    t = np.asarray(temperature, dtype=np.float64)
    if np.any(eps < 0) or np.any(np.isnan(eps)):
        raise ValueError("epsilon must be >= 0 (raw-logit units).")
    if np.any(~(t > 0)):
        raise ValueError("temperature must be > 0.")
    return 2.0 * eps / t


def log_ratio_bound(epsilon, temperature):
    """Bound ``2ε/T`` on ``|log p'_k - log p_k|`` for every option and every action.

    Parameters
    ----------
    epsilon : float or array-like of shape (N,)
        Bound on the per-logit drift, raw-logit units, >= 0.
    temperature : float or array-like of shape (N,)
        Temperature of the example's option-count bucket, > 0.

    Returns
    -------
    bound : float or ndarray of shape (N,)
        ``2 * epsilon / temperature`` (nats). Also the KL bound.

    Raises
    ------
    ValueError
        If ``epsilon`` < 0 or NaN, or ``temperature`` <= 0.

    References
    ----------
    The margin rule carried through the softmax (``docs/method.md``, "Temperature amplifies a
    raw error"); the Lipschitz bound of log-softmax in the max norm (e.g. Tsuzuku et al., NeurIPS 2018).
    """
    return _scaled(epsilon, temperature)


def ratio_bounds(epsilon, temperature):
    """Interval ``[exp(-2ε/T), exp(2ε/T)]`` holding every ratio ``p'/p`` (options and actions)."""
    b = _scaled(epsilon, temperature)
    return np.exp(-b), np.exp(b)


def tv_bound(epsilon, temperature):
    """Bound ``1 - exp(-2ε/T)`` on the total variation between the two option distributions."""
    return -np.expm1(-_scaled(epsilon, temperature))


def kl_bound(epsilon, temperature):
    """Bound ``2ε/T`` (nats) on ``KL(p || p')``."""
    return _scaled(epsilon, temperature)


def score_bound(epsilon, temperature, score_range):
    """Bound ``TV bound * (max score - min score)`` on the change of the expected score.

    Parameters
    ----------
    epsilon, temperature : float or array-like of shape (N,)
    score_range : float or array-like of shape (N,)
        ``max_k s_k - min_k s_k`` over the example's valid options (NaN where no scores).
    """
    return tv_bound(epsilon, temperature) * np.asarray(score_range, dtype=np.float64)


def max_abs_log_ratio(p_ref, p_var, mask=None, *, tiny=TINY_PROB):
    """Observed ``max_k |log p'_k - log p_k|`` per example.

    Parameters
    ----------
    p_ref, p_var : array-like of shape (N, K), float
        Option probabilities (or action probabilities, with ``mask=None``).
    mask : array-like of shape (N, K), bool, optional
        Valid entries; None means every finite entry.
    tiny : float, default=1e-30
        Values below it count as ``tiny`` (underflow), so two underflowed entries give 0.

    Returns
    -------
    log_ratio : ndarray of shape (N,), float64
        >= 0; 0 for a row with no valid entry. Large (up to ``-log(tiny)`` = 69) when one model
        puts mass where the other has none.

    Raises
    ------
    ValueError
        If shapes differ or the mask is malformed.
    """
    p, q = check_2d_pair(p_ref, p_var, names=("p_ref", "p_var"))
    valid = np.isfinite(p) & np.isfinite(q)
    if mask is not None:
        valid &= check_mask(mask, p.shape)
    lr = np.abs(np.log(np.maximum(q, tiny)) - np.log(np.maximum(p, tiny)))
    return np.max(np.where(valid, lr, 0.0), axis=1, initial=0.0)


def score_range(option_scores, option_mask):
    """``max_k s_k - min_k s_k`` over valid options with a score, per example (NaN if none).

    Parameters
    ----------
    option_scores : array-like of shape (N, K), float (NaN = no score)
    option_mask : array-like of shape (N, K), bool
    """
    s = np.asarray(option_scores, dtype=np.float64)
    mask = check_mask(option_mask, s.shape)
    ok = mask & np.isfinite(s)
    hi = np.max(np.where(ok, s, -np.inf), axis=1)
    lo = np.min(np.where(ok, s, np.inf), axis=1)
    return np.where(ok.any(axis=1), hi - lo, np.nan)

"""Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks", sec. 4.2)."""

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

LOG_T_BOUNDS = (np.log(1e-3), np.log(1e3))


def _nll(log_t, logits, mask, labels):
    z = np.where(mask, logits / np.exp(log_t), -np.inf)
    return -log_softmax(z, axis=1)[np.arange(len(labels)), labels].mean()


def fit_temperature(logits, mask, labels):
    """Temperature T > 0 minimising the NLL of softmax(logits / T) on labelled examples.

    Parameters
    ----------
    logits : ndarray of shape (N, K), float
    mask : ndarray of shape (N, K), bool
        Valid options.
    labels : ndarray of shape (N,), int
        Gold option; rows with label < 0 are ignored.

    Returns
    -------
    float
        The fitted temperature (bounded search of log T in [log 1e-3, log 1e3], scipy
        ``minimize_scalar``).

    Raises
    ------
    ValueError
        If no example has a label.
    """
    logits = np.asarray(logits, np.float64)
    labels = np.asarray(labels)
    keep = labels >= 0
    if not keep.any():
        raise ValueError("fit_temperature needs at least one labelled example (label >= 0)")
    res = minimize_scalar(_nll, bounds=LOG_T_BOUNDS, method="bounded",
                          args=(logits[keep], np.asarray(mask)[keep], labels[keep]),
                          options={"xatol": 1e-6})
    return float(np.exp(res.x))


def fit_bucket_temperatures(logits, mask, labels):
    """One temperature per option count K_i. Returns {K: T} (int -> float)."""
    k = np.asarray(mask).sum(axis=1)
    return {int(b): fit_temperature(logits[k == b], np.asarray(mask)[k == b], labels[k == b])
            for b in np.unique(k)}

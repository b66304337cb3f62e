"""Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks", sec. 4.2)."""

import warnings

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
    mask = np.asarray(mask, bool)
    labels = np.asarray(labels)
    keep = labels >= 0
    if not keep.any():
        raise ValueError("fit_temperature needs at least one labelled example (label >= 0)")
    logits, mask, labels = logits[keep], mask[keep], labels[keep]
    bad = labels >= logits.shape[1]
    bad[~bad] = ~mask[np.flatnonzero(~bad), labels[~bad]]
    if bad.any():
        raise ValueError(f"labels point at invalid options in {int(bad.sum())} rows (e.g. row "
                         f"{int(np.flatnonzero(bad)[0])}); a label must index a True option_mask "
                         "entry")
    res = minimize_scalar(_nll, bounds=LOG_T_BOUNDS, method="bounded",
                          args=(logits, mask, labels), options={"xatol": 1e-6})
    if min(abs(res.x - b) for b in LOG_T_BOUNDS) < 1e-3:
        warnings.warn(
            f"temperature fit stopped at its bound T={np.exp(res.x):.3g} on {len(labels)} "
            "examples: the logits are no better than uniform (or perfectly separating) there; "
            "use more calibration data or check the model", stacklevel=2)
    return float(np.exp(res.x))


def fit_bucket_temperatures(logits, mask, labels):
    """One temperature per option count K_i. Returns {K: T} (int -> float)."""
    logits, mask, labels = np.asarray(logits), np.asarray(mask, bool), np.asarray(labels)
    k = mask.sum(axis=1)
    return {int(b): fit_temperature(logits[k == b], mask[k == b], labels[k == b])
            for b in np.unique(k)}

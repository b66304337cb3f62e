"""The masked softmax: ``softmax(logits / T)`` over each example's valid options, 0 elsewhere.

The one definition used by the decision outputs, the early-exit rules and the evaluation's
refitted-temperature ECE (float64; the row maximum is subtracted before ``exp``).
"""

import numpy as np


def masked_softmax(logits, mask=None, temperature=None):
    """Option probabilities ``softmax(logits / T)`` over the valid options of each row.

    Parameters
    ----------
    logits : array-like of shape (N, K), float
        Raw logits (converted to float64).
    mask : array-like of shape (N, K), bool, optional
        Valid options; None = every option valid. Every row needs one valid option (a row with
        none gives NaN).
    temperature : float or array-like of shape (N,), optional
        T > 0, one per row or one for all; None = 1 (no scaling).

    Returns
    -------
    probs : ndarray of shape (N, K), float64
        Rows sum to 1; exactly 0 at invalid options.

    References
    ----------
    C. Guo et al., "On Calibration of Modern Neural Networks", ICML 2017, Sec. 4.2 (temperature
    scaling); the same as ``scipy.special.softmax`` on the valid entries.
    """
    z = np.asarray(logits, np.float64)
    if temperature is not None:
        t = np.asarray(temperature, np.float64)
        z = z / (t[:, None] if t.ndim == 1 else t)
    if mask is not None:
        z = np.where(np.asarray(mask, bool), z, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)

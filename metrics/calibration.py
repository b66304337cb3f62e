"""Expected calibration error of top-label confidence.

Naming rule: ``*_score`` is higher-is-better, ``*_loss``/``*_error`` lower-is-better;
``expected_calibration_error`` is lower-is-better (0 = perfectly calibrated).
"""

import numpy as np

from metrics._checks import check_labels, check_mask


def _bin_index(confidence, n_bins):
    """Bin of each confidence for equal-width bins ``((m-1)/M, m/M]``; 0 goes to the first bin."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return np.clip(np.digitize(confidence, edges, right=True) - 1, 0, n_bins - 1)


def expected_calibration_error(probs, labels, option_mask, *, n_bins=15):
    """Top-label expected calibration error with equal-width confidence bins.

    Confidence is the largest probability among valid options, the prediction its option. With
    bins ``B_m = ((m-1)/M, m/M]`` over the labeled examples (n of them),
    ``ECE = sum_m |B_m|/n * |acc(B_m) - conf(B_m)|``.

    Parameters
    ----------
    probs : array-like of shape (N, K), float
        Option probabilities (after temperature); entries outside ``option_mask`` are ignored.
    labels : array-like of shape (N,), int
        Gold option index; negative (-1) = unknown, excluded.
    option_mask : array-like of shape (N, K), bool
        True for valid options; every row needs at least one.
    n_bins : int, default=15
        Number of equal-width bins on [0, 1].

    Returns
    -------
    ece : float
        In [0, 1]; lower is better. NaN when no example is labeled.

    Raises
    ------
    ValueError
        If shapes disagree, probabilities are NaN or outside [0, 1] (+1e-6), a row has no valid
        option, or ``n_bins`` < 1.

    References
    ----------
    C. Guo et al., "On Calibration of Modern Neural Networks", ICML 2017, Sec. 2 (Eq. 3);
    M. P. Naeini et al., "Obtaining Well Calibrated Probabilities Using Bayesian Binning",
    AAAI 2015.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2:
        raise ValueError(f"probs must be 2-D of shape (N, K), got shape {probs.shape}.")
    mask = check_mask(option_mask, probs.shape)
    labels = check_labels(labels, probs.shape[0])
    if int(n_bins) != n_bins or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins}.")
    valid = probs[mask]
    if np.isnan(valid).any() or (valid < 0).any() or (valid > 1 + 1e-6).any():
        raise ValueError("probs has NaN or values outside [0, 1] on valid options.")
    known = labels >= 0
    if not known.any():
        return float("nan")
    z = np.where(mask, probs, -np.inf)[known]
    pred = np.argmax(z, axis=1)
    confidence = np.minimum(z[np.arange(z.shape[0]), pred], 1.0)
    hit = (pred == labels[known]).astype(np.float64)
    b = _bin_index(confidence, int(n_bins))
    count = np.bincount(b, minlength=n_bins)
    gap = np.bincount(b, weights=hit - confidence, minlength=n_bins)
    return float(np.abs(gap).sum() / count.sum())

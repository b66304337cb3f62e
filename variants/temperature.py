"""Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks", sec. 4.2)."""

import warnings

import numpy as np

from metrics.temperature_fit import BOUNDS, TemperatureFit, fit_temperature_status

LOG_T_BOUNDS = (np.log(BOUNDS[0]), np.log(BOUNDS[1]))


def fit_temperature_result(logits, mask, labels, *, bucket=None):
    """Temperature T > 0 minimising the NLL of softmax(logits / T) on labelled examples, with its
    status (:class:`metrics.temperature_fit.TemperatureFit`), warning unless it converged.

    Parameters
    ----------
    logits : ndarray of shape (N, K), float
    mask : ndarray of shape (N, K), bool
        Valid options.
    labels : ndarray of shape (N,), int
        Gold option; rows with label < 0 are ignored.
    bucket : int, optional
        Option count K of these rows, named in the warning.

    Returns
    -------
    TemperatureFit
        Search of log T in [log 1e-3, log 1e3] (:func:`metrics.temperature_fit.
        fit_temperature_status`). Its ``temperature`` is always usable: the bound when the fit
        ran to it (status "at_bound"), 1.0 (no scaling) when the NLL is flat or there is one
        labelled example (status "not_converged", the reason says which).

    Raises
    ------
    ValueError
        If no example has a label, or a label points at an invalid option.
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
    if (mask.sum(axis=1) == 1).all():  # T changes nothing with one option: no fit, no warning
        return TemperatureFit(1.0, "not_converged", 0.0, len(labels),
                              "one option per example: T has no effect (T = 1 used)")
    fit = fit_temperature_status(logits, mask, labels)
    if fit.status == "not_converged" and not np.isfinite(fit.temperature):
        fit = TemperatureFit(1.0, fit.status, fit.nll, fit.n, fit.reason + " (T = 1 used)")
    if not fit.converged:
        where = "" if bucket is None else f" of bucket K={bucket}"
        warnings.warn(f"temperature fit{where} {fit.describe()} on {fit.n} examples: {fit.reason}; "
                      "use more calibration data or check the model", stacklevel=3)
    return fit


def fit_temperature(logits, mask, labels):
    """The temperature (float) of :func:`fit_temperature_result` (same arguments, warnings and
    errors); kept for callers that need only T."""
    return fit_temperature_result(logits, mask, labels).temperature


def fit_bucket_temperature_results(logits, mask, labels):
    """One :func:`fit_temperature_result` per option count K_i: {K: TemperatureFit}."""
    logits, mask, labels = np.asarray(logits), np.asarray(mask, bool), np.asarray(labels)
    k = mask.sum(axis=1)
    return {int(b): fit_temperature_result(logits[k == b], mask[k == b], labels[k == b],
                                           bucket=int(b)) for b in np.unique(k)}


def fit_bucket_temperatures(logits, mask, labels):
    """One temperature per option count K_i. Returns {K: T} (int -> float)."""
    return {k: f.temperature for k, f in fit_bucket_temperature_results(logits, mask, labels).items()}

"""Shim (issue 15): the temperature fits live in :mod:`metrics.temperature_fit`
(:func:`~metrics.temperature_fit.fit_calibration_temperature`,
:func:`~metrics.temperature_fit.fits_by_bucket` with ``calibration=True``); these old names
stay until the lead removes this module after the merge."""

from metrics.temperature_fit import BOUNDS, TemperatureFit, fit_calibration_temperature, fits_by_bucket

__all__ = ["BOUNDS", "TemperatureFit", "fit_bucket_temperature_results",
           "fit_bucket_temperatures", "fit_temperature", "fit_temperature_result"]

fit_temperature_result = fit_calibration_temperature


def fit_temperature(logits, mask, labels):
    """The temperature (float) of :func:`metrics.temperature_fit.fit_calibration_temperature`."""
    return fit_calibration_temperature(logits, mask, labels).temperature


def fit_bucket_temperature_results(logits, mask, labels):
    """``fits_by_bucket(logits, mask, labels, calibration=True)``: {K: TemperatureFit}."""
    return fits_by_bucket(logits, mask, labels, calibration=True)


def fit_bucket_temperatures(logits, mask, labels):
    """One deployed temperature per option count K_i: {K: T} (int -> float)."""
    return {k: f.temperature for k, f in fit_bucket_temperature_results(logits, mask, labels).items()}

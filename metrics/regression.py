"""Metrics of a regression head (``problem_type = "regression"``, one output): the output value
itself, as ``transformers`` trains it (``MSELoss`` on the raw logit; no softmax, no temperature).

Per-example columns (``Evaluation.detail``), with ``r``, ``v`` the reference's and the variant's
value (logit 0) of a row and ``s`` the reference's spread, the standard deviation (ddof 0) of its
values over the evaluated rows:

- ``value_abs_error`` (float): ``|v - r|``, in the output's own units;
- ``value_rel_error`` (float): ``|v - r| / s``: unit-free, so one packaged contract fits a
  score in [0, 1] and a price in dollars alike; NaN when ``s`` is 0 (the reference's values do
  not vary: nothing to be relative to);
- ``within_tolerance`` (bool): ``value_rel_error <= value_tolerance`` (the contract's
  ``[settings] value_tolerance``, default :data:`metrics.defaults.VALUE_TOLERANCE`); its
  ``rate`` is the share of rows within tolerance (Clopper–Pearson interval), so a clause
  ``min = q`` reads "|variant - reference| <= tol x s on at least q of the rows".

Set-level metric (``f(ev, idx (B, n) int) -> (B,) float64``, as :mod:`metrics.set_metrics`):

- ``value_spearman``: Spearman's rank correlation of ``r`` and ``v`` over the rows (Pearson's
  correlation of their average ranks, ties shared; Spearman 1904, as
  ``scipy.stats.spearmanr``); NaN when either side is constant on the rows.
"""

import numpy as np
from scipy.stats import rankdata


def values(logits):
    """(N,) float64: each row's output value (logit 0 of a one-output head)."""
    return np.asarray(logits, dtype=np.float64)[:, 0]


def spread(reference):
    """The reference's spread: ``numpy.std`` (ddof 0) of its (N,) values; 0.0 for N < 2 and
    for equal values (exactly: their float64 mean is not always the value itself, which would
    leave a spread of rounding error to divide by)."""
    reference = np.asarray(reference, dtype=np.float64)
    if reference.size < 2 or np.ptp(reference) == 0:
        return 0.0
    return float(reference.std())


#: the metrics in units of the reference's spread (NaN when it is 0)
RELATIVE = ("value_rel_error", "within_tolerance")


def undefined_reason(ev, metric, rows):
    """Why ``metric`` (one of this module's) is NaN on the rows of ``rows`` ((N,) bool) of
    evaluation ``ev`` although there are some, or "" (a number, or not this module's metric).

    The relative metrics are undefined when the reference's values do not vary over the
    evaluated rows (spread 0: nothing to be relative to); Spearman's ρ when they do not vary
    over ``rows``. ``value_abs_error`` is always defined: a clause on it still judges.
    """
    if metric not in (*RELATIVE, "value_spearman") or ev.ref_logits is None:
        return ""
    r = values(ev.ref_logits)
    if metric in RELATIVE and r.size and spread(r) == 0:
        return (f"the reference's values are constant on the {r.size} eval row"
                f"{'s' if r.size > 1 else ''} (all {r[0]:.6g}, spread 0): relative error and "
                "the tolerance in units of the spread are undefined; bound value_abs_error (the "
                "output's own units) with --contract instead")
    r = r[rows]
    if metric == "value_spearman" and r.size >= 2 and np.ptp(r) == 0:
        return (f"the reference's values are constant on the clause's {r.size} rows (all "
                f"{r[0]:.6g}): rank correlation is undefined (there is no order to keep)")
    return ""


def failure_reason(ev, metric, rows):
    """Why a clause on ``metric`` over the rows of ``rows`` ((N,) bool) fails whatever its
    value, or "": only ``value_spearman``, when the variant's values are constant where the
    reference's vary (ρ is NaN, but the reference's order is lost, not untestable)."""
    if metric != "value_spearman" or ev.ref_logits is None:
        return ""
    r, v = values(ev.ref_logits)[rows], values(ev.var_logits)[rows]
    if r.size >= 2 and np.ptp(r) > 0 and np.ptp(v) == 0:
        return (f"the variant's values are constant on the clause's {r.size} rows (all "
                f"{v[0]:.6g}) where the reference's vary: the reference's order is lost")
    return ""


def value_columns(ref_logits, var_logits, tolerance):
    """The per-example columns of the module docstring.

    Parameters
    ----------
    ref_logits, var_logits : ndarray (N, K) float
        Column 0 is the value.
    tolerance : float
        ``value_tolerance``, in units of the reference's spread (> 0).

    Returns
    -------
    dict of str -> ndarray (N,) (``within_tolerance`` a pandas nullable boolean array, NA where
    ``value_rel_error`` is NaN)
    """
    import pandas as pd

    r, v = values(ref_logits), values(var_logits)
    err = np.abs(v - r)
    s = spread(r)
    rel = err / s if s > 0 else np.full(err.shape, np.nan)
    within = pd.array(rel <= tolerance, dtype="boolean")
    within[np.isnan(rel)] = pd.NA
    return {"value_abs_error": err, "value_rel_error": rel, "within_tolerance": within}


def spearman_rows(a, b):
    """(B,) Spearman's ρ of each row pair of ``a``, ``b`` (B, n): Pearson's correlation of the
    rows' average ranks; NaN where a row is constant (or n < 2)."""
    ra, rb = rankdata(a, axis=1), rankdata(b, axis=1)
    ra -= ra.mean(axis=1, keepdims=True)
    rb -= rb.mean(axis=1, keepdims=True)
    den = np.sqrt((ra ** 2).sum(axis=1) * (rb ** 2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(axis=1) / den, np.nan)


def value_spearman(ev, idx):
    """(B,) Spearman's ρ of reference and variant values on each resample of ``idx`` (B, n)."""
    return spearman_rows(values(ev.ref_logits)[idx], values(ev.var_logits)[idx])

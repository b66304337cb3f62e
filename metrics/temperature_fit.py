"""Temperature scaling fits that say whether they found an optimum: converged, at a bound, or not.

One core, :func:`fit_temperature_status`, serves both the reference's calibration temperatures
(:func:`fit_calibration_temperature`, which falls back to T = 1 and warns) and the evaluation's
refit (:func:`fit_temperature`, ``temperature_refit_log_ratio``); :func:`fits_by_bucket` runs
either per option count. Every public function takes ``(logits, mask, labels)`` in that order.
The NLL
of ``softmax(logits / T)`` is scanned on a grid of log T over the search interval, the best grid
cell is refined with scipy's bounded Brent search, then polished with Newton steps on log T
(exact first and second derivatives, :func:`nll_derivatives`) until a step is below
:data:`POLISH_TOL`: Brent's own tolerance cannot go below ~1.5e-8 relative, and which of its
branches is taken can flip with the last bit of an NLL summed in another SIMD order, so the
same logits could give temperatures 1e-8 apart on two CPUs; after the polish they agree to
~1e-14 (the reference's temperatures are one object everywhere). The result is classified:

* ``"at_bound"``: the NLL at a bound is no higher than at the optimum found (within a relative
  1e-9): the optimum lies at or beyond the bound. Perfectly separable data drive T -> 0 (the NLL
  keeps falling and is exactly 0 in float64 below some T); logits worse than uniform drive
  T -> inf. The returned temperature is the bound.
* ``"not_converged"``: the NLL is flat over the whole interval (constant logits; a single option),
  so the data do not determine T (temperature NaN), or scipy reported failure.
* ``"converged"``: an interior minimum (after the Newton polish: the exact root of the NLL's
  derivative, which moves continuously with the logits; Brent's stopping point could jump).

References
----------
C. Guo et al., "On Calibration of Modern Neural Networks", ICML 2017, Sec. 4.2;
``scipy.optimize.minimize_scalar(method='bounded')``.
"""

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from metrics._checks import check_labels, check_mask
from metrics.temperature_polish import nll_derivatives, polish  # noqa: F401 (re-exported)

#: Search interval of T (the optimisation runs over log T).
BOUNDS = (1e-3, 1e3)
STATUSES = ("converged", "at_bound", "not_converged")
#: Grid points over log T (spacing ln(1e6)/40 = 0.35) and the relative NLL tolerance that decides
#: "flat" and "indistinguishable from a bound".
GRID_POINTS = 41
RTOL = 1e-9


@dataclass(frozen=True)
class TemperatureFit:
    """Outcome of one temperature fit.

    Attributes
    ----------
    temperature : float
        The fitted T; the bound for ``at_bound``; NaN when the objective is flat or there are
        fewer than 2 examples.
    status : {'converged', 'at_bound', 'not_converged'}
    nll : float
        Mean NLL (nats) at ``temperature`` (at the best T found when NaN).
    n : int
        Examples fitted.
    reason : str
        Empty when converged, else why (for warnings and reports).
    """

    temperature: float
    status: str
    nll: float
    n: int
    reason: str = ""

    @property
    def converged(self):
        return self.status == "converged"

    def describe(self):
        """'converged (T=0.42)', 'at bound (T=1000)' or 'did not converge (<reason>)'."""
        if self.status == "not_converged":
            return f"did not converge ({self.reason})"
        return f"{self.status.replace('_', ' ')} (T={self.temperature:.4g})"

    def to_dict(self):
        """JSON-ready dict (NaN -> None)."""
        def num(x):
            return None if x != x else float(x)
        return {"temperature": num(self.temperature), "status": self.status,
                "nll": num(self.nll), "n": int(self.n), "reason": self.reason}


def mean_nll(log_t, logits, mask, targets):
    """Mean NLL (nats) of ``softmax(logits / exp(log_t))`` over valid options, float64."""
    z = np.where(mask, logits / np.exp(log_t), -np.inf)
    return float(-log_softmax(z, axis=1)[np.arange(len(targets)), targets].mean())


def fit_temperature_status(logits, mask, targets, *, bounds=BOUNDS):
    """Temperature minimising the NLL, with a status (see the module docstring).

    Parameters
    ----------
    logits : ndarray of shape (N, K), float
        Raw logits of the examples to fit (all with a target).
    mask : ndarray of shape (N, K), bool
        Valid options; ``mask[i, targets[i]]`` must be True.
    targets : ndarray of shape (N,), int
        Target option of each row (>= 0).
    bounds : tuple of float, default=(1e-3, 1e3)

    Returns
    -------
    TemperatureFit
        ``not_converged`` with NaN temperature when N < 2 or a valid logit is NaN or inf.

    Raises
    ------
    ValueError
        If ``bounds`` is not ``0 < low < high``.
    """
    lo_t, hi_t = float(bounds[0]), float(bounds[1])
    if not 0 < lo_t < hi_t:
        raise ValueError(f"bounds must satisfy 0 < low < high, got {bounds}.")
    logits = np.asarray(logits, dtype=np.float64)
    mask, targets = np.asarray(mask, dtype=bool), np.asarray(targets, dtype=np.int64)
    n = len(targets)
    if n < 2:
        return TemperatureFit(float("nan"), "not_converged", float("nan"), n,
                              f"{n} example(s) with a target; need at least 2")
    if not np.isfinite(logits[mask]).all():
        return TemperatureFit(float("nan"), "not_converged", float("nan"), n,
                              "logits have NaN or inf on valid options: no NLL to minimise")
    lo, hi = np.log(lo_t), np.log(hi_t)
    grid = np.linspace(lo, hi, GRID_POINTS)
    vals = np.array([mean_nll(g, logits, mask, targets) for g in grid])
    best = int(np.argmin(vals))
    tol = RTOL * max(1.0, abs(vals[best]))
    if vals.max() - vals[best] <= tol:
        return TemperatureFit(float("nan"), "not_converged", float(vals[best]), n,
                              f"flat NLL ({vals[best]:.4g} nats for every T in "
                              f"[{lo_t:g}, {hi_t:g}]): the data do not determine T")
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, GRID_POINTS - 1)]
    res = minimize_scalar(mean_nll, bounds=(a, b), method="bounded",
                          args=(logits, mask, targets), options={"xatol": 1e-6})
    x, f = (float(res.x), float(res.fun)) if res.fun <= vals[best] else (grid[best], vals[best])
    if res.success:
        polished = polish(x, a, b, logits, mask, targets)
        if polished != x:
            x, f = polished, mean_nll(polished, logits, mask, targets)
    if vals[0] <= f + tol:
        return TemperatureFit(lo_t, "at_bound", float(vals[0]), n,
                              f"NLL still falling at the lower bound T={lo_t:g} (separable data)")
    if vals[-1] <= f + tol:
        return TemperatureFit(hi_t, "at_bound", float(vals[-1]), n,
                              f"NLL still falling at the upper bound T={hi_t:g} (logits no "
                              "better than uniform)")
    if not res.success:
        return TemperatureFit(float(np.exp(x)), "not_converged", f, n,
                              f"scipy: {res.message}")
    return TemperatureFit(float(np.exp(x)), "converged", f, n)


def fit_temperature(logits, mask, labels, *, bounds=BOUNDS):
    """Temperature minimising the NLL of ``softmax(logits / T)`` on the labelled rows, with its
    status: the evaluation's refit (no fallback: T is NaN when the data do not determine it).

    Parameters
    ----------
    logits : array-like of shape (N, K), float
        Raw logits.
    mask : array-like of shape (N, K), bool
        Valid options.
    labels : array-like of shape (N,), int
        Target option; negative = unknown (excluded).
    bounds : tuple of float, default=(1e-3, 1e3)
        Search interval for T.

    Returns
    -------
    TemperatureFit
        ``temperature``, ``status`` ('converged', 'at_bound' or 'not_converged'), ``nll``, ``n``,
        ``reason`` (module docstring); a converged T is the exact optimum (Newton on log T after
        Brent), continuous in the logits.

    Raises
    ------
    ValueError
        If shapes disagree or ``bounds`` is not ``0 < low < high``.

    References
    ----------
    C. Guo et al., ICML 2017, Sec. 4.2 (temperature scaling);
    ``scipy.optimize.minimize_scalar(method='bounded')``.
    """
    logits = np.asarray(logits, dtype=np.float64)
    mask = check_mask(mask, logits.shape)
    targets = check_labels(labels, logits.shape[0])
    known = targets >= 0
    return fit_temperature_status(logits[known], mask[known], targets[known], bounds=bounds)


def fit_calibration_temperature(logits, mask, labels, *, bucket=None):
    """The deployed temperature of one option-count bucket: :func:`fit_temperature_status` on the
    labelled rows, always usable, warning unless it converged.

    Parameters
    ----------
    logits, mask, labels :
        As :func:`fit_temperature`.
    bucket : int, optional
        Option count K of these rows, named in the warning.

    Returns
    -------
    TemperatureFit
        Its ``temperature`` is the bound when the fit ran to it (status "at_bound"), 1.0 (no
        scaling) when the NLL is flat, there is one labelled example or every row has one option
        (status "not_converged", the reason says which).

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


def fits_by_bucket(logits, mask, labels, *, calibration=False):
    """One fit per option count K: ``{K: TemperatureFit}``.

    With ``calibration=False`` (the evaluation's refit) :func:`fit_temperature` per bucket,
    single-option buckets skipped; with ``calibration=True`` (the deployed temperatures)
    :func:`fit_calibration_temperature` per bucket, every bucket (T = 1 for single-option ones).
    Arguments and errors as those functions.
    """
    logits, mask, labels = np.asarray(logits, dtype=np.float64), np.asarray(mask, bool), \
        np.asarray(labels)
    k = mask.sum(axis=1)
    if calibration:
        return {int(b): fit_calibration_temperature(logits[k == b], mask[k == b], labels[k == b],
                                                    bucket=int(b)) for b in np.unique(k)}
    key = _content_key(logits, mask, labels)
    if key not in _REFITS:  # the reference's refit recurs once per variant judged
        if len(_REFITS) >= _REFITS_MAX:
            _REFITS.pop(next(iter(_REFITS)))
        _REFITS[key] = {int(kk): fit_temperature(logits[k == kk], mask[k == kk], labels[k == kk])
                        for kk in np.unique(k) if kk > 1}
    return dict(_REFITS[key])


#: Refits by the content of their inputs (:func:`fits_by_bucket` without ``calibration``: a
#: pure function of them that never warns), oldest dropped first.
_REFITS = {}
_REFITS_MAX = 16


def _content_key(*arrays):
    """SHA-256 over the bytes, shapes and dtypes of ``arrays``."""
    import hashlib

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(repr((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return h.digest()


class RefitLogRatio(NamedTuple):
    """Result of :func:`refit_log_ratio`: ``value``, ``reason`` ("" when ``value`` is an
    ordinary number) and ``fails`` (True: the variant's refit found no optimum where the
    reference's did, and the clause on it fails whatever ``value`` is)."""

    value: float
    reason: str
    fails: bool = False


def refit_log_ratio(ref_logits, var_logits, targets, mask):
    """``|n-weighted mean over buckets of log(T_var / T_ref)|`` of NLL refits, or why not.

    Parameters
    ----------
    ref_logits, var_logits : ndarray of shape (N, K), float64
    targets : ndarray of shape (N,), int64
        Target option per row (>= 0).
    mask : ndarray of shape (N, K), bool

    Returns
    -------
    RefitLogRatio
        ``(value, reason, fails)``. Per option-count bucket (buckets with fewer than 2 rows are
        left out):

        * the reference's refit ran to a bound or did not converge: its T is no estimate (and a
          ratio of two bounds, 1000 / 1000, would read as "no change"), so ``value`` is NaN with
          a reason, e.g. "temperature refit at bound (T=1000) on bucket K=3 (reference)": the
          clause is untested;
        * the reference converged and the variant's refit ran to a bound: the variant's best T
          lies at or beyond the bound, outside anything the deployed temperatures can be;
          ``fails`` is True and the bucket enters the mean with the bound as the variant's T
          (so ``value`` is a lower bound of that bucket's shift, as the reason says);
        * the reference converged and the variant's refit did not converge (its NLL is flat in
          T): ``fails`` is True, the bucket is left out of the mean.

        A failing bucket decides over an untested one. NaN with reason "no bucket with 2 or more
        examples" when no bucket remains.
    """
    fits = {w: fits_by_bucket(lg, mask, targets) for w, lg in (("reference", ref_logits),
                                                              ("variant", var_logits))}
    k_of_row = mask.sum(axis=1)
    pairs, untested, failing = [], [], []
    for k in sorted(fits["reference"]):
        ref, var = fits["reference"][k], fits["variant"][k]
        if ref.n < 2 or var.n < 2:
            continue
        if not ref.converged:
            bad = ["reference"] + ([] if var.converged else ["variant"])
            untested.append(f"temperature refit {ref.describe()} on bucket K={k} "
                            f"({', '.join(bad)})")
            continue
        if var.status == "not_converged":
            failing.append(f"the variant's temperature refit {var.describe()} on bucket K={k} "
                           f"while the reference's converged (T={ref.temperature:.4g})")
            continue
        shift = np.log(var.temperature / ref.temperature)
        if var.status == "at_bound":
            failing.append(f"the variant's temperature refit ran to the bound (T={var.temperature:g})"
                           f" on bucket K={k} while the reference's converged "
                           f"(T={ref.temperature:.4g}): a shift of at least {abs(shift):.3g} there")
        pairs.append((shift, int((k_of_row == k).sum())))
    if failing:
        value = float("nan")
        if pairs:
            logs, weights = np.array(pairs, dtype=float).T
            value = float(abs(np.average(logs, weights=weights)))
        return RefitLogRatio(value, "; ".join(failing + untested), True)
    if untested:
        return RefitLogRatio(float("nan"), "; ".join(untested))
    if not pairs:
        return RefitLogRatio(float("nan"), "no bucket with 2 or more examples")
    logs, weights = np.array(pairs, dtype=float).T
    return RefitLogRatio(float(abs(np.average(logs, weights=weights))), "")

"""Set-level metrics of an :class:`metrics.evaluation.Evaluation`: one vectorised definition each.

Each function takes the evaluation and ``idx``, an int array of shape (B, n) (B sets of n row
indices, repeats allowed) and returns shape (B,) float64. The point value is the function on
``rows[None, :]`` (B = 1), the bootstrap the function on all resamples at once, so both come
from the same arithmetic; the point values are bit-identical to :mod:`metrics.calibration`
(``expected_calibration_error``, ``classwise_calibration_error``, ``brier_loss``),
:func:`metrics.accuracy.accuracy` and :func:`metrics.from_logits.nll_column` on the same rows.

One exception, kept so that saved results stay byte-identical: ``ece_width_*`` and
``ece_mass_*`` sum their bins in a different order for the point value
(:func:`metrics.calibration.calibration_error`'s ``sum_m |B_m|/n |acc - conf|``, ``point=True``)
than for the resamples (``sum_m |sum (hit - conf)| / n``); the two agree to ~1e-16. Merging them
changes the last digits of saved intervals, so it waits for a deliberate golden regeneration.

``smece_*`` is the smooth ECE (:mod:`metrics.smooth_ece`: kernel-smoothed, so it moves by at
most 16.96 times the largest change of a confidence instead of jumping at bin edges); its
resamples are one matrix product of resample multiplicities and kernel-weighted residuals.

``ece_*``, ``smece_*`` and ``accuracy_*`` use labeled rows only (NaN where none); ``ece_width_*``,
``ece_mass_*``, ``classwise_ece_*``, ``brier_*``, ``nll_*`` use ``Evaluation.targets`` (the label
where known, the reference's top-1 option elsewhere). ``*_delta`` is variant minus reference.
"""

import numpy as np

from metrics.calibration import _bin_index, equal_mass_sorted_bins
from metrics.from_logits import nll_column
from metrics.smooth_ece import smooth_calibration_error_resampled
from metrics.temperature_fit import refit_log_ratio

#: Calibration figures with a ``_ref``, ``_variant`` and ``_delta`` set metric each.
CALIBRATION_FIGURES = ("ece_width", "ece_mass", "classwise_ece", "brier", "nll")
#: Calibration figures of the top label on labeled rows (``ece_labels`` is named ``ece_*``).
LABELED_FIGURES = ("ece_labels", "smece")


def parts(ev, which):
    """Per-example pieces of the set-level metrics of ``which`` ('ref' or 'variant'), cached in
    ``ev._cache``: ``probs`` (N, K) (0 off the mask), top-label ``conf`` and ``hit`` (against
    ``targets``), ``known`` and ``label_hit`` (against labels), ``brier`` and ``nll`` terms (N,)."""
    key = ("parts", which)
    if key not in ev._cache:
        p = ev.ref_probs if which == "ref" else ev.var_probs
        logits = ev.ref_logits if which == "ref" else ev.var_logits
        t = ev.temperature if which == "ref" else ev.var_temperature
        mask = ev.option_mask
        p = np.where(mask, p, 0.0)
        z = np.where(mask, p, -np.inf)
        pred = np.argmax(z, axis=1)
        rows = np.arange(p.shape[0])
        conf = np.minimum(p[rows, pred], 1.0)
        labels = ev.per_example["label"].to_numpy()
        onehot = np.zeros_like(p)
        onehot[rows, ev.targets] = 1.0
        ev._cache[key] = {
            "probs": p, "conf": conf, "hit": (pred == ev.targets).astype(np.float64),
            "known": (labels >= 0).astype(np.float64),
            "label_hit": ((pred == labels) & (labels >= 0)).astype(np.float64),
            "brier": np.where(mask, (p - onehot) ** 2, 0.0).sum(axis=1),
            "nll": nll_column(p if logits is None else logits, p, ev.targets, mask, t),
        }
    return ev._cache[key]


def _flat(bins, n_bins):
    """Bin index of each (resample, row) in one flat array of B * n_bins bins."""
    return (np.arange(bins.shape[0])[:, None] * n_bins + bins).ravel()


def ece_gap_sum(conf, hit, weight, idx, n_bins):
    """``sum_m |sum_{i in B_m} w_i (hit_i - conf_i)| / sum_i w_i`` with equal-width bins, for each
    resample row of ``idx`` (B, n): the top-label (or one-class) ECE of
    :func:`metrics.calibration.expected_calibration_error`. ``weight`` (N,) of 0/1 selects the
    rows that count (None = all); NaN where none counts."""
    b = _bin_index(conf, n_bins)
    w = np.ones_like(conf) if weight is None else weight
    n_boot = idx.shape[0]
    gap = np.bincount(_flat(b[idx], n_bins), weights=((hit - conf) * w)[idx].ravel(),
                      minlength=n_boot * n_bins).reshape(n_boot, n_bins)
    count = w[idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.abs(gap).sum(axis=1) / count, np.nan)


def ece_binned(conf, hit, bins, n_bins):
    """``sum_m |B_m|/n * |acc(B_m) - conf(B_m)|`` per row of (B, n) arrays ``conf``, ``hit`` and
    ``bins`` (bin of each entry): :func:`metrics.calibration.calibration_error`'s arithmetic."""
    n_boot = conf.shape[0]
    flat = _flat(bins, n_bins)
    count = np.bincount(flat, minlength=n_boot * n_bins).reshape(n_boot, n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(flat, weights=conf.ravel(),
                                minlength=n_boot * n_bins).reshape(n_boot, n_bins) / count
        acc = np.bincount(flat, weights=hit.ravel(),
                          minlength=n_boot * n_bins).reshape(n_boot, n_bins) / count
    n = count.sum(axis=1, keepdims=True)
    gap = np.nan_to_num(acc - mean_conf)
    return np.sum(count / n * np.abs(gap), axis=1)


def equal_mass_bins(conf, n_bins):
    """Equal-mass bin of each entry of (B, n) ``conf``: each row sorted (stable) and split as
    :func:`metrics.calibration.equal_mass_sorted_bins` (``numpy.array_split``, ties in one bin;
    as :func:`metrics.calibration._bins` 'quantile')."""
    order = np.argsort(conf, axis=1, kind="stable")
    sorted_bins = equal_mass_sorted_bins(np.take_along_axis(conf, order, axis=1), n_bins)
    bins = np.empty(conf.shape, dtype=np.int64)
    np.put_along_axis(bins, order, sorted_bins, axis=1)
    return bins


def _tie_ranks(conf):
    """Dense rank of each entry of (N,) ``conf`` (equal values share one, NaN last) in the
    smallest integer type: a stable sort of ``rank[idx]`` gives exactly the order of a stable
    sort of ``conf[idx]`` (ties keep their positions), and NumPy sorts 16-bit keys by radix,
    about 4x faster on (1000, 800) resamples."""
    _, rank = np.unique(conf, return_inverse=True)
    return rank.astype(np.int16 if len(conf) < 2 ** 15 else np.int64).reshape(-1)


def ece_mass_sorted(conf, hit, idx, n_bins):
    """Equal-mass top-label ECE per resample row of ``idx`` (B, n): bins as
    :func:`equal_mass_bins` (ties in one bin), ``sum_m |sum (hit - conf)| / n`` summed in sorted
    order."""
    n_boot, n = idx.shape
    if n == 0:
        return np.full(n_boot, np.nan)
    rank = _tie_ranks(conf)[idx]
    order = np.argsort(rank, axis=1, kind="stable")
    g = np.take_along_axis((hit - conf)[idx], order, axis=1)
    bins = equal_mass_sorted_bins(np.take_along_axis(rank, order, axis=1), n_bins)
    new = np.ones(bins.shape, dtype=bool)  # where a bin starts in each sorted row
    new[:, 1:] = bins[:, 1:] != bins[:, :-1]
    starts = np.flatnonzero(new.ravel())
    per_bin = np.zeros((n_boot, min(n, n_bins)))  # a bin emptied by ties adds 0
    per_bin[starts // n, bins.ravel()[starts]] = np.add.reduceat(g.ravel(), starts)
    return np.abs(per_bin).sum(axis=1) / n


def _figure(ev, figure, which, idx, point=False):
    """Calibration ``figure`` of ``which`` ('ref'/'variant') on each row of ``idx``; ``point``
    selects the point-value summation order of ``ece_width``/``ece_mass`` (module docstring)."""
    part = parts(ev, which)
    if figure in ("brier", "nll"):
        return part[figure][idx].mean(axis=1)
    if figure == "ece_labels":
        return ece_gap_sum(part["conf"], part["label_hit"], part["known"], idx, ev.n_bins)
    if figure == "smece":
        return smooth_calibration_error_resampled(part["conf"], part["label_hit"], idx,
                                                  weight=part["known"])
    if figure in ("ece_width", "ece_mass") and point:
        conf = part["conf"][idx]
        bins = _bin_index(conf, ev.n_bins) if figure == "ece_width" else \
            equal_mass_bins(conf, ev.n_bins)
        return ece_binned(conf, part["hit"][idx], bins, ev.n_bins)
    if figure == "ece_width":
        return ece_gap_sum(part["conf"], part["hit"], None, idx, ev.n_bins)
    if figure == "ece_mass":
        return ece_mass_sorted(part["conf"], part["hit"], idx, ev.n_bins)
    per_class = []  # classwise: mean over options of the one-class ECE
    for k in range(ev.option_mask.shape[1]):
        valid = ev.option_mask[:, k].astype(np.float64)
        conf = np.minimum(part["probs"][:, k], 1.0)
        hit = (ev.targets == k).astype(np.float64)
        per_class.append(ece_gap_sum(conf, hit, valid, idx, ev.n_bins))
    with np.errstate(invalid="ignore"):
        stacked = np.stack(per_class, axis=1)
        ok = ~np.isnan(stacked)
        return np.where(ok.any(axis=1),
                        np.nansum(stacked, axis=1) / np.maximum(ok.sum(axis=1), 1), np.nan)


def calibration_metric(figure, which, *, point=False):
    """The set metric ``<figure>_<which>`` (``which`` 'ref', 'variant' or 'delta' = variant -
    ref) as a function ``(ev, idx) -> (B,)``; ``figure`` 'ece_labels' is ``ece_*``, 'smece' the
    smooth ECE on labeled rows; ``point``
    as :func:`_figure`."""
    if which == "delta":
        return lambda ev, idx: (_figure(ev, figure, "variant", idx, point)
                                - _figure(ev, figure, "ref", idx, point))
    return lambda ev, idx: _figure(ev, figure, which, idx, point)


def _accuracies(ev, idx):
    known = (ev.per_example["label"].to_numpy() >= 0).astype(np.float64)[idx]
    n = known.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return [(ev._array(c)[idx] == 1.0).sum(axis=1) / np.where(n > 0, n, np.nan)
                for c in ("ref_correct", "var_correct")]


def accuracy_ref(ev, idx):
    """Reference accuracy on the labeled rows (NaN where none)."""
    return _accuracies(ev, idx)[0]


def accuracy_variant(ev, idx):
    """Variant accuracy on the labeled rows (NaN where none)."""
    return _accuracies(ev, idx)[1]


def accuracy_drop(ev, idx):
    """Reference minus variant accuracy on the labeled rows."""
    ref, var = _accuracies(ev, idx)
    return ref - var


def rate_of(column):
    """Share of ``column`` (a per-example bool column) on each row of ``idx``."""
    return lambda ev, idx: ev._array(column)[idx].mean(axis=1)


def temperature_refit_log_ratio(ev, idx):
    """|n-weighted mean over option-count buckets of log(T_var / T_ref)| of temperatures refitted
    (NLL) on the rows, per row of ``idx`` (a loop: one refit per set).

    A systematic change of the logit scale moves every bucket alike and survives the mean, while
    the refit noise of small buckets (e.g. +/-4% at n = 200) averages out instead of deciding
    alone. NaN (reason in ``ev.skip_reason``) when the reference's refit ran to a bound or did
    not converge; when only the variant's did, ``ev.fail_reason`` says so and a bucket at a
    bound counts with the bound as its T (:func:`metrics.temperature_fit.refit_log_ratio`).
    """
    out = []
    for rows in idx:
        key = ("refit", rows.tobytes())
        if key not in ev._cache:
            ev._cache[key] = refit_log_ratio(ev.ref_logits[rows], ev.var_logits[rows],
                                             ev.targets[rows], ev.option_mask[rows])
        out.append(ev._cache[key][0])
    return np.array(out, dtype=np.float64)


def constant(attribute):
    """A constant of the run (``ev.<attribute>``), the same for every set of rows."""
    return lambda ev, idx: np.full(idx.shape[0], float(getattr(ev, attribute)))

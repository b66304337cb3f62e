"""Per-label metrics of a multi-label head (``problem_type = "multi_label_classification"``):
each logit is one label's own yes/no, read through a sigmoid, as ``transformers`` trains it
(``BCEWithLogitsLoss``). A label is decided "yes" when its probability is at least 0.5, i.e. its
logit is >= 0 (the threshold of ``transformers``' and scikit-learn's multi-label examples).

Per-example columns (``Evaluation.detail``; only where ``option_mask`` is True):

- ``label_flip`` (bool): some label's decision changed (the row's set of labels differs);
- ``label_prob_max_abs_diff`` / ``label_prob_mean_abs_diff`` (float): max / mean over the
  row's labels of ``|sigmoid(z_variant) - sigmoid(z_reference)|``.

Set-level metrics (``f(ev, idx (B, n) int) -> (B,) float64``, as :mod:`metrics.set_metrics`):

- ``label_flip_rate_max``: the largest per-label flip rate (flips of label l / rows offering
  it), so that a variant breaking one rare label is not averaged away by the others;
- ``label_brier_delta``: the largest per-label worsening of the Brier score, variant minus
  reference, ``mean_i (p'_il - y_il)^2 - mean_i (p_il - y_il)^2``;
- ``label_ece_delta``: the largest per-label worsening of the binary expected calibration error
  (``n_bins`` equal-width bins of the label's probability, ``sum_m |sum_{i in B_m} (y_i -
  p_i)| / n``; Naeini et al. 2015 for one class), variant minus reference.

The targets ``y`` are the reference's own per-label decisions: the data's ``label`` column holds
one option per row, so no multi-label ground truth is read (as ``brier_delta`` falls back to the
reference's answer on unlabelled rows). The calibration deltas therefore measure how far the
variant's probabilities move away from (positive) or towards (negative) the reference's
decisions, label by label.
"""

import numpy as np

from metrics.set_metrics import ece_gap_sum


def sigmoid(z):
    """Logistic function of a float array, overflow-free (float64 out)."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def decisions(logits):
    """Per-label yes/no: ``sigmoid(z) >= 0.5``, i.e. ``z >= 0`` (bool, the shape of ``logits``)."""
    return np.asarray(logits) >= 0


def label_columns(ref_logits, var_logits, mask):
    """The per-example columns of the module docstring.

    Parameters
    ----------
    ref_logits, var_logits : ndarray (N, L) float
    mask : ndarray (N, L) bool
        The labels each row has (an all-False row gives False / NaN).

    Returns
    -------
    dict of str -> ndarray (N,)
    """
    mask = np.asarray(mask, dtype=bool)
    flip = (decisions(ref_logits) != decisions(var_logits)) & mask
    diff = np.where(mask, np.abs(sigmoid(var_logits) - sigmoid(ref_logits)), np.nan)
    has = mask.any(axis=1)
    with np.errstate(invalid="ignore"):
        worst = np.where(has, np.nanmax(np.where(mask, diff, -np.inf), axis=1), np.nan)
        mean = np.where(has, np.nansum(diff, axis=1) / np.maximum(mask.sum(axis=1), 1), np.nan)
    return {"label_flip": flip.any(axis=1), "label_prob_max_abs_diff": worst,
            "label_prob_mean_abs_diff": mean}


def _parts(ev):
    """Cached (N, L) reference and variant probabilities, targets (reference decisions) and
    mask as float64."""
    key = ("multilabel_parts",)
    if key not in ev._cache:
        mask = np.asarray(ev.option_mask, dtype=bool)
        ev._cache[key] = (sigmoid(ev.ref_logits), sigmoid(ev.var_logits),
                          (decisions(ev.ref_logits) & mask).astype(np.float64),
                          mask.astype(np.float64))
    return ev._cache[key]


def _per_label_mean(values, weight, idx):
    """(B, L): the mean over the rows of each resample of ``values`` (N, L), counting only
    entries with ``weight`` (N, L) 1; NaN where a label has none."""
    num = np.einsum("bnl->bl", (values * weight)[idx])
    den = np.einsum("bnl->bl", weight[idx])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _worst(per_label):
    """(B,) max over labels of (B, L), ignoring NaN (NaN where every label is NaN)."""
    ok = ~np.isnan(per_label)
    return np.where(ok.any(axis=1), np.max(np.where(ok, per_label, -np.inf), axis=1), np.nan)


def label_flip_rate_max(ev, idx):
    """(B,) the largest per-label flip rate on each resample of ``idx`` (B, n)."""
    _, _, _, w = _parts(ev)
    flips = (decisions(ev.ref_logits) != decisions(ev.var_logits)).astype(np.float64)
    return _worst(_per_label_mean(flips, w, idx))


def label_brier_delta(ev, idx):
    """(B,) the largest per-label Brier worsening (variant minus reference)."""
    p, q, y, w = _parts(ev)
    return _worst(_per_label_mean((q - y) ** 2 - (p - y) ** 2, w, idx))


def label_ece_delta(ev, idx):
    """(B,) the largest per-label binary-ECE worsening (variant minus reference), ``ev.n_bins``
    equal-width bins (:func:`metrics.set_metrics.ece_gap_sum` on each label's column)."""
    p, q, y, w = _parts(ev)
    per_label = np.stack([
        ece_gap_sum(q[:, k], y[:, k], w[:, k], idx, ev.n_bins)
        - ece_gap_sum(p[:, k], y[:, k], w[:, k], idx, ev.n_bins)
        for k in range(p.shape[1])], axis=1)
    return _worst(per_label)

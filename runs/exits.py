"""Exit statistics of early-exit outputs: histogram, expected cost, near-tie behaviour (NumPy).

Shared by the early-exit builder (``variants.families.exit.build``, calibration split) and the
run's report (:func:`runs.plots.markdown.exit_markdown`, eval split). The exit rules themselves
(DeeBERT entropy, margin, PABEE patience) are in ``variants.families.exit.rules``.
"""

import numpy as np

from metrics.defaults import NEAR_TIE_MARGIN


def exit_summary(exit_layer, n_layers, ref_logits=None, option_mask=None, near_tie_margin=NEAR_TIE_MARGIN,
                 layers=None):
    """Histogram, expected cost and near-tie behaviour of per-example exit layers.

    Parameters
    ----------
    exit_layer : array-like (n,) int — layers run per example (``n_layers`` = no early exit)
    n_layers : int — encoder depth N
    ref_logits : array-like (n, K) float, optional — the reference's raw logits; an example is a
        near tie when its top-2 margin over valid options is below ``near_tie_margin`` (raw-logit
        units, as the contract's near-tie band)
    option_mask : array-like (n, K) bool, optional
    layers : iterable of int, optional — histogram bins besides N (default: 1..N)

    Returns
    -------
    dict: ``exit_histogram`` {layer: count} (sums to n), ``expected_cost`` (mean fraction of
    layers run), ``ideal_speedup`` (1 / cost), ``exited_early_share``, and with ``ref_logits``:
    ``n_near_tie``, ``near_tie_mean_exit_layer``, ``other_mean_exit_layer``,
    ``near_tie_ran_all_share``, ``other_ran_all_share`` (None where a group is empty).
    """
    el = np.asarray(exit_layer, np.int64)
    bins = sorted(set(layers if layers is not None else range(1, n_layers)) | {n_layers})
    out = {"n": int(len(el)), "n_layers": int(n_layers),
           "exit_histogram": {int(l): int((el == l).sum()) for l in bins},
           "expected_cost": float(el.mean() / n_layers) if len(el) else 1.0,
           "exited_early_share": float((el < n_layers).mean()) if len(el) else 0.0}
    out["ideal_speedup"] = 1.0 / out["expected_cost"]
    if ref_logits is not None:
        z = np.asarray(ref_logits, np.float64)
        if option_mask is not None:
            z = np.where(np.asarray(option_mask, bool), z, -np.inf)
        top = np.sort(z, axis=-1)
        near = (top[:, -1] - top[:, -2]) < near_tie_margin
        out.update({
            "near_tie_margin": float(near_tie_margin), "n_near_tie": int(near.sum()),
            "near_tie_mean_exit_layer": float(el[near].mean()) if near.any() else None,
            "other_mean_exit_layer": float(el[~near].mean()) if (~near).any() else None,
            "near_tie_ran_all_share": float((el[near] == n_layers).mean()) if near.any()
            else None,
            "other_ran_all_share": float((el[~near] == n_layers).mean()) if (~near).any()
            else None})
    return out

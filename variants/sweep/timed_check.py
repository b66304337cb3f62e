"""The judged model is the model that runs: a variant judged in one mode and timed in another is
checked equal on every eval row, or refused.

A sweep judges a variant on the outputs of its quality build (``--quality-mode``, default
``simulated``: weights dequantized to fp32, MLX's ops) and times its speed build
(``--speed-mode``, default ``native``: packed weights, compiled layers, integer GEMMs). Where
the two modes differ, :func:`check` runs the timed model on every eval row, in the sweep's eval
batches, and compares its logits with the judged ones over each row's valid options. Within
:func:`tolerance` (max |Δlogit| <= :data:`TOLERANCE` x the judged logits' scale) the verdict
belongs to the timed model too: a label can then
change only on a row whose margin is under 2 × the difference, the 2ε margin rule, and no
contract bound is within reach of a difference that size. Beyond it the variant is refused in
one line (:class:`TimedModelDiffers`, a ValueError: the sweep lists it as failed and writes
nothing of it), naming the difference and the fix (``--quality-mode native``).

Families whose simulated and native models cannot agree to round-off (W8A8 Linears round their
activation codes on whichever path computes them) are judged in the speed mode instead
(:func:`variants.families.family.judged_mode`); for them, and wherever both modes are the same,
nothing is run twice and the record says so.
"""

import numpy as np

#: the largest |Δlogit| between judged and timed outputs on an eval row's valid options that
#: still lets the verdict stand for the timed model, relative to the logits' scale (max |logit|,
#: at least 1): float32 round-off between MLX's ops and the compiled kernels measured 5e-7 to
#: 2.6e-6 of that scale on the bundled models and the marker example (all-MiniLM-L6-v2, six
#: layers); a probability moves by at most |Δlogit| / (2T), far under the contracts' smallest
#: bound, 1e-2
TOLERANCE = 1e-4


def tolerance(judged):
    """The largest |Δlogit| :func:`check` accepts for ``judged`` (DecisionOutputs):
    :data:`TOLERANCE` x max(1, max |logit| over valid options)."""
    mask = np.asarray(judged.option_mask, bool)
    scale = float(np.abs(np.asarray(judged.logits, np.float64))[mask].max()) if mask.any() else 0
    return TOLERANCE * max(1.0, scale)


class TimedModelDiffers(ValueError):
    """The timed model's eval outputs differ from the judged ones beyond :data:`TOLERANCE`."""


def compare(judged, timed):
    """{``rows``, ``max_abs_dlogit``, ``label_changes``, ``nonfinite_rows``} of two
    DecisionOutputs of the same rows: max |Δlogit| over valid options (float64), rows whose top
    option differs. A NaN or inf logit (a variant that overflows: judged as a ``finite-outputs``
    failure, :mod:`runs.finite`) matches the same non-finite value on the other side (NaN with
    NaN, +inf with +inf) and nothing else: a finite logit facing a non-finite one is an infinite
    difference. ``nonfinite_rows`` counts the rows with a non-finite logit in either. Raises
    ValueError when they do not hold the same rows."""
    if not np.array_equal(np.asarray(judged.ids), np.asarray(timed.ids)):
        raise ValueError("the timed model's eval outputs are not the judged rows")
    mask = np.asarray(judged.option_mask, bool)
    a = np.asarray(judged.logits, np.float64)
    b = np.asarray(timed.logits, np.float64)
    fa, fb = np.isfinite(a) | ~mask, np.isfinite(b) | ~mask
    same_bad = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    with np.errstate(invalid="ignore"):
        diff = np.where(fa & fb, np.abs(a - b), np.where(same_bad, 0.0, np.inf))
    d = float(diff[mask].max()) if mask.any() else 0.0
    bad_rows = ~(fa & fb).all(axis=1)
    lo = np.where(mask & fa, np.nan_to_num(a), -np.inf).argmax(axis=1)
    lt = np.where(mask & fb, np.nan_to_num(b), -np.inf).argmax(axis=1)
    changed = (lo != lt) & ~bad_rows | (bad_rows & (diff > 0).any(axis=1))
    return {"rows": int(len(a)), "max_abs_dlogit": d, "label_changes": int(changed.sum()),
            "nonfinite_rows": int(bad_rows.sum())}


def check(sweep, name, info, judged_eval, timed):
    """build.json's ``timed_check`` for variant ``name``: ``{"same_model": True, ...}`` when
    ``info["quality_mode"]`` is the sweep's speed mode (the judged build is the timed build's
    mode; nothing run twice), else :func:`compare` of the judged eval outputs with ``timed``'s
    on the same batches, with ``tolerance`` and ``ok``. Raises :class:`TimedModelDiffers` when
    not ok."""
    mode, speed = info.get("quality_mode"), sweep.cfg.speed_mode
    if mode == speed:
        return {"same_model": True, "judged_mode": mode, "timed_mode": speed}
    with sweep.clock("variant_forward"):
        now = sweep._outputs(timed, "eval", f"{name} (timed build)")
    res = compare(judged_eval, now)
    tol = tolerance(judged_eval)
    res.update(same_model=False, judged_mode=mode, timed_mode=speed, tolerance=tol,
               ok=res["max_abs_dlogit"] <= tol)
    if not res["ok"]:
        raise TimedModelDiffers(
            f"the timed ({speed}) model is not the judged ({mode}) one: max |Δlogit| "
            f"{res['max_abs_dlogit']:.3g} > {tol:.2g} on {res['rows']} eval rows "
            f"({res['label_changes']} labels changed); judge what runs with --quality-mode {speed} "
            "(in a new --run or --results-dir)")
    return res


def stale(build, mode):
    """Why a reused variant folder's verdict does not belong to the model this sweep would
    time (None when it does): ``build`` its build.json, ``mode`` the mode this version judges
    it in (:func:`variants.families.family.judged_mode`). A folder judged in another mode, or
    judged in a mode other than the speed mode without a ``timed_check`` (written before the
    check existed), is stale: the sweep builds, judges and times it again."""
    was = build.get("quality_mode")
    if was != mode:
        return (f"judged in {was} mode by an earlier version; this version judges it in {mode} "
                "mode, the model it times")
    if mode != build.get("speed_mode") and "timed_check" not in build:
        return ("its timed build was never checked against the judged one (an earlier "
                "version)")
    return None

"""Rows whose outputs are not numbers: NaN or ±inf on a valid option (issue #39).

A variant that overflows (an activation past its quantizer's range, a scale of zero, a float16
sum past 65504) answers some rows with NaN or inf. Such a row has no choice, margin or
probability to compare: the ``finite-outputs`` clause (metric ``nonfinite_rows``, a count that
must be 0) fails the variant and names the rows, and every other metric is computed on the
remaining rows (:func:`runs.judge.judge_outputs`). A reference with such rows cannot be judged
against at all and is refused.
"""

from collections.abc import Mapping

import numpy as np

#: (N, K) fields read on valid options, and (N, A) fields read whole: what every metric reads.
OPTION_FIELDS = ("logits", "probs")
ROW_FIELDS = ("action_probs",)


def _field(outputs, name):
    value = outputs.get(name) if isinstance(outputs, Mapping) else getattr(outputs, name, None)
    return None if value is None else np.asarray(value)


def nonfinite_rows(outputs):
    """Rows with NaN or ±inf in ``logits`` or ``probs`` on a valid option, or in ``action_probs``.

    Parameters
    ----------
    outputs : mapping or DecisionOutputs
        ``option_mask`` (N, K) bool and any of ``logits``, ``probs`` (N, K) float and
        ``action_probs`` (N, A) float (absent fields are not read). ``expected_score`` is not
        read: NaN there means "no score", not an overflow.

    Returns
    -------
    ndarray of shape (N,), bool
        True on the rows no metric can read.

    Examples
    --------
    >>> nonfinite_rows({"option_mask": np.array([[True, True], [True, False]]),
    ...                 "logits": np.array([[0.0, np.nan], [1.0, np.inf]])}).tolist()
    [True, False]
    """
    mask = np.asarray(_field(outputs, "option_mask"), dtype=bool)
    bad = np.zeros(mask.shape[0], dtype=bool)
    for name in OPTION_FIELDS:
        a = _field(outputs, name)
        if a is not None:
            bad |= (~np.isfinite(a) & mask).any(axis=1)
    for name in ROW_FIELDS:
        a = _field(outputs, name)
        if a is not None and a.ndim == 2:
            bad |= ~np.isfinite(a).all(axis=1)
    return bad


def describe_rows(ids, bad, *, limit=5):
    """``"3 of 40 rows (ids a, b, c)"``: the count of ``bad`` (N,) bool among ``ids`` (N,) str
    and the first ``limit`` ids (then ``…``)."""
    ids = np.asarray(ids).astype(str)
    which = ids[np.asarray(bad, dtype=bool)]
    shown = ", ".join(which[:limit]) + (", …" if which.size > limit else "")
    return f"{which.size} of {ids.size} rows (ids {shown})"


def finite_part(ref, var):
    """``(ref_rows, var_rows, bad)``: the rows of two outputs mappings where ``var`` is finite.

    Parameters
    ----------
    ref, var : mapping of str -> ndarray
        Outputs of the same N rows (every array indexed by row first).

    Returns
    -------
    ref_rows, var_rows : dict of str -> ndarray
        Every array on the rows where ``bad`` is False (the inputs themselves when none is).
    bad : ndarray of shape (N,), bool
        :func:`nonfinite_rows` of ``var``.
    """
    bad = nonfinite_rows(var)
    if not bad.any():
        return ref, var, bad
    keep = ~bad
    return ({k: np.asarray(v)[keep] for k, v in ref.items()},
            {k: np.asarray(v)[keep] for k, v in var.items()}, bad)

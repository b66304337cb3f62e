"""Teacher fallback: which rows the student answers, and the threshold fitted on calibration.
NumPy only (no MLX import).

A row goes to the teacher when the student is not confident: its normalised entropy is not
below τ (``entropy``), or its top-2 probability margin is not above τ (``margin``), with
probabilities softmax(logits / T_K) at the teacher's per-K temperature (the rule statistics of
early exit, :func:`variants.families.exit.rules.rule_statistic`). The cost model of the variant
is c + q: the student always runs (c = its cost relative to the teacher), the teacher runs on
the share q of rows routed to it.
"""

import numpy as np

from variants.families.exit.rules import fires, predictions, rule_statistic


def routed(stat, rule, threshold):
    """(n,) bool: rows sent to the teacher (the student's rule does not fire)."""
    return ~fires(np.asarray(stat), rule, threshold)


def combined(student_logits, teacher_logits, route):
    """(n, K): the teacher's logits on routed rows, the student's elsewhere."""
    return np.where(np.asarray(route, bool)[:, None], teacher_logits, student_logits)


def agreement_and_q(student_pred, teacher_pred, ref_pred, route):
    """(agreement with ``ref_pred``, fallback rate q) when ``route`` rows take the teacher's
    prediction and the others the student's."""
    route = np.asarray(route, bool)
    pred = np.where(route, teacher_pred, student_pred)
    return float((pred == ref_pred).mean()), float(route.mean())


def fit_fallback(student_logits, teacher_logits, ref_pred, rule, target, mask=None,
                 temperature=None):
    """The threshold with the lowest calibration fallback rate q whose agreement with
    ``ref_pred`` reaches ``target``.

    Candidates: every distinct statistic value of the calibration rows (entropy: τ = s answers
    the rows with entropy < s; margin: τ = s answers margin > s), plus the τ that answers every
    row (entropy: just above the largest; margin: −1). Routing every row always agrees when the
    teacher is the reference, so a target in (0, 1] is always reached on calibration; the
    caller refuses a threshold that routes every row (the student would answer nothing).

    Parameters
    ----------
    student_logits, teacher_logits : ndarray (n, K) raw logits on calibration
    ref_pred : ndarray (n,) int — the reference's answers
    rule : {'entropy', 'margin'}; target : float in (0, 1]
    mask : (n, K) bool, optional; temperature : (n,) float, optional (see rule_statistic)

    Returns
    -------
    dict: ``threshold``, ``agreement``, ``q`` (calibration), ``reached`` (bool),
    ``student_agreement`` (the student alone), ``stat`` (n,) the statistic per row.
    """
    stat = rule_statistic(student_logits, rule, mask, temperature)
    sp, tp = predictions(student_logits, mask), predictions(teacher_logits, mask)
    vals = np.unique(stat)
    if rule == "entropy":
        cands = np.concatenate([[np.nextafter(vals[-1], np.inf)], vals[::-1]])
    else:
        cands = np.concatenate([[-1.0], vals])
    best, closest = None, None
    for t in cands:  # from answering every row towards routing more
        a, q = agreement_and_q(sp, tp, ref_pred, routed(stat, rule, t))
        if a >= target and (best is None or q < best[2]):
            best = (float(t), a, q)
        if closest is None or (a, -q) > (closest[1], -closest[2]):
            closest = (float(t), a, q)
    t, a, q = best if best is not None else closest
    return {"threshold": t, "agreement": a, "q": q, "reached": best is not None,
            "student_agreement": float((sp == ref_pred).mean()), "stat": stat}

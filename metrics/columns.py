"""Per-example columns of an evaluation: the ``per_example`` table (agreement, flips, margin,
drift, certificate) and the in-depth ``detail`` table (ε checks, bound violations, rater ties,
probability drifts), computed from a reference's and a variant's outputs.

Each column's meaning, direction and statistics: :mod:`metrics.registry`; the definitions: the
functions named here (:mod:`metrics.flips`, :mod:`metrics.margin`, :mod:`metrics.drift`,
:mod:`metrics.bounds`, :mod:`metrics.from_logits`, :mod:`metrics.ties`).
"""

from collections.abc import Mapping

import numpy as np
import pandas as pd

from metrics.accuracy import correct
from metrics.bounds import log_ratio_bound, max_abs_log_ratio, score_range, tv_bound
from metrics.drift import (
    abs_score_error,
    action_agreement,
    action_max_abs_diff,
    confidence_drift,
    delta_top_prob,
    entropy_confidence,
    total_variation,
)
from metrics.evaluation import Evaluation
from metrics.evaluation_tables import BOUND_ATOL, BOUND_RTOL
from metrics.flips import agreement, negative_flip, positive_flip, top1
from metrics.from_logits import kl_columns
from metrics.defaults import VALUE_TOLERANCE
from metrics.margin import certified, max_abs_logit_diff, top2_margin
from metrics.multilabel import label_columns
from metrics.regression import value_columns
from metrics.ties import human_near_tie, human_top2_gap


def _optional(outputs, name):
    try:
        value = outputs[name] if isinstance(outputs, Mapping) else getattr(outputs, name)
    except (KeyError, AttributeError):
        return None
    return None if value is None else np.asarray(value)


def build_evaluation(r, v, ref, var, *, epsilon, near_tie_margin, n_bins, epsilon_conformal,
                     alpha, human_tie_gap, value_tolerance=VALUE_TOLERANCE):
    """The :class:`metrics.evaluation.Evaluation` (summary still empty) of validated outputs.

    ``r``/``v`` hold the required fields of ``ref``/``var`` as arrays (checked by
    :func:`metrics.evaluate.evaluate`: equal shapes, ids and labels); the optional fields
    (``temperature``, ``option_scores``, ``confidence``, ``human_dist``) are read from
    ``ref``/``var`` when present. The columns are listed in :func:`metrics.evaluate.evaluate`;
    the ``detail`` table also holds the columns of multi-label heads
    (:func:`metrics.multilabel.label_columns`) and regression heads
    (:func:`metrics.regression.value_columns`, rows within ``value_tolerance``), read from the
    raw logits whatever the model (a contract names the ones of its model's outputs).
    """
    n = r["logits"].shape[0]
    ids = r["ids"].astype(str)
    mask = r["option_mask"]
    labels = r["labels"]
    known = labels >= 0
    ref_pred = top1(r["logits"], mask)
    var_pred = top1(v["logits"], mask)
    margin = top2_margin(r["logits"], mask)
    cert = certified(margin, epsilon)

    def labeled(x):
        out = pd.array(np.asarray(x, dtype=bool), dtype="boolean")
        out[~known] = pd.NA
        return out

    max_diff = max_abs_logit_diff(r["logits"], v["logits"], mask)
    temperature, var_temperature = _optional(ref, "temperature"), _optional(var, "temperature")
    if temperature is not None:
        temperature = temperature.astype(np.float64)
    if var_temperature is not None:
        var_temperature = var_temperature.astype(np.float64)
    # exact from logits / own T where the probabilities are their softmax (metrics.from_logits)
    kl, kl_rev, _ = kl_columns(r["logits"], v["logits"], r["probs"],
                               np.where(mask, v["probs"], 0.0), mask, temperature, var_temperature)
    score_err = abs_score_error(r["expected_score"], v["expected_score"])
    df = pd.DataFrame({
        "id": ids,
        "task": r["task"].astype(str),
        "n_options": mask.sum(axis=1).astype(np.int64),
        "label": labels.astype(np.int64),
        "ref_pred": ref_pred,
        "var_pred": var_pred,
        "agreement": agreement(ref_pred, var_pred),
        "flip": ~agreement(ref_pred, var_pred),
        "negative_flip": labeled(negative_flip(ref_pred, var_pred, labels)),
        "positive_flip": labeled(positive_flip(ref_pred, var_pred, labels)),
        "ref_margin": margin,
        "max_abs_logit_diff": max_diff,
        "kl": kl,
        "abs_score_error": score_err,
        "action_max_abs_diff": action_max_abs_diff(r["action_probs"], v["action_probs"]),
        "action_agreement": action_agreement(r["action_probs"], v["action_probs"]),
        "ref_correct": labeled(correct(ref_pred, labels)),
        "var_correct": labeled(correct(var_pred, labels)),
        "near_tie": margin < near_tie_margin,
        "certified": cert,
    })

    # -- in-depth columns -------------------------------------------------------------------
    ref_probs = r["probs"].astype(np.float64)
    var_probs = np.where(mask, v["probs"].astype(np.float64), 0.0)
    log_ratio = max_abs_log_ratio(ref_probs, var_probs, mask)
    action_log_ratio = max_abs_log_ratio(r["action_probs"], v["action_probs"])
    prob_tv = total_variation(np.where(mask, ref_probs, 0.0), var_probs)
    scores = _optional(ref, "option_scores")
    srange = score_range(scores, mask) if scores is not None else np.full(n, np.nan)
    if temperature is not None:
        own = log_ratio_bound(max_diff, temperature)  # what each example's own drift allows
        tol = BOUND_ATOL + BOUND_RTOL * own
        tvb = tv_bound(max_diff, temperature)
        over_score = np.nan_to_num(score_err - tvb * srange, nan=-np.inf) > BOUND_ATOL * (1 + np.nan_to_num(srange))
        violation = ((log_ratio > own + tol) | (action_log_ratio > own + tol)
                     | (prob_tv > tvb + tol) | (kl > own + tol) | over_score)
    else:
        own = np.full(n, np.nan)
        violation = np.zeros(n, dtype=bool)
    human = _optional(ref, "human_dist")
    gap = human_top2_gap(human, mask) if human is not None else np.full(n, np.nan)
    ref_conf, var_conf = _optional(ref, "confidence"), _optional(var, "confidence")
    if ref_conf is None or var_conf is None:  # not saved: derive from the probabilities
        ref_conf, var_conf = entropy_confidence(ref_probs, mask), entropy_confidence(var_probs, mask)
    conf_drift = confidence_drift(ref_conf, var_conf)
    dtop = delta_top_prob(ref_probs, var_probs, mask)
    detail = pd.DataFrame({
        "epsilon_exceeded": max_diff > float(epsilon),
        "within_conformal": max_diff <= epsilon_conformal,
        "certified_conformal": certified(margin, epsilon_conformal),
        "bound_violation": violation,
        "mask_mismatch": (v["option_mask"] != mask).any(axis=1),
        "human_near_tie": human_near_tie(gap, tie_gap=human_tie_gap),
        "kl_reverse": kl_rev,
        "prob_tv": prob_tv,
        "delta_top_prob": dtop,
        "abs_delta_top_prob": np.abs(dtop),
        "confidence_drift": conf_drift,
        "action_tv": total_variation(r["action_probs"], v["action_probs"]),
        "log_ratio_max": log_ratio,
        "action_log_ratio_max": action_log_ratio,
        "human_top2_gap": gap,
        "score_range": srange,
        "log_ratio_bound": own,
        **label_columns(r["logits"], v["logits"], mask),
        **value_columns(r["logits"], v["logits"], value_tolerance),
    })
    evaluation = Evaluation(
        per_example=df, summary={}, epsilon=float(epsilon), near_tie_margin=near_tie_margin,
        n_bins=int(n_bins), ref_probs=ref_probs, var_probs=var_probs, option_mask=mask,
        detail=detail, epsilon_conformal=epsilon_conformal,
        alpha=None if alpha is None else float(alpha), human_tie_gap=float(human_tie_gap),
        ref_logits=r["logits"].astype(np.float64), var_logits=v["logits"].astype(np.float64),
        temperature=temperature, targets=np.where(known, labels, ref_pred).astype(np.int64),
        var_temperature=var_temperature,
    )
    return evaluation

"""The ``summary`` dict of an evaluation: the named numbers the reports and ``metrics.json``
show (keys listed in :func:`metrics.evaluate.evaluate`)."""

import numpy as np


def _nan_stat(values, fn):
    """``fn`` of the non-NaN values (NaN when there are none)."""
    values = values[~np.isnan(values)]
    return float(fn(values)) if values.size else float("nan")


def summarise(ev):
    """The summary dict of ``ev`` (a :class:`metrics.evaluation.Evaluation`)."""
    df, d = ev.per_example, ev.detail
    value = ev.value
    flips = df["flip"].to_numpy()
    cert = df["certified"].to_numpy()
    return {
        "n_examples": int(len(df)),
        "agreement": value("agreement", statistic="rate"),
        "flip_rate": value("flip", statistic="rate"),
        "negative_flips": int(df["negative_flip"].sum()),
        "positive_flips": int(df["positive_flip"].sum()),
        "accuracy_ref": value("accuracy_ref"),
        "accuracy_variant": value("accuracy_variant"),
        "kl_mean": value("kl", statistic="mean"),
        "kl_p50": value("kl", statistic="p50"),
        "kl_p95": value("kl", statistic="p95"),
        "kl_p99": value("kl", statistic="p99"),
        "kl_max": value("kl", statistic="max"),
        "max_abs_logit_diff_max": value("max_abs_logit_diff", statistic="max"),
        "epsilon": ev.epsilon,
        "certified_share": value("certified_share"),
        "certified_flips": int((flips & cert).sum()),
        "certified_flip_ids": df["id"][flips & cert].astype(str).tolist(),
        "ece_ref": value("ece_ref"),
        "ece_variant": value("ece_variant"),
        "ece_delta": value("ece_delta"),
        "smece_ref": value("smece_ref"),
        "smece_variant": value("smece_variant"),
        "smece_delta": value("smece_delta"),
        "score_abs_err_mean": _nan_stat(df["abs_score_error"].to_numpy(), np.mean),
        "score_abs_err_max": _nan_stat(df["abs_score_error"].to_numpy(), np.max),
        "action_max_abs_diff_max": _nan_stat(df["action_max_abs_diff"].to_numpy(), np.max),
        "action_agreement": value("action_agreement", statistic="rate"),
        "n_near_tie": int(df["near_tie"].sum()),
        "near_tie_flip_rate": value("flip", "near_tie", "rate"),
        # in-depth checks
        "epsilon_conformal": ev.epsilon_conformal,
        "alpha": ev.alpha,
        "conformal_coverage": value("within_conformal", statistic="rate"),
        "certified_share_conformal": value("certified_share_conformal"),
        "certified_conformal_flips": int((flips & d["certified_conformal"].to_numpy()).sum()),
        "epsilon_exceeded_ids": df["id"][d["epsilon_exceeded"].to_numpy()].astype(str).tolist(),
        "bound_violations": int(d["bound_violation"].sum()),
        "mask_mismatches": int(d["mask_mismatch"].sum()),
        "kl_reverse_mean": value("kl_reverse", statistic="mean"),
        "prob_tv_max": value("prob_tv", statistic="max"),
        "action_tv_max": value("action_tv", statistic="max"),
        "abs_delta_top_prob_p95": value("abs_delta_top_prob", statistic="p95"),
        "confidence_drift_max": _nan_stat(d["confidence_drift"].to_numpy(), np.max),
        "n_human_near_tie": int(d["human_near_tie"].sum()),
        "numerical_noise": ev.numerical_noise,
        "n_numerical_tie": int(d["numerical_tie"].sum()),
        "numerical_tie_flips": int((flips & d["numerical_tie"].to_numpy(bool)).sum()),
        "human_near_tie_flip_rate": value("flip", "human_near_tie", "rate"),
        "brier_ref": value("brier_ref"),
        "brier_variant": value("brier_variant"),
        "nll_ref": value("nll_ref"),
        "nll_variant": value("nll_variant"),
        "ece_mass_ref": value("ece_mass_ref"),
        "ece_mass_variant": value("ece_mass_variant"),
        "classwise_ece_ref": value("classwise_ece_ref"),
        "classwise_ece_variant": value("classwise_ece_variant"),
        "temperature_refit_log_ratio": value("temperature_refit_log_ratio"),
    }

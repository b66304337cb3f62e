"""The per-variant report's tables (flips by stratum, drift, calibration) and its worst
examples, computed from an evaluation; :mod:`contracts.report` renders them (Markdown, JSON).
"""

import math

import numpy as np
import pandas as pd

from metrics.defaults import N_BINS

#: Per-example quantities of the drift section: (column, label).
DRIFT_ROWS = (
    ("kl", "KL(ref ‖ variant), nats"),
    ("kl_reverse", "KL(variant ‖ ref), nats"),
    ("delta_top_prob", "Δp of the reference's top option"),
    ("abs_delta_top_prob", "|Δp| of the reference's top option"),
    ("confidence_drift", "|Δ entropy confidence|"),
    ("abs_score_error", "|Δ expected score|"),
    ("action_max_abs_diff", "max |Δ action probability|"),
    ("action_tv", "action total variation"),
    ("max_abs_logit_diff", "max |Δlogit| (raw)"),
)
CALIBRATION_ROWS = (("ece_width", f"ECE, {N_BINS} equal-width bins"), ("ece_mass", "ECE, equal-mass bins"),
                    ("classwise_ece", "classwise ECE"), ("brier", "Brier score"),
                    ("nll", "NLL, nats"))
EXCERPT_CHARS = 90


def _num(x):
    """JSON-safe float: NaN → None, numpy scalars → Python."""
    if x is None:
        return None
    if isinstance(x, (bool, int, str)):
        return x
    x = float(x)
    return None if math.isnan(x) else x


def _ci_text(low, high, f="{:.4g}"):
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "—"
    return f"[{f.format(low)}, {f.format(high)}]"


def flip_strata(ev):
    """Names of the strata the flip table reports on, for this evaluation."""
    m = ev.near_tie_margin
    strata = ["all", "near_tie", "not_near_tie"]
    edges = [0.0, m, 2 * m, 4 * m] if m > 0 else [0.0]
    strata += [f"margin:{a:g}-{b:g}" for a, b in zip(edges[:-1], edges[1:])]
    strata += [f"margin:{edges[-1]:g}-inf"]
    strata += ["certified", "uncertified", "human_near_tie", "numerical_tie", "decided"]
    strata += [f"options:{k}" for k in sorted(ev.per_example["n_options"].unique())]
    strata += [f"task:{t}" for t in sorted(ev.per_example["task"].unique())]
    return strata


def flip_table(ev):
    """Flips per stratum: n, flips, flip rate, negative / positive flips and rates (Yan et al.).

    Returns
    -------
    pandas.DataFrame
        One row per :func:`flip_strata` entry; rates are NaN on an empty stratum.
    """
    rows = []
    for s in flip_strata(ev):
        n = int(ev.rows(s).sum())
        rows.append({"stratum": s, "n": n,
                     "flips": ev.value("flip", s, "count") if n else 0.0,
                     "flip_rate": ev.value("flip", s, "rate"),
                     "negative_flips": ev.value("negative_flip", s, "count") if n else 0.0,
                     "negative_flip_rate": ev.value("negative_flip", s, "rate"),
                     "positive_flips": ev.value("positive_flip", s, "count") if n else 0.0,
                     "n_labeled": ev.support("negative_flip", s)})
    return pd.DataFrame(rows)


def drift_table(ev):
    """llama.cpp-style summary (mean ± SE, RMS, max … min) of each :data:`DRIFT_ROWS` column."""
    from metrics.distribution import describe
    from metrics.registry import spec

    rows = []
    for col, label in DRIFT_ROWS:
        frame = ev.detail if spec(col).detail else ev.per_example
        rows.append({"quantity": label, "column": col,
                     **describe(frame[col].to_numpy(dtype=np.float64))})
    return pd.DataFrame(rows)


def calibration_table(ev, *, n_boot=1000, confidence=0.95, seed=0):
    """Each calibration figure for reference, variant and their difference, with bootstrap CIs
    (cached on ``ev``, so the Markdown and JSON reports share one computation)."""
    key = ("calibration_table", n_boot, confidence, seed)
    if key in ev._cache:
        return ev._cache[key]
    rows = []
    for fig, label in CALIBRATION_ROWS:
        row = {"figure": label, "metric": fig}
        for which in ("ref", "variant", "delta"):
            m = f"{fig}_{which}"
            row[which] = ev.value(m)
            row[f"{which}_ci"] = ev.ci(m, n_boot=n_boot, confidence=confidence, seed=seed)
        rows.append(row)
    ev._cache[key] = pd.DataFrame(rows)
    return ev._cache[key]


def _top2(probs, mask):
    z = np.where(mask, probs, -np.inf)
    order = np.argsort(-z, kind="stable")[:2]
    return ", ".join(f"#{k} {probs[k]:.3f}" for k in order if mask[k])


#: set-level metrics moved by identifiable rows: those rows rank first among the worst examples
#: (the accuracy drop is the negative flips' share minus the positive flips'), then by KL
SET_DRIVERS = {"accuracy_drop": "negative_flip", "accuracy_variant": "negative_flip"}
#: per-example drift that orders the worst examples of a set-level clause (and breaks ties) for
#: a head that is not a softmax (a softmax: ``kl``)
HEAD_DRIFT = {"regression": "value_rel_error", "multi_label": "label_prob_max_abs_diff"}


def _answers(ev, i, outputs):
    """Both models' answers on row ``i``: the top-2 options ("#k p") of a softmax, the output
    value of a regression head, the labels decided yes (sigmoid >= 0.5) of a multi-label one."""
    if outputs == "regression":
        return {"ref_value": _num(ev.ref_logits[i, 0]), "var_value": _num(ev.var_logits[i, 0])}
    if outputs == "multi_label":
        def yes(z):
            return " ".join(f"#{k}" for k in np.flatnonzero((z >= 0) & ev.option_mask[i])) or "none"
        return {"ref_labels": yes(ev.ref_logits[i]), "var_labels": yes(ev.var_logits[i])}
    return {"ref_top2": _top2(ev.ref_probs[i], ev.option_mask[i]),
            "var_top2": _top2(ev.var_probs[i], ev.option_mask[i])}


def worst_examples(ev, result, *, texts=None, n=5):
    """The examples that drive a clause's value, worst first.

    Parameters
    ----------
    ev : metrics.evaluate.Evaluation
    result : contracts.checker.ClauseResult
    texts : mapping of id -> str, optional
        For the excerpt.
    n : int, default=5

    Returns
    -------
    list of dict
        ``id``, ``excerpt``, ``ref_top2`` and ``var_top2`` ("#k p" pairs; a regression head:
        ``ref_value`` / ``var_value``; a multi-label head: ``ref_labels`` / ``var_labels``, the
        labels decided yes), ``metric`` (the clause's per-example value; for a set-level metric
        the example's KL, or the head's drift of :data:`HEAD_DRIFT`, with the rows that move it
        first for those in :data:`SET_DRIVERS`), ``label``.
    """
    from metrics.registry import SET, spec

    rows = np.flatnonzero(ev.rows(result.stratum))
    metric = result.metric
    driver = SET_DRIVERS.get(metric)
    outputs = getattr(ev, "outputs", "softmax")
    drift = HEAD_DRIFT.get(outputs, "kl")  # what orders rows: KL of a softmax, else the head's
    if spec(metric).kind == SET:
        metric = drift
    values = ev._array(metric)[rows]
    lower_is_worse = result.op == ">="  # a min bound: the lowest values drive the clause
    key = np.where(np.isnan(values), -np.inf, -values if lower_is_worse else values)
    if driver is not None:  # the rows that move the set-level value first, then by KL
        key = ev._array(driver)[rows].astype(float)
    # tie-break by KL so that among equal bools the most drifted rows come first
    kl = ev._array(drift)[rows]
    order = np.lexsort((-kl, -key))[:n]
    out = []
    df = ev.per_example
    for i in rows[order]:
        eid = str(df["id"].iat[i])
        text = (texts or {}).get(eid, "")
        text = " ".join(text.split())
        out.append({"id": eid,
                    "excerpt": text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS - 1] + "…",
                    "label": int(df["label"].iat[i]),
                    **_answers(ev, i, outputs),
                    "metric": _num(ev._array(metric)[i]), "metric_name": metric})
    return out

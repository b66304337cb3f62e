"""Per-variant reports (Markdown and JSON) from an evaluation and a verdict.

The run-level report (summary table, timing, cold start, report.md of a sweep) is in
:mod:`runs.report`.
"""

import math

import numpy as np
import pandas as pd

from contracts.report_tables import (_ci_text, _num, calibration_table, drift_table,  # noqa: F401
                                     flip_table, worst_examples)  # (re-exported: runs.report)
from metrics.defaults import NUMERICAL_TIE_MULTIPLE

#: What the ``interval`` column of a clause table means (said under every such table).
INTERVAL_NOTE = ("Intervals (`interval` column): `clopper-pearson` = exact binomial interval "
                 "for rates and counts of events (flips, agreement, certified share, accuracy), "
                 "honest at 0 and n events; `tango-paired-score` = the accuracy drop's "
                 "interval, negative minus positive flip rate on the same rows, Tango's score "
                 "interval (honest with no flip either way; `clopper-pearson-difference` in "
                 "results saved before it); `bootstrap-percentile` = seeded percentile bootstrap "
                 "over examples for every other figure; `—` = none. `detectable` = the smallest "
                 "violation (metric units, past the bound) the clause's n rows can show at the "
                 "interval's level; an `undecided` clause's value meets the bound but its "
                 "interval does not (not a pass), and its status says about how many more rows "
                 "would decide it at the observed rate.")

# -- per-variant in-depth report (``variants check``) -------------------------------------------
#: Version of the JSON written by :func:`variant_report_json` (``<variant>/report.json``) and of
#: ``check.json``; bump on any change of keys or meaning. Documented in results/README.md.
REPORT_SCHEMA_VERSION = 1
def _md(frame, floatfmt=".4g"):
    return frame.to_markdown(index=False, floatfmt=floatfmt)


def render_variant_report(name, ev, verdict, contract, epsilons, *, texts=None, worst_n=5,
                          n_boot=None, confidence=None, seed=None):
    """Markdown report of one variant: clauses with CIs, certificate, bounds, calibration,
    drift, flips by stratum, and the worst examples of each failing clause.

    Parameters
    ----------
    name : str
    ev : metrics.evaluate.Evaluation
    verdict : contracts.checker.Verdict
    contract : contracts.checker.Contract
    epsilons : dict
        :func:`metrics.conformal.epsilon_by_bucket` of the calibration split, plus ``alpha``.
    texts : mapping of id -> str, optional
    worst_n : int, default=5

    Returns
    -------
    str
    """
    from metrics.conformal import coverage

    st = verdict.settings or contract.settings
    n_boot = st.get("n_bootstrap", 1000) if n_boot is None else n_boot
    confidence = st.get("confidence", 0.95) if confidence is None else confidence
    seed = st.get("seed", 0) if seed is None else seed
    alpha = epsilons["alpha"]
    s = ev.summary
    lines = [f"# {name}: {verdict.word} — contract `{contract.name}`", "",
             f"{contract.description}", "",
             f"Settings: near-tie margin {ev.near_tie_margin:g}, human tie gap {ev.human_tie_gap:g}, "
             f"α = {alpha:g}, {n_boot} bootstrap resamples, {confidence:.0%} intervals, seed {seed}.",
             ""]
    if getattr(ev, "n_nonfinite", 0):  # metrics.finite: rows no metric can read
        eval_bad = len(ev.nonfinite.get("eval", ()))
        lines += [f"**{ev.nonfinite_text()}** (clause `finite-outputs`). Every other clause is "
                  f"judged on the {len(ev.per_example)} eval rows left"
                  + (f" ({eval_bad} left out)" if eval_bad else "")
                  + ("; a calibration row without numbers is an unbounded drift: ε = inf, "
                     "nothing certified" if ev.nonfinite.get("calibration") else "") + ".", ""]
    lines += ["====== Clauses ======", ""]
    frame = pd.DataFrame([{
        "clause": r.id, "metric": r.metric, "stratum": r.stratum, "statistic": r.statistic,
        "value": r.value, "CI": _ci_text(r.ci_low, r.ci_high), "interval": r.interval or "—",
        "bound": f"{'CI ' if r.compare == 'ci' else ''}{r.op} {r.threshold:g}", "n": r.n,
        "detectable": "—" if r.detectable is None else f"{r.detectable:.3g}",
        "status": r.status} for r in verdict.results])
    lines += [_md(frame), "", INTERVAL_NOTE, ""]
    outputs = getattr(ev, "outputs", "softmax")
    if outputs != "softmax":  # a multi-label or regression head: no softmax section applies
        from metrics.head_view import figures_text

        lines += ["====== What the head outputs ======", "", figures_text(s, outputs), ""]
        return "\n".join(lines + _worst_lines(ev, verdict, texts, worst_n)) + "\n"

    # certificate
    lines += ["====== Margin certificate ======", "",
              "ε two ways on the calibration split: the maximum of max_k|Δlogit_k|, and the "
              f"split-conformal quantile (the ⌈(n+1)(1−α)⌉-th smallest, α = {alpha:g}), which "
              "bounds a new example's max|Δlogit| with probability ≥ 1 − α if calibration and eval "
              "examples are exchangeable. Coverage is measured on the eval split.", ""]
    diff = ev.per_example["max_abs_logit_diff"].to_numpy()
    k = ev.per_example["n_options"].to_numpy()
    margin = ev.per_example["ref_margin"].to_numpy()
    flips = ev.per_example["flip"].to_numpy()
    cert_rows = []
    for bucket, e in epsilons.items():
        if bucket == "alpha":
            continue
        sel = np.ones(len(k), bool) if bucket == "all" else k == int(bucket)
        row = {"bucket": "all" if bucket == "all" else f"K={bucket}", "n cal": e["n"],
               "n eval": int(sel.sum()), "ε max": e["epsilon_max"],
               "ε conformal": e["epsilon_conformal"],
               "coverage (ε conf.)": coverage(diff[sel], e["epsilon_conformal"]) if sel.any() else np.nan,
               "promised": 1 - alpha,
               "coverage (ε max)": coverage(diff[sel], e["epsilon_max"]) if sel.any() else np.nan}
        cert = margin[sel] > 2 * e["epsilon_max"]
        row["certified (bucket ε max)"] = cert.mean() if sel.any() else np.nan
        row["certified flips"] = int((cert & flips[sel]).sum())
        cert_rows.append(row)
    lines += [_md(pd.DataFrame(cert_rows)), ""]
    lines += [f"Certified (margin > 2ε, ε = ε max of all buckets = {ev.epsilon:.4g}): "
              f"{s['certified_share']:.1%}; flips among them: {s['certified_flips']}. With the "
              f"conformal ε ({ev.epsilon_conformal:.4g}): {s['certified_share_conformal']:.1%}, "
              f"{s['certified_conformal_flips']} flips.", ""]
    exceeded = s["epsilon_exceeded_ids"]
    lines += [f"Eval examples where max|Δlogit| exceeded ε ({len(exceeded)}): "
              + (", ".join(exceeded) if exceeded else "none") + ".", ""]

    # bounds
    bt = ev.bounds_table()
    lines += ["====== Bounds implied by ε ======", "",
              "With ε the certificate's bound and T the bucket's temperature: every ratio p′/p of "
              "an option or action probability lies in [e^(−2ε/T), e^(2ε/T)]; TV ≤ 1 − e^(−2ε/T); "
              "|Δ expected score| ≤ TV bound × (max − min score); KL ≤ 2ε/T. Observed = worst case "
              "over eval examples where ε held. An observed value above its bound is a checker or "
              "model bug.", ""]
    if bt.empty:
        lines += ["(no temperature in the outputs: bounds not checked)", ""]
    else:
        show = pd.DataFrame({
            "K": bt["n_options"], "T": bt["T"], "n": bt["n_held"], "2ε/T": bt["2eps_over_T"],
            "ratio bound": [f"[{math.exp(-b):.4g}, {math.exp(b):.4g}]" for b in bt["2eps_over_T"]],
            "max |log p′/p|": bt["log_ratio_observed"],
            "max |log a′/a|": bt["action_log_ratio_observed"],
            "TV bound": bt["tv_bound"], "TV obs.": bt["tv_observed"],
            "KL bound": bt["kl_bound"], "KL obs.": bt["kl_observed"],
            "Δscore bound": bt["score_bound"], "Δscore obs.": bt["score_observed"],
            "violated": bt["violated"].replace("", "none")})
        lines += [_md(show), ""]
        t_min = float(bt["T"].min())
        lines += [f"A temperature of {t_min:.3g} multiplies ε by {1 / t_min:.3g} before the "
                  f"softmax (T ≈ 0.1 multiplies it by 10). Per-example check against each "
                  f"example's own max|Δlogit|: {s['bound_violations']} violation(s).", ""]

    # calibration
    lines += ["====== Calibration ======", ""]
    n_unlabeled = int((ev.per_example["label"] < 0).sum())
    lines += [f"Targets: the label for {len(ev.per_example) - n_unlabeled} examples, the "
              f"reference's top-1 option for {n_unlabeled} unlabeled ones. {confidence:.0%} "
              f"percentile-bootstrap intervals ({n_boot} resamples, seed {seed}). Binned ECEs are "
              "biased upward under resampling (repeated rows fill bins unevenly), so their "
              "interval can sit above the point value; the Δ intervals pair both models on the "
              "same resamples and are the ones to read.", ""]
    ct = calibration_table(ev, n_boot=n_boot, confidence=confidence, seed=seed)
    lines += [_md(pd.DataFrame({
        "figure": ct["figure"],
        "reference": [f"{v:.4f} {_ci_text(*c, f='{:.4f}')}" for v, c in zip(ct["ref"], ct["ref_ci"])],
        "variant": [f"{v:.4f} {_ci_text(*c, f='{:.4f}')}" for v, c in zip(ct["variant"], ct["variant_ci"])],
        "Δ": [f"{v:+.4f} {_ci_text(*c, f='{:+.4f}')}" for v, c in zip(ct["delta"], ct["delta_ci"])],
    })), ""]
    tt = ev.temperature_table()
    if not tt.empty:
        lines += ["Temperature refit (NLL over log T, scipy) per option-count bucket, on eval:", "",
                  _md(tt), ""]
    from metrics.calibration import reliability_diagram
    rd = reliability_diagram(ev.var_probs, ev.targets, ev.option_mask, n_bins=ev.n_bins)
    rdf = pd.DataFrame(rd)
    rdf = rdf[rdf["count"] > 0]
    lines += ["Reliability diagram data (variant, equal-width bins):", "", _md(rdf), ""]

    # drift
    dt = drift_table(ev)
    lines += ["====== Drift of what the API exposes ======", "",
              _md(dt.drop(columns=["column"]).rename(columns={"sem": "± SE"}), floatfmt=".3g"), "",
              f"Action agreement {s['action_agreement']:.4f}.", ""]

    # flips
    ft = flip_table(ev)
    lines += ["====== Flips by stratum ======", "",
              f"Near tie: reference margin < {ev.near_tie_margin:g}; human near tie: raters' top-two "
              f"share gap ≤ {ev.human_tie_gap:g}; numerical tie: reference margin ≤ "
              f"{NUMERICAL_TIE_MULTIPLE:g} × the reference's own numerical noise "
              f"({ev.numerical_noise:.3g}, two compute paths), decided: every other row. "
              "Negative flip = reference right, variant wrong; "
              "positive = the reverse (Yan et al. 2020); rates over labeled examples.", "",
              _md(ft, floatfmt=".4g"), ""]

    return "\n".join(lines + _worst_lines(ev, verdict, texts, worst_n)) + "\n"


def _worst_lines(ev, verdict, texts, worst_n):
    """The report's worst examples of each failing clause (none when every clause passes)."""
    lines = []
    failing = [r for r in verdict.results if r.passed is False]
    if failing:
        lines += ["====== Worst examples of failing clauses ======", ""]
        for r in failing:
            worst = worst_examples(ev, r, texts=texts, n=worst_n)
            lines += [f"**{r.id}** ({r.metric}, {r.stratum}; value {r.value:.4g} {r.op} "
                      f"{r.threshold:g} fails):", ""]
            if worst:
                lines += [_md(pd.DataFrame(worst)), ""]
    return lines


#: report.json blocks that are softmax figures (temperature bounds, calibration, reliability,
#: KL / probability drift, flips of the top option by stratum): null on a multi-label or
#: regression run, and named in its ``not_applicable`` list
SOFTMAX_BLOCKS = ("bounds", "calibration", "temperatures", "reliability_variant", "drift",
                  "flips")


def variant_report_json(name, ev, verdict, contract, epsilons, *, texts=None, worst_n=5):
    """The machine-readable twin of :func:`render_variant_report` (schema
    ``REPORT_SCHEMA_VERSION``, see results/README.md). NaN becomes null."""
    st = verdict.settings or contract.settings
    n_boot, conf, seed = st.get("n_bootstrap", 1000), st.get("confidence", 0.95), st.get("seed", 0)

    def records(frame):
        return [{k: (_num(v) if not isinstance(v, (str, list, tuple)) else v) for k, v in r.items()}
                for r in frame.to_dict("records")]

    outputs = getattr(ev, "outputs", "softmax")
    if outputs != "softmax":  # a multi-label or regression head: the softmax blocks are null
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "variant": name,
            "contract": {"name": contract.name, "source": contract.source},
            "verdict": verdict.to_dict(),
            "outputs": outputs,
            "epsilon": {str(k): ({kk: _num(vv) for kk, vv in v.items()} if isinstance(v, dict)
                                 else _num(v)) for k, v in epsilons.items()},
            "summary": {k: (v if isinstance(v, list) or v is None else _num(v))
                        for k, v in ev.summary.items()},
            **{k: None for k in SOFTMAX_BLOCKS},
            "not_applicable": list(SOFTMAX_BLOCKS),
            "worst": {r.id: worst_examples(ev, r, texts=texts, n=worst_n)
                      for r in verdict.results if r.passed is False},
        }
    ct = calibration_table(ev, n_boot=n_boot, confidence=conf, seed=seed)
    calib = {r["metric"]: {w: {"value": _num(r[w]), "ci": [_num(x) for x in r[f"{w}_ci"]]}
                           for w in ("ref", "variant", "delta")} for _, r in ct.iterrows()}
    from metrics.calibration import reliability_diagram
    rd = reliability_diagram(ev.var_probs, ev.targets, ev.option_mask, n_bins=ev.n_bins)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "variant": name,
        "contract": {"name": contract.name, "source": contract.source},
        "verdict": verdict.to_dict(),
        "epsilon": {str(k): ({kk: _num(vv) for kk, vv in v.items()} if isinstance(v, dict) else _num(v))
                    for k, v in epsilons.items()},
        "summary": {k: (v if isinstance(v, list) else _num(v)) for k, v in ev.summary.items()},
        "bounds": records(ev.bounds_table()),
        "calibration": calib,
        "temperatures": records(ev.temperature_table()),
        "reliability_variant": {k: [_num(x) for x in v] for k, v in rd.items()},
        "drift": records(drift_table(ev)),
        "flips": records(flip_table(ev)),
        "worst": {r.id: worst_examples(ev, r, texts=texts, n=worst_n)
                  for r in verdict.results if r.passed is False},
    }

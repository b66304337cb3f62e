"""The data of a run's HTML report: one JSON-ready dict, written as the run's ``report.json``
and embedded unchanged in ``report.html`` (no MLX, no matplotlib).

Everything comes from the run folder as ``variants sweep`` / ``variants check`` leave it:
run.json, summary.csv, each variant's verdict.json, report.json, timing.json and the saved
outputs (for the flipped examples and the reliability diagrams before and after the
temperature refit, Guo et al. 2017).
"""

import math
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from runs.io import digest
from runs.report_facts import cpu_text

#: Version of the run-level report.json (``kind`` "run-report"); bump on any change of keys or
#: meaning.
HTML_REPORT_SCHEMA_VERSION = 1
#: Flipped examples listed per variant (the rest are counted).
N_FLIPPED = 20
#: Characters of example text kept in the flipped-examples table.
TEXT_CHARS = 240
#: Keys of a verdict clause carried into the clause table.
CLAUSE_KEYS = ("id", "metric", "stratum", "statistic", "value", "op", "threshold", "ci_low",
               "ci_high", "interval", "n", "status", "why", "compare", "reason")
#: Order of clause statuses in the clause table: failures first, then untested, then passes.
STATUS_ORDER = {"FAIL": 0, "undecided": 1, "no examples": 1, "pass": 2}


def num(x):
    """JSON-safe number: NaN/inf → None, numpy scalars → Python; other values unchanged."""
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    return x


def clean(obj):
    """``obj`` with every float made JSON-safe (:func:`num`), recursively."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [clean(v) for v in obj.tolist()]
    return num(obj)


def contract_digest(verdict):
    """16-hex SHA-256 of the contract as judged: each clause's id, metric, stratum, statistic,
    op, threshold and compare mode, and the settings (from a verdict.json dict)."""
    spec = [{k: c.get(k) for k in ("id", "metric", "stratum", "statistic", "op", "threshold",
                                   "compare")} for c in verdict.get("clauses", [])]
    return digest(verdict.get("contract"), spec, verdict.get("settings", {}))


def clause_rows(verdict, settled=()):
    """The clause table of one variant, failures first (contract order within a status).

    ``margin`` is the room left to the threshold in the metric's units: value − threshold for a
    ``>=`` clause, threshold − value for ``<=`` (negative = past it). ``decided_by`` says whether
    sequential stopping decided the clause (ids in ``settled``) or all ``n`` rows did.
    """
    rows = []
    for i, c in enumerate(verdict.get("clauses", [])):
        r = {k: num(c.get(k)) for k in CLAUSE_KEYS}
        v, t = r["value"], r["threshold"]
        r["margin"] = None if v is None or t is None else (v - t if r["op"] == ">=" else t - v)
        r["decided_by"] = "sequential stopping" if r["id"] in settled else f"all {r['n']} rows"
        r["order"] = i
        rows.append(r)
    rows.sort(key=lambda r: (STATUS_ORDER.get(str(r["status"]).split(":")[0], 1), r["order"]))
    return rows


def verdict_word(verdict):
    """"pass", "fail", "undecided" (no clause failed, one or more undecided: not a pass) or
    "untested" (no clause failed or undecided but some had no examples, or no clause was judged
    at all: a variant without verdict.json is never shown passing)."""
    if not verdict.get("clauses"):
        return "untested"
    if verdict.get("failed"):
        return "fail"
    if verdict.get("undecided"):
        return "undecided"
    return "untested" if verdict.get("untested") else "pass"


def _top(probs, logits, mask):
    """(index of the top option, its probability, raw top-2 logit margin) of one row."""
    z = np.where(mask, logits, -np.inf)
    order = np.argsort(-z, kind="stable")
    k = int(order[0])
    margin = float(z[order[0]] - z[order[1]]) if mask.sum() > 1 else math.inf
    return k, float(probs[k]), margin


def _true(x):
    """``x`` is True: False for pandas' NA (the label-dependent columns of an unlabelled row)."""
    return x is not None and x is not pd.NA and bool(x)


def flipped_examples(ref, var, per_example, texts, n=N_FLIPPED):
    """The first ``n`` eval rows (eval order) whose top option differs, with their text and both
    models' top option, its probability and top-2 logit margin. ``kind``: "negative" (the
    reference right, the variant wrong), "positive" (the other way), "both wrong" (a labelled
    row neither gets right) or "unlabelled" (label -1, where ``negative_flip`` and
    ``positive_flip`` are NA).

    Parameters
    ----------
    ref, var : dict of ndarray
        outputs.npz arrays (``logits``, ``probs`` (N, K) float32, ``option_mask`` (N, K) bool).
    per_example : pandas.DataFrame
        ``metrics.evaluate.Evaluation.per_example`` (``id``, ``flip``, ``label``,
        ``negative_flip``, ``positive_flip`` (nullable ``boolean``, NA where the label is -1),
        ``near_tie``, ``certified``).
    texts : mapping of id -> str
    """
    rows = []
    mask = ref["option_mask"]
    for i in np.flatnonzero(per_example["flip"].to_numpy(bool))[:n]:
        eid = str(per_example["id"].iat[i])
        rk, rp, rm = _top(ref["probs"][i], ref["logits"][i], mask[i])
        vk, vp, vm = _top(var["probs"][i], var["logits"][i], mask[i])
        text = " ".join((texts.get(eid) or "").split())
        label = int(per_example["label"].iat[i])
        rows.append({"row": int(i), "id": eid,
                     "text": text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 1] + "…",
                     "label": label,
                     "ref_top": rk, "ref_prob": rp, "ref_margin": num(rm),
                     "var_top": vk, "var_prob": vp, "var_margin": num(vm),
                     "kind": ("unlabelled" if label < 0 else
                              "negative" if _true(per_example["negative_flip"].iat[i]) else
                              "positive" if _true(per_example["positive_flip"].iat[i]) else
                              "both wrong"),
                     "near_tie": bool(per_example["near_tie"].iat[i]),
                     "certified": bool(per_example["certified"].iat[i])})
    return rows


def reliability(probs, labels, mask, n_bins):
    """:func:`metrics.calibration.reliability_diagram` of ``probs`` as JSON-safe lists."""
    from metrics.calibration import reliability_diagram

    return clean(reliability_diagram(probs, labels, mask, n_bins=n_bins))


def refit_reliability(ev, temperatures):
    """Reliability data of the variant at its own refitted temperature per option count
    (``T_refit_variant`` of the temperature table; a bucket without a finite fit keeps its
    deployed probabilities)."""
    from metrics.softmax import masked_softmax

    probs = np.array(ev.var_probs, dtype=np.float64)
    k = ev.option_mask.sum(axis=1)
    for t in temperatures:
        sel = k == t["n_options"]
        T = t.get("T_refit_variant")
        if T is not None and math.isfinite(T) and sel.any():
            probs[sel] = masked_softmax(ev.var_logits[sel], ev.option_mask[sel], T)
    return reliability(probs, ev.targets, ev.option_mask, ev.n_bins)


def sweep_time(meta):
    """run.json's ``sweep_time`` with the Amdahl ceiling 1 / (1 − share) of each part: the most
    the whole sweep could speed up were that part free (:func:`variants.sweep.profile.amdahl`'s
    formula, repeated here to keep this module free of MLX)."""
    b = meta.get("sweep_time")
    if not b:
        return None
    parts = [{"part": k, "seconds": num(v), "share": num(b["share"][k]),
              "amdahl_ceiling": num(1.0 / (1.0 - b["share"][k]) if b["share"][k] < 1 else None)}
             for k, v in sorted(b["seconds"].items(), key=lambda kv: -kv[1])]
    return clean({"wall_s": b.get("wall_s"), "parts": parts,
                  "outside_forward_share": b.get("outside_forward_share"),
                  "target_outside_share": b.get("target_outside_share"),
                  "forward_categories": b.get("forward_categories"), "counts": b.get("counts")})


def git_commit(path):
    """The git commit of the checkout holding ``path`` (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance(meta, timings, contract, bootstrap_seed):
    """Versions, commit, seeds, contract (name, digest), data fingerprints, checkpoint, BLAS,
    kernels (per variant, from timing.json) of a run."""
    cfg = meta.get("config", {})
    data = meta.get("data", {})
    return clean({
        "versions": meta.get("versions", {}),
        "git_commit": meta.get("git_commit") or git_commit(Path(__file__).resolve().parent),
        "seeds": {"sweep": cfg.get("seed"),
                  "contract_bootstrap": bootstrap_seed},
        "contract": {"name": contract.get("name") or meta.get("contract"),
                     "digest": contract.get("digest")},
        "data": {"source": data.get("source"),
                 "fingerprints": {k: v.get("fingerprint")
                                  for k, v in data.get("splits", {}).items()},
                 "sizes": {k: v.get("n") for k, v in data.get("splits", {}).items()}},
        "checkpoint": meta.get("checkpoint", {}),
        "blas": meta.get("blas", {}), "parallel": meta.get("parallel"),
        "device": meta.get("device"), "dtype": meta.get("dtype"),
        "kernels": {n: (t.get("kernel") or {}).get("variant") for n, t in timings.items()},
        "int8": {n: _int8_text(t.get("int8")) for n, t in timings.items() if t.get("int8")},
        "cpu": cpu_text(meta.get("cpu")),
        "temperatures": meta.get("temperatures", {}),
    })


def _int8_text(rec):
    return f"{rec.get('scheme')} on oneDNN {rec.get('isa')}"


def judged_text(build, speed_mode):
    """Which model variant's verdict belongs to (build.json's ``quality_mode`` and
    ``timed_check``, variants/sweep/timed_check.py): one phrase for the report page."""
    from runs.report_elsewhere import OUTPUTS_FAMILY

    mode, check = build.get("quality_mode"), build.get("timed_check") or {}
    if build.get("family") == OUTPUTS_FAMILY:
        return "logits from an outputs file (made by another runtime; not timed here)"
    if mode == speed_mode or check.get("same_model"):
        return f"the timed ({speed_mode}) model itself"
    if "max_abs_dlogit" in check:
        return (f"{mode} mode; timed {speed_mode} build checked equal on every eval row "
                f"(max |Δlogit| {check['max_abs_dlogit']:.2g} <= {check.get('tolerance', 0):.2g})")
    return f"{mode} mode, timed build not checked (an earlier version wrote it)"

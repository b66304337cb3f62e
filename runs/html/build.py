"""Assemble the run-level report dict (:func:`report_data`) from a run folder (no MLX)."""

import json
from pathlib import Path

from metrics.head_view import not_applicable
from runs.html.data import (HTML_REPORT_SCHEMA_VERSION, N_FLIPPED, clause_rows, clean,
                            judged_text,
                            contract_digest, flipped_examples, num, provenance,
                            refit_reliability, reliability, sweep_time, verdict_word)

#: summary.csv columns shown per variant in the banner and the Pareto charts.
HEADLINE = ("family", "bits_per_weight", "model_bytes", "param_ratio", "agreement",
            "certified_share", "ece_ref", "ece_variant", "action_max_abs_diff_max",
            "score_abs_err_max", "accuracy_ref", "accuracy_variant", "negative_flips",
            "positive_flips", "kl_p95", "epsilon", "n_examples", "timed_model_bytes",
            "timed_ref_model_bytes")


def _head_block(row, outputs):
    """A multi-label or regression variant's figures (summary.csv's head columns, the report's
    paragraph): what the page shows in place of the softmax sections."""
    from metrics.head_summary import KEYS
    from metrics.head_view import figures_text

    keys = ("family", "bits_per_weight", "model_bytes", "param_ratio", "n_examples",
            "timed_model_bytes", "timed_ref_model_bytes") + KEYS[outputs]
    summary = {k: num(row.get(k)) for k in keys if k in row}
    return {"summary": clean(summary), "figures": figures_text(row, outputs),
            "reliability": None, "calibration": {}, "near_tie": [], "n_flipped": 0,
            "flipped": []}


def quantile_ci(times_ms, p, confidence=0.95):
    """Distribution-free CI of the ``p`` quantile of ``times_ms`` (order statistics, the binomial
    interval of :func:`scipy.stats.quantile_test`); a side with too few rounds is None."""
    import numpy as np
    from scipy.stats import quantile_test

    x = np.asarray([] if times_ms is None else times_ms, dtype=np.float64)
    if len(x) < 2:
        return [None, None]
    ci = quantile_test(x, q=float(np.quantile(x, p)), p=p).confidence_interval(confidence)
    return [num(ci.low), num(ci.high)]


def _timing(t):
    """One variant's timing.json, kept to what the report shows (p50/p95 with CIs, rounds, why
    timing stopped, memory, kernel, cold start)."""
    def region(entries):
        out = []
        for b, e in sorted(entries.items(), key=lambda kv: int(kv[0])):
            sp = e.get("speedup") or {}  # null: a time too short for the clock
            out.append({"B": int(b), "seq_len": e.get("seq_len"), "rounds": e.get("rounds"),
                        "rounds_requested": e.get("rounds_requested"),
                        "stopped_by": e.get("stopped_by"),
                        "ref": dict(e.get("ref", {}),
                                    p50_ci=quantile_ci(e.get("ref_ms"), 0.5),
                                    p95_ci=quantile_ci(e.get("ref_ms"), 0.95)),
                        "var": dict(e.get("var", {}),
                                    p50_ci=quantile_ci(e.get("var_ms"), 0.5),
                                    p95_ci=quantile_ci(e.get("var_ms"), 0.95)),
                        "speedup": sp.get("speedup_median"),
                        "speedup_ci": [sp.get("speedup_ci_low"), sp.get("speedup_ci_high")],
                        "var_peak_memory_bytes": e.get("var_peak_memory_bytes"),
                        "ref_peak_memory_bytes": e.get("ref_peak_memory_bytes")})
        return out

    out = {"mode": t.get("mode"), "forward": region(t.get("batches", {})),
           "end_to_end": region(t.get("end_to_end", {})),
           "kernel": t.get("kernel"), "cold_start": t.get("cold_start"),
           "model_bytes": t.get("model_bytes")}
    if t.get("measured_elsewhere"):  # an outputs file's own latency (variants judge)
        out["measured_elsewhere"] = t["measured_elsewhere"]
    return clean(out)


def _judged(run, judged_dir, name, file):
    """``<judged_dir>/<name>/<file>`` when it exists (a check written elsewhere), else the
    run folder's."""
    p = judged_dir / name / file if judged_dir is not None else None
    return p if p is not None and p.is_file() else run.path / name / file


def _variant(run, name, row, texts_of, judged_dir=None, outputs="softmax"):
    """Everything the report shows about one variant (a head that is not a softmax: its own
    figures, and no reliability, near-tie or flipped-example data: :func:`_head_block`)."""
    from contracts.report import flip_table

    folder = run.folder
    vpath = _judged(run, judged_dir, name, "verdict.json")
    verdict = (json.loads(vpath.read_text(encoding="utf-8")) if vpath.parent != run.path / name
               else folder.json(name, "verdict.json"))
    rep_path = _judged(run, judged_dir, name, "report.json")
    rep = json.loads(rep_path.read_text(encoding="utf-8")) if rep_path.is_file() else {}
    ev = run.evaluation(name)
    ref, var = run.outputs("reference"), run.outputs(name)
    temps = rep.get("temperatures") or clean(ev.temperature_table().to_dict("records"))
    flips = ev.per_example["flip"].to_numpy(bool)
    summary = {k: num(row.get(k)) for k in HEADLINE if k in row}
    block = {
        "name": name,
        "verdict": verdict_word(verdict),
        "failed": verdict.get("failed", []), "untested": verdict.get("untested", []),
        "undecided": verdict.get("undecided", []),
        "settings": verdict.get("settings", {}),
        "contract": {"name": verdict.get("contract"), "digest": contract_digest(verdict)},
        "clauses": clause_rows(verdict, settled=rep.get("settled", ())),
        "build": clean({k: v for k, v in folder.json(name, "build.json").items()
                        if k in ("family", "config", "bits_per_weight", "model_bytes",
                                 "param_ratio", "ideal_speedup", "skipped")}),
        "timing": _timing(folder.json(name, "timing.json")),
        "temperatures": clean(temps),
    }
    if outputs != "softmax":
        return dict(block, **_head_block(row, outputs))
    return {
        "name": name,
        "verdict": verdict_word(verdict),
        "failed": verdict.get("failed", []), "untested": verdict.get("untested", []),
        "undecided": verdict.get("undecided", []),
        "settings": verdict.get("settings", {}),
        "contract": {"name": verdict.get("contract"), "digest": contract_digest(verdict)},
        "clauses": clause_rows(verdict, settled=rep.get("settled", ())),
        "summary": clean(summary),
        "build": clean({k: v for k, v in folder.json(name, "build.json").items()
                        if k in ("family", "config", "bits_per_weight", "model_bytes",
                                 "param_ratio", "ideal_speedup", "skipped")}),
        "timing": _timing(folder.json(name, "timing.json")),
        "temperatures": clean(temps),
        "reliability": {"reference": reliability(ev.ref_probs, ev.targets, ev.option_mask,
                                                 ev.n_bins),
                        "deployed": reliability(ev.var_probs, ev.targets, ev.option_mask,
                                                ev.n_bins),
                        "refit": refit_reliability(ev, temps)},
        "calibration": rep.get("calibration", {}),
        "near_tie": rep.get("flips") or clean(flip_table(ev).to_dict("records")),
        "n_flipped": int(flips.sum()),
        "flipped": flipped_examples(ref, var, ev.per_example,
                                    texts_of(ev.per_example["id"][flips][:N_FLIPPED])),
    }


def report_data(run_dir, *, variants=None, evaluations=None, texts=None, judged_dir=None,
                status=None):
    """The run-level report of a sweep folder as a JSON-ready dict.

    Parameters
    ----------
    run_dir : path-like or runs.folder.RunFolder
        A finished sweep folder (run.json, summary.csv, each variant's verdict.json,
        timing.json, build.json and outputs).
    variants : list of str, optional
        Only these variants (e.g. the one a model card describes); default all, summary order.
    evaluations : dict of str -> metrics.evaluate.Evaluation, optional
        The judge's evaluations (not recomputed).
    texts : mapping of id -> str, optional
        Example texts; default looked up in the bundled VADER data (:mod:`runs.texts`).
    judged_dir : path-like, optional
        Where ``variants check --output-dir`` wrote each variant's verdict.json and
        report.json (read from there when present).

    Returns
    -------
    dict
        ``schema_version``, ``kind`` ("run-report"), ``run``, ``title``, ``status``, ``config``,
        ``provenance``, ``variants`` (list, one dict per variant), ``cold_start_reference``,
        ``sweep_time``, ``segment_profile``. Floats are finite or None.

    Raises
    ------
    runs.plots.data.PlotError
        Not a finished sweep folder; an unknown name in ``variants``.
    runs.readers.CorruptFileError
        A file that does not parse.
    """
    from runs.plots.data import PlotError, load_run
    from runs.texts import example_texts

    run = load_run(run_dir, evaluations=evaluations)
    names = run.variants
    if variants is not None:
        unknown = [v for v in variants if v not in names]
        if unknown:
            raise PlotError(f"no variant {', '.join(unknown)} in {run.path}; it has: "
                            f"{', '.join(names)}.")
        names = [n for n in names if n in variants]

    def texts_of(ids):
        return {str(i): texts[str(i)] for i in ids if str(i) in texts} if texts is not None \
            else example_texts(ids)

    rows = {str(r["variant"]): r for r in run.summary.to_dict("records")}
    judged_dir = Path(judged_dir) if judged_dir is not None else None
    from metrics.head_view import run_outputs

    meta = run.meta
    outputs = run_outputs(meta)
    blocks = [_variant(run, n, rows[n], texts_of, judged_dir, outputs) for n in names]
    cfg = meta.get("config", {})
    settings = [b.pop("settings") for b in blocks]
    timings = {n: run.folder.json(n, "timing.json") for n in names}
    judged = {n: judged_text(run.folder.json(n, "build.json"),
                             (timings[n] or {}).get("mode") or cfg.get("speed_mode"))
              for n in names}
    cold = meta.get("cold_start") or {}
    params = ", ".join(f"{k} {v}" for k, v in (cfg.get("params") or {}).items()
                       if v not in (None, ""))
    return clean({
        "schema_version": HTML_REPORT_SCHEMA_VERSION, "kind": "run-report",
        "run": run.name,
        "title": f"{cfg.get('model', '?')} · {cfg.get('family', '?')}"
                 + (f" ({params})" if params else "") + f" · run {run.name}",
        # the writer's final status: run.json gets it only after the reports are in place
        "status": status or meta.get("status", "complete"),
        "label": run.label,
        "config": {k: cfg.get(k) for k in ("model", "family", "quality_mode", "speed_mode",
                                           "near_tie_margin", "timing_rounds", "timing_budget_s",
                                           "n_fit", "n_calibration", "n_eval", "seed")},
        "wall_s": meta.get("wall_s"),
        "provenance": dict(provenance(meta, timings, blocks[0]["contract"] if blocks else {},
                                      settings[0].get("seed") if settings else None),
                           judged=judged),
        "reference": {"model_bytes": meta.get("reference_model_bytes"),
                      "cold_start": cold if "error" not in cold else None},
        "variants": blocks,
        "sweep_time": sweep_time(meta),
        "segment_profile": meta.get("segment_profile"),
        "failed_variants": {k: str(v) for k, v in (meta.get("failed_variants") or {}).items()},
        # only for a head that is not a softmax (a softmax run's report.json is unchanged)
        **({"outputs": outputs, "not_applicable": not_applicable(outputs)}
           if outputs != "softmax" else {}),
    })


def dumps(data):
    """The report dict as report.json's text (UTF-8, keys in insertion order, no NaN)."""
    return json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False)


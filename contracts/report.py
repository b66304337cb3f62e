"""Render a sweep's summary table and Markdown report from metrics, verdicts and timings."""

import math

import numpy as np
import pandas as pd

# Quality columns of the report's main table: (summary column, header, format); timing columns
# follow, one pair per timed batch size.
TABLE = (
    ("variant", "variant", "{}"),
    ("bits_per_weight", "bits/w", "{:.2f}"),
    ("model_bytes", "model MB", "{:.1f}"),
    ("agreement", "agree", "{:.4f}"),
    ("certified_share", "certified", "{:.3f}"),
    ("certified_flips", "cert. flips", "{:.0f}"),
    ("ece_variant", "ECE (ref {ece_ref:.3f})", "{:.4f}"),
    ("score_abs_err_max", "max Δscore", "{:.4f}"),
    ("action_max_abs_diff_max", "max Δaction", "{:.4f}"),
)


def _batch_sizes(summary, prefix="b"):
    """Timed batch sizes of ``summary``: forward columns ``b<B>_var_p50_ms`` (prefix "b") or
    end-to-end columns ``e2e_b<B>_var_p50_ms`` (prefix "e2e_b")."""
    out = set()
    for c in summary.columns:
        if c.startswith(prefix) and c.endswith("_var_p50_ms"):
            head = c[len(prefix):].split("_")[0]
            if head.isdigit():
                out.add(int(head))
    return sorted(out)


def _present(r, col):
    """True when row ``r`` has a non-missing value in ``col``."""
    v = r.get(col) if hasattr(r, "get") else None
    return v is not None and not (isinstance(v, float) and math.isnan(v))


#: Cold-start stages shown in the report: (key in the cold_start dict, header, format).
COLD_START_COLUMNS = (("startup_s", "start-up s", "{:.2f}"), ("import_s", "import s", "{:.2f}"),
                      ("weight_load_s", "weights s", "{:.2f}"), ("build_s", "build s", "{:.2f}"),
                      ("first_forward_ms", "1st forward ms", "{:.0f}"),
                      ("second_forward_ms", "2nd forward ms", "{:.0f}"),
                      ("total_s", "total s", "{:.2f}"), ("model_bytes", "model MB", "{:.1f}"),
                      ("peak_memory_bytes", "peak MB", "{:.1f}"))


#: What the ``interval`` column of a clause table means (said under every such table).
INTERVAL_NOTE = ("Intervals (`interval` column): `clopper-pearson` = exact binomial interval "
                 "for rates and counts of events (flips, agreement, certified share, accuracy), "
                 "honest at 0 and n events; `clopper-pearson-difference` = the accuracy drop's "
                 "interval, negative minus positive flip rate, each Clopper-Pearson at half the "
                 "error (honest with no flip either way); `bootstrap-percentile` = seeded "
                 "percentile bootstrap "
                 "over examples for every other figure; `—` = none.")


def _fit_note(meta, k):
    """" (at_bound)" after a temperature whose fit did not converge (run.json
    ``temperature_fits``); "" when it converged or the run predates the record."""
    status = ((meta.get("temperature_fits") or {}).get(str(k)) or {}).get("status")
    return "" if status in (None, "converged") else f" ({status})"


def _fmt(x, f):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f.format(x)


def summary_row(name, build, summary, verdict, timing):
    """One flat row (dict) of summary.csv for variant ``name``."""
    row = {"variant": name, "family": build.get("family"), **build.get("config", {}),
           "bits_per_weight": build.get("bits_per_weight"), "model_bytes": build.get("model_bytes"),
           "bits_per_weight_note": build.get("bits_per_weight_note", "bits per quantized weight"),
           "ideal_speedup": build.get("ideal_speedup"), "param_ratio": build.get("param_ratio"),
           "quality_mode": build.get("quality_mode"), "speed_mode": timing.get("mode")}
    for k, v in summary.items():
        if not isinstance(v, (list, tuple, dict)):
            row[k] = v
    regions = (("b", timing.get("batches", {})), ("e2e_b", timing.get("end_to_end", {})))
    for prefix, entries in regions:
        for b, t in entries.items():
            p = f"{prefix}{b}_"
            row.update({p + "seq_len": t["seq_len"], p + "rounds": t["rounds"],
                        p + "rounds_requested": t.get("rounds_requested"),
                        p + "stopped_by": t.get("stopped_by"),
                        p + "ref_p50_ms": t["ref"]["p50_ms"], p + "ref_p95_ms": t["ref"]["p95_ms"],
                        p + "var_p50_ms": t["var"]["p50_ms"], p + "var_p95_ms": t["var"]["p95_ms"],
                        p + "speedup": t["speedup"]["speedup_median"],
                        p + "speedup_ci_low": t["speedup"]["speedup_ci_low"],
                        p + "speedup_ci_high": t["speedup"]["speedup_ci_high"],
                        p + "var_peak_memory_bytes": t["var_peak_memory_bytes"],
                        p + "ref_peak_memory_bytes": t["ref_peak_memory_bytes"],
                        p + "var_peak_over_active_bytes": t.get("var_peak_over_active_bytes"),
                        p + "ref_peak_over_active_bytes": t.get("ref_peak_over_active_bytes")})
    mb = timing.get("model_bytes") or {}
    row["timed_model_bytes"] = mb.get("variant")
    row["timed_ref_model_bytes"] = mb.get("reference")
    cold = timing.get("cold_start") or {}
    if cold and "error" not in cold:
        row.update({f"cold_{k}": cold.get(k) for k, _, _ in COLD_START_COLUMNS})
        row["cold_start_s"] = cold.get("total_s")
    row["verdict"] = "PASS" if verdict.passed else "FAIL"
    row["failed_clauses"] = ";".join(verdict.failed)
    return row


def format_table(summary):
    """The main table as a DataFrame of strings (for Markdown and the terminal)."""
    out = []
    sizes = _batch_sizes(summary)
    for _, r in summary.iterrows():
        cells = {}
        for col, head, f in TABLE:
            head = head.format(**r) if "{" in head else head
            value = r.get(col)
            if col == "model_bytes" and value is not None:
                value = value / 1e6
            cells[head] = _fmt(value, f)
        for b in sizes:
            p = f"b{b}_"
            cells[f"p50/p95 ms B={b} (ref p50)"] = (
                f"{_fmt(r[p + 'var_p50_ms'], '{:.1f}')} / {_fmt(r[p + 'var_p95_ms'], '{:.1f}')}"
                f" ({_fmt(r[p + 'ref_p50_ms'], '{:.1f}')})")
            cells[f"speed-up B={b}"] = (
                f"{_fmt(r[p + 'speedup'], '{:.2f}')}× [{_fmt(r[p + 'speedup_ci_low'], '{:.2f}')}, "
                f"{_fmt(r[p + 'speedup_ci_high'], '{:.2f}')}]")
        for b in _batch_sizes(summary, "e2e_b"):
            p = f"e2e_b{b}_"
            cells[f"end-to-end B={b}"] = (
                f"{_fmt(r.get(p + 'speedup'), '{:.2f}')}×" if _present(r, p + "speedup") else "—")
        cells["verdict"] = r["verdict"]
        out.append(cells)
    return pd.DataFrame(out)


def timing_table(summary):
    """Per variant, batch size and timed region: p50/p95 of both models, the paired speed-up
    with its CI, rounds run / requested (and why timing stopped) and peak memory.

    Parameters
    ----------
    summary : pandas.DataFrame
        summary.csv's table (:func:`summary_row` rows); end-to-end columns may be absent (runs
        written before they existed), then only the forward rows appear.

    Returns
    -------
    pandas.DataFrame of str
    """
    out = []
    regions = (("forward", "b"), ("end to end", "e2e_b"))
    for _, r in summary.iterrows():
        for region, prefix in regions:
            for b in _batch_sizes(summary, prefix):
                p = f"{prefix}{b}_"
                if not _present(r, p + "var_p50_ms"):
                    continue
                req = r.get(p + "rounds_requested")
                stop = r.get(p + "stopped_by")
                rounds = _fmt(r[p + "rounds"], "{:.0f}") + (
                    f" / {_fmt(req, '{:.0f}')}" if _present(r, p + "rounds_requested") else "")
                if isinstance(stop, str):
                    rounds += f" ({stop})"
                out.append({
                    "variant": r["variant"], "region": region, "B": b,
                    "L": _fmt(r.get(p + "seq_len"), "{:.0f}"),
                    "ref p50 / p95 ms": f"{_fmt(r[p + 'ref_p50_ms'], '{:.1f}')} / "
                                        f"{_fmt(r[p + 'ref_p95_ms'], '{:.1f}')}",
                    "variant p50 / p95 ms": f"{_fmt(r[p + 'var_p50_ms'], '{:.1f}')} / "
                                            f"{_fmt(r[p + 'var_p95_ms'], '{:.1f}')}",
                    "speed-up [95% CI]": f"{_fmt(r[p + 'speedup'], '{:.2f}')}× "
                                         f"[{_fmt(r[p + 'speedup_ci_low'], '{:.2f}')}, "
                                         f"{_fmt(r[p + 'speedup_ci_high'], '{:.2f}')}]",
                    "rounds run / requested": rounds,
                    "peak MB variant (ref)": f"{_fmt(r[p + 'var_peak_memory_bytes'] / 1e6, '{:.1f}')}"
                                             f" ({_fmt(r[p + 'ref_peak_memory_bytes'] / 1e6, '{:.1f}')})",
                    "call's own MB variant (ref)": (
                        f"{r[p + 'var_peak_over_active_bytes'] / 1e6:.1f} "
                        f"({r[p + 'ref_peak_over_active_bytes'] / 1e6:.1f})"
                        if _present(r, p + "var_peak_over_active_bytes") else "—"),
                })
    return pd.DataFrame(out)


def cold_start_table(meta, summary):
    """Cold start (fresh process) of the reference (run.json ``cold_start``) and of each variant
    (summary ``cold_*`` columns, from timing.json); empty when none was measured."""
    rows = []
    ref = meta.get("cold_start") or {}

    def cells(name, d):
        row = {"model": name}
        for key, head, f in COLD_START_COLUMNS:
            v = d.get(key)
            if v is not None and key.endswith("_bytes"):
                v = v / 1e6
            row[head] = _fmt(v, f)
        return row

    if ref and "error" not in ref:
        rows.append(cells("reference", ref))
    for _, r in summary.iterrows():
        if _present(r, "cold_start_s"):
            rows.append(cells(r["variant"], {k: (r.get(f"cold_{k}") if _present(r, f"cold_{k}")
                                                 else None) for k, _, _ in COLD_START_COLUMNS}))
    return pd.DataFrame(rows)


def sweep_time_lines(meta):
    """Report lines for run.json's ``sweep_time`` breakdown (none for older runs)."""
    b = meta.get("sweep_time")
    if not b:
        return []
    frame = pd.DataFrame([{"part": k, "seconds": f"{v:.1f}", "share": f"{b['share'][k]:.1%}"}
                          for k, v in b["seconds"].items()])
    share = b["outside_forward_share"]
    c = b.get("counts", {})
    return ["====== Where this sweep's time went ======", "",
            frame.to_markdown(index=False), "",
            f"Outside model forwards ({', '.join(b['forward_categories'])} excluded): "
            f"{share:.1%} of {b['wall_s']:.0f} s (target ≤ {b['target_outside_share']:.0%}). "
            f"Reference output batches run: {c.get('reference_output_batches', '—')} (0 = from "
            f"the cache); variants built {c.get('variants_built', '—')}, reused "
            f"{c.get('variants_reused', '—')}.", ""]


def _parallel_text(par):
    """"; N CPU streams per layer, BLAS threads per GEMM call …" from run.json ``parallel``
    (:func:`variants.parallel.info`); "" when absent (runs before it was recorded)."""
    if not par:
        return ""
    threads = par.get("blas_threads_per_call")
    return (f"; CPU streams per encoder layer: {par.get('streams')} (VARIANTS_STREAMS), BLAS "
            "threads per GEMM call: " + (str(threads) if threads is not None
                                         else "as configured (not changed)"))


def render_report(meta, summary, details, contract, extras=None):
    """report.md text: run facts, the main table, then each variant's clauses."""
    cfg = meta["config"]
    data = meta["data"]
    lines = [
        f"# Sweep `{cfg['run']}` — {cfg['model']}, {cfg['family']} ("
        + ", ".join(f"{k} {v if v is not None else 'default'}"
                    for k, v in cfg.get("params", {}).items()) + ")",
        "",
        "====== Run ======",
        "",
        f"- contract: `{meta['contract']}` ({len(contract.clauses)} clauses); "
        f"verdict per variant below",
        f"- data: {data['source']}; eval n={data['splits']['eval']['n']}, calibration "
        f"n={data['splits']['calibration']['n']}, fit n={data['splits']['fit']['n']}; "
        f"texts truncated at {data['max_tokens']} tokens: "
        + ", ".join(f"{k} {v}" for k, v in data["truncated_texts"].items()),
        f"- quality numbers: `{cfg['quality_mode']}` mode; speed numbers: `{cfg['speed_mode']}` "
        f"mode; dtype {meta['dtype']}; device {meta['device']}; BLAS: {meta['blas']['status']}"
        + (f" ({meta['blas']['library']})" if meta["blas"].get("library") else "")
        + _parallel_text(meta.get("parallel")),
        "- timing: two timed regions, both warm, reference and variant in strict alternation "
        "(A B A B …); **forward** = prepared token ids → option logits with `mx.eval` inside "
        "(tokenisation excluded; the main table's p50/p95 and speed-up), **end to end** = "
        "texts → tokenisation → forward → decision outputs (probabilities, score, actions); "
        "speed-up = median of per-round ratios [95% bootstrap CI]"
        + (f"; {cfg['timing_warmup']} warm-ups and {cfg['timing_rounds']} rounds requested per "
           f"batch size, at most {cfg['timing_budget_s']:g} s each (at least "
           f"{cfg.get('timing_min_rounds', 3)} rounds)" if "timing_rounds" in cfg else ""),
        f"- ε = largest max|Δlogit| on the calibration split; certified = eval examples whose "
        f"reference top-2 margin > 2ε; near tie = reference margin < {cfg['near_tie_margin']}",
        f"- reference model: {meta.get('reference_model_bytes', float('nan')) / 1e6:.1f} MB "
        f"(fp32), checkpoint sha256 {meta['checkpoint']['sha256'][:12]}…",
        "- temperatures per option count: "
        + ", ".join(f"K={k}: {v:.3f}" + _fit_note(meta, k) for k, v in meta["temperatures"].items()),
        f"- wall time of this invocation: {meta['wall_s']:.0f} s"
        + (f" ({len(meta['reused_variants'])} variants reused from an earlier invocation)"
           if meta.get("reused_variants") else ""),
        "",
        "====== Variants ======",
        "",
        format_table(summary).to_markdown(index=False),
        "",
    ]
    tt = timing_table(summary)
    if not tt.empty:
        lines += ["====== Timing: forward vs end to end ======", "",
                  "Rounds run / requested (why timing stopped: `rounds` = all ran, `budget` = the "
                  "wall-clock budget ran out); peak memory = `mx.get_peak_memory`, reset before "
                  "every call, max over rounds: it includes every array alive, i.e. both models' "
                  "weights; the call's own MB = peak minus the bytes active just before the call "
                  "(activations and workspace).", "", tt.to_markdown(index=False), ""]
    ct = cold_start_table(meta, summary)
    if not ct.empty:
        lines += ["====== Cold start (fresh process) ======", "",
                  "Start-up = interpreter + `import variants`; import = mlx and the package "
                  "modules; weights = checkpoint → evaluated arrays + fitted head; build = the "
                  "variant's builder; 1st forward = first call on one batch (2nd = warm).", "",
                  ct.to_markdown(index=False), ""]
    lines += sweep_time_lines(meta)
    if cfg["speed_mode"] == "native" and "cpu" in meta["device"].lower():
        lines += ["Speed-ups below 1 are real: on MLX's CPU backend `mx.quantized_matmul` is a plain "
                  "kernel (no BLAS), tens of times slower than the fp32 OpenBLAS GEMM at batch 32. "
                  "Quantization here buys memory (model MB), not CPU speed; run on Apple silicon "
                  "(Metal) for the speed side.", ""]
    failed = meta.get("failed_variants") or {}
    if failed:
        lines += ["====== Variants that failed to build ======", "",
                  f"Left out of every table above and below (run status "
                  f"`{meta.get('status', 'partial')}`); fix the setting and rerun the same "
                  "command to add them:", ""]
        lines += [f"- `{n}`: {str(e).replace(chr(10), ' ')}" for n, e in failed.items()] + [""]
    rows = {r["variant"]: r for _, r in summary.iterrows()}
    for name, (ev, verdict) in details.items():
        s = ev.summary
        r = rows[name]
        memory = "; ".join(
            f"B={b}: peak {r[f'b{b}_var_peak_memory_bytes'] / 1e6:.1f} MB "
            f"(ref {r[f'b{b}_ref_peak_memory_bytes'] / 1e6:.1f} MB), {r[f'b{b}_rounds']:.0f} "
            f"rounds at L={r[f'b{b}_seq_len']:.0f}" for b in _batch_sizes(summary))
        lines += [
            f"====== {name}: {'PASS' if verdict.passed else 'FAIL'} ======",
            "",
            f"ε = {s['epsilon']:.4g}, certified {s['certified_share']:.1%}, agreement "
            f"{s['agreement']:.4f}, accuracy {s['accuracy_ref']:.4f} → {s['accuracy_variant']:.4f}, "
            f"KL mean {s['kl_mean']:.2e} / p95 {s['kl_p95']:.2e} / max {s['kl_max']:.2e}, "
            f"flips −{s['negative_flips']:.0f} +{s['positive_flips']:.0f}, "
            f"near-tie flip rate {_fmt(s['near_tie_flip_rate'], '{:.3f}')} "
            f"(n={s['n_near_tie']:.0f})",
            "",
            f"Build: {_fmt(r['bits_per_weight'], '{:.2f}')} {r.get('bits_per_weight_note')}, model "
            f"{_fmt(r['model_bytes'] / 1e6 if _present(r, 'model_bytes') else None, '{:.1f}')} MB"
            + (f" ({r['timed_model_bytes'] / 1e6:.1f} MB as timed)"
               if _present(r, "timed_model_bytes") else "")
            + f"; timing ({r['speed_mode']} mode): {memory}",
            "",
        ]
        if extras and extras.get(name):
            lines += [extras[name], ""]
        frame = verdict.to_frame()
        frame["CI"] = [_ci_text(lo, hi) for lo, hi in zip(frame["ci_low"], frame["ci_high"])]
        frame["interval"] = frame["interval"].fillna("—")
        frame = frame[["id", "metric", "stratum", "statistic", "value", "CI", "interval", "op",
                       "threshold", "n", "status"]]
        lines += [frame.to_markdown(index=False, floatfmt=".4g"), "", INTERVAL_NOTE, ""]
        if s.get("certified_flip_ids"):
            lines += ["Certified examples that flipped (ε was exceeded on them): "
                      + ", ".join(s["certified_flip_ids"][:20]), ""]
    return "\n".join(lines) + "\n"


# -- per-variant in-depth report (``variants check``) -------------------------------------------
from metrics.defaults import N_BINS  # noqa: E402  (the per-variant part's imports start here)

#: Version of the JSON written by :func:`variant_report_json` (``<variant>/report.json``) and of
#: ``check.json``; bump on any change of keys or meaning. Documented in results/README.md.
REPORT_SCHEMA_VERSION = 1
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
    strata += ["certified", "uncertified", "human_near_tie"]
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
        ``id``, ``excerpt``, ``ref_top2`` and ``var_top2`` ("#k p" pairs), ``metric`` (the
        clause's per-example value; for a set-level metric the example's KL), ``label``.
    """
    from metrics.registry import SET, spec

    rows = np.flatnonzero(ev.rows(result.stratum))
    metric = result.metric
    if spec(metric).kind == SET:
        metric = "kl"
    values = ev._array(metric)[rows]
    lower_is_worse = result.op == ">="  # a min bound: the lowest values drive the clause
    key = np.where(np.isnan(values), -np.inf, -values if lower_is_worse else values)
    # tie-break by KL so that among equal bools the most drifted rows come first
    kl = ev._array("kl")[rows]
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
                    "ref_top2": _top2(ev.ref_probs[i], ev.option_mask[i]),
                    "var_top2": _top2(ev.var_probs[i], ev.option_mask[i]),
                    "metric": _num(ev._array(metric)[i]), "metric_name": metric})
    return out


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
    lines = [f"# {name}: {'PASS' if verdict.passed else 'FAIL'} — contract `{contract.name}`", "",
             f"{contract.description}", "",
             f"Settings: near-tie margin {ev.near_tie_margin:g}, human tie gap {ev.human_tie_gap:g}, "
             f"α = {alpha:g}, {n_boot} bootstrap resamples, {confidence:.0%} intervals, seed {seed}.",
             "", "====== Clauses ======", ""]
    frame = pd.DataFrame([{
        "clause": r.id, "metric": r.metric, "stratum": r.stratum, "statistic": r.statistic,
        "value": r.value, "CI": _ci_text(r.ci_low, r.ci_high), "interval": r.interval or "—",
        "bound": f"{'CI ' if r.compare == 'ci' else ''}{r.op} {r.threshold:g}", "n": r.n,
        "status": r.status} for r in verdict.results])
    lines += [_md(frame), "", INTERVAL_NOTE, ""]

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
              f"share gap ≤ {ev.human_tie_gap:g}. Negative flip = reference right, variant wrong; "
              "positive = the reverse (Yan et al. 2020); rates over labeled examples.", "",
              _md(ft, floatfmt=".4g"), ""]

    # worst examples
    failing = [r for r in verdict.results if r.passed is False]
    if failing:
        lines += ["====== Worst examples of failing clauses ======", ""]
        for r in failing:
            worst = worst_examples(ev, r, texts=texts, n=worst_n)
            lines += [f"**{r.id}** ({r.metric}, {r.stratum}; value {r.value:.4g} {r.op} "
                      f"{r.threshold:g} fails):", ""]
            if worst:
                lines += [_md(pd.DataFrame(worst)), ""]
    return "\n".join(lines) + "\n"


def variant_report_json(name, ev, verdict, contract, epsilons, *, texts=None, worst_n=5):
    """The machine-readable twin of :func:`render_variant_report` (schema
    ``REPORT_SCHEMA_VERSION``, see results/README.md). NaN becomes null."""
    st = verdict.settings or contract.settings
    n_boot, conf, seed = st.get("n_bootstrap", 1000), st.get("confidence", 0.95), st.get("seed", 0)

    def records(frame):
        return [{k: (_num(v) if not isinstance(v, (str, list, tuple)) else v) for k, v in r.items()}
                for r in frame.to_dict("records")]

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

"""The run-level report of a sweep: summary.csv rows, the main and timing tables, cold starts,
where the sweep's time went and report.md (no MLX; its plots section is
:func:`runs.plots.markdown.report_tail`).

Each variant's own report (report.md/report.json in its folder) is
:mod:`contracts.report`'s; this module assembles the run's report.md from every variant's
evaluation and verdict, the rows of summary.csv, run.json, the family blocks
(``<variant>/family.md``) and the plots.
"""

import math

import pandas as pd

from contracts.report import INTERVAL_NOTE, _ci_text
from metrics.head_view import QUALITY, figures_text, not_applicable, summary_outputs
from runs.report_elsewhere import elsewhere_lines
from runs.report_facts import (cpu_text, flagged, implausible_lines, judged_lines,
                               special_only_text, unquantized_text)
from runs.report_memory import COLD_MEMORY, COLD_NOTE, NOTE, cold_columns, held_columns
from runs.report_warmth import cold_column, warm_text
from runs.summary_row import COLD_START_COLUMNS, summary_row  # noqa: F401  (re-exported)

# Quality columns of the report's main table: (summary column, header, format); timing columns
# follow, one pair per timed batch size. A multi-label or regression head's run shows its own
# columns after model MB instead (runs.head_view.QUALITY).
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


def _fit_note(meta, k):
    """" (at_bound)" after a temperature whose fit did not converge (run.json
    ``temperature_fits``); "" when it converged or the run predates the record."""
    status = ((meta.get("temperature_fits") or {}).get(str(k)) or {}).get("status")
    return "" if status in (None, "converged") else f" ({status})"


def _fmt(x, f):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f.format(x)


def format_table(summary):
    """The main table as a DataFrame of strings (for Markdown and the terminal)."""
    out = []
    sizes = _batch_sizes(summary)
    outputs = summary_outputs(summary)
    columns = TABLE if outputs == "softmax" else TABLE[:3] + QUALITY[outputs]
    for _, r in summary.iterrows():
        cells = {}
        for col, head, f in columns:
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
                f"{_fmt(r[p + 'speedup_ci_high'], '{:.2f}')}]"
                + (" ⚠ implausible" if flagged(r, p) else ""))
        for b in _batch_sizes(summary, "e2e_b"):
            p = f"e2e_b{b}_"
            cells[f"end-to-end B={b}"] = (
                f"{_fmt(r.get(p + 'speedup'), '{:.2f}')}×" if _present(r, p + "speedup") else "—")
        cells["verdict"] = r["verdict"]
        out.append(cells)
    return pd.DataFrame(out)


def timing_table(summary):
    """Per variant, batch size and timed region: p50/p95 of both models, the paired speed-up
    with its CI, rounds run / requested (and why timing stopped), cold calls (where labelled),
    the call's own memory, the allocator peak and the process RSS.

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
                    **cold_column(r, p),
                    "call's own MB variant (ref)": (
                        f"{r[p + 'var_peak_over_active_bytes'] / 1e6:.1f} "
                        f"({r[p + 'ref_peak_over_active_bytes'] / 1e6:.1f})"
                        if _present(r, p + "var_peak_over_active_bytes") else "—"),
                    "allocator peak MB variant (ref)": (
                        f"{_fmt(r[p + 'var_peak_memory_bytes'] / 1e6, '{:.1f}')}"
                        f" ({_fmt(r[p + 'ref_peak_memory_bytes'] / 1e6, '{:.1f}')})"),
                    **held_columns(r, p),
                })
    return pd.DataFrame(out)


def cold_start_table(meta, summary):
    """Cold start (fresh process) of the reference (run.json ``cold_start``) and of each variant
    (summary ``cold_*`` columns, from timing.json); empty when none was measured."""
    rows = []
    ref = meta.get("cold_start") or {}

    def cells(name, d):
        row = {"model": name, "loads from": d.get("source") or "—"}
        for key, head, f in COLD_START_COLUMNS:
            v = d.get(key)
            if v is not None and key.endswith("_bytes"):
                v = v / 1e6
            row[head] = _fmt(v, f)
        row.update(cold_columns(d))
        return row

    if ref and "error" not in ref:
        rows.append(cells("reference", ref))
    for _, r in summary.iterrows():
        if _present(r, "cold_start_s"):
            keys = [k for k, _, _ in COLD_START_COLUMNS] + [k for k, _ in COLD_MEMORY] + [
                "source"]
            rows.append(cells(r["variant"], {k: (r.get(f"cold_{k}") if _present(r, f"cold_{k}")
                                                 else None) for k in keys}))
    return pd.DataFrame(rows).fillna("—")


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
    (:func:`variants.runtime.parallel.info`); "" when absent (runs before it was recorded)."""
    if not par:
        return ""
    threads = par.get("blas_threads_per_call")
    return (f"; CPU streams per encoder layer: {par.get('streams')} (VARIANTS_STREAMS), BLAS "
            "threads per GEMM call: " + (str(threads) if threads is not None
                                         else "as configured (not changed)"))


def _cpu_text(info):
    """``"; CPU <phrase>"`` (:func:`runs.report_facts.cpu_text`), or "" when not recorded."""
    text = cpu_text(info)
    return f"; CPU {text}" if text else ""


def _softmax_facts(meta, cfg, outputs):
    """The run facts' ε / certificate line (a softmax run), or what does not apply (others)."""
    if outputs != "softmax":
        return [f"- {not_applicable(outputs)}"]
    return [f"- ε = largest max|Δlogit| on the calibration split; certified = eval examples whose "
            f"reference top-2 margin > 2ε; near tie = reference margin < {cfg['near_tie_margin']}"]


def _temperature_facts(meta, outputs):
    """The run facts' temperature line (none for a multi-label or regression head: its logits
    are judged as they are, T = 1 fixed)."""
    if outputs != "softmax":
        return []
    return ["- temperatures per option count: "
            + ", ".join(f"K={k}: {v:.3f}" + _fit_note(meta, k)
                        for k, v in meta["temperatures"].items())]


def render_report(meta, summary, details, contract, extras=None):
    """report.md text: run facts, the main table, then each variant's clauses."""
    cfg = meta["config"]
    data = meta["data"]
    outputs = summary_outputs(summary)
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
        + ", ".join(f"{k} {v}" for k, v in data["truncated_texts"].items())
        + special_only_text(data),
        f"- quality numbers: `{cfg['quality_mode']}` mode; speed numbers: `{cfg['speed_mode']}` "
        f"mode; dtype {meta['dtype']}; device {meta['device']}{_cpu_text(meta.get('cpu'))}; "
        f"BLAS: {meta['blas']['status']}"
        + (f" ({meta['blas']['library']})" if meta["blas"].get("library") else "")
        + _parallel_text(meta.get("parallel")),
        *judged_lines(summary),
        f"- timing: two timed regions, {warm_text(summary, cfg)}; reference and variant in "
        "strict alternation "
        "(A B A B …); **forward** = prepared token ids → option logits with `mx.eval` inside "
        "(tokenisation excluded; the main table's p50/p95 and speed-up), **end to end** = "
        "texts → tokenisation → forward → decision outputs (probabilities, score, actions); "
        "speed-up = median of per-round ratios [95% bootstrap CI]"
        + (f"; {cfg['timing_warmup']} warm-ups and {cfg['timing_rounds']} rounds requested per "
           f"batch size, at most {cfg['timing_budget_s']:g} s each (at least "
           f"{cfg.get('timing_min_rounds', 3)} rounds)" if "timing_rounds" in cfg else ""),
        *_softmax_facts(meta, cfg, outputs),
        f"- reference model: {meta.get('reference_model_bytes', float('nan')) / 1e6:.1f} MB "
        f"(fp32), checkpoint sha256 {meta['checkpoint']['sha256'][:12]}…",
        *_temperature_facts(meta, outputs),
        f"- wall time of this invocation: {meta['wall_s']:.0f} s"
        + (f" ({len(meta['reused_variants'])} variants reused from an earlier invocation)"
           if meta.get("reused_variants") else ""),
        "",
        "====== Variants ======",
        "",
        format_table(summary).to_markdown(index=False),
        "",
    ]
    lines += implausible_lines(summary)
    tt = timing_table(summary)
    if not tt.empty:
        lines += ["====== Timing: forward vs end to end ======", "",
                  "Rounds run / requested (why timing stopped: `rounds` = all ran, `budget` = the "
                  "wall-clock budget ran out). " + NOTE, "", tt.to_markdown(index=False), ""]
    lines += elsewhere_lines(summary)
    ct = cold_start_table(meta, summary)
    if not ct.empty:
        lines += ["====== Cold start (fresh process) ======", "",
                  "Start-up = interpreter + `import variants`; import = mlx and the package "
                  "modules; weights = the fp32 checkpoint → evaluated arrays + fitted head, or "
                  "the exported artifact's packed load; build = the "
                  "variant's builder; 1st forward = first call on one batch (2nd = warm). "
                  + COLD_NOTE, "", ct.to_markdown(index=False), ""]
    lines += sweep_time_lines(meta)
    if cfg["speed_mode"] == "native" and "cpu" in meta["device"].lower():
        lines += ["Native quantized variants on the CPU keep their weights packed (model MB) and "
                  "run each Linear as the kernel its timing.json names: `unpack+gemm` / "
                  "`dequant+gemm` = dequantize per call into a temporary fp32 buffer (counted in "
                  "the peak memory) + the fp32 OpenBLAS GEMM, so at best ~1x the reference; "
                  "`quantized_matmul` (MLX's CPU kernel, no BLAS) is tens of times slower. "
                  "Quantization here buys memory, not CPU speed.", ""]
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
            f"B={b}: allocator peak {r[f'b{b}_var_peak_memory_bytes'] / 1e6:.1f} MB "
            f"(ref {r[f'b{b}_ref_peak_memory_bytes'] / 1e6:.1f} MB), {r[f'b{b}_rounds']:.0f} "
            f"rounds at L={r[f'b{b}_seq_len']:.0f}" for b in _batch_sizes(summary)
            if _present(r, f"b{b}_var_p50_ms")) or "none measured here"
        lines += [
            f"====== {name}: {verdict.word} ======",
            "",
            *([f"Not judged{verdict.unjudged_text()[len('; not judged'):]}.", ""]
              if verdict.unjudged else []),
            figures_text(s, outputs) if outputs != "softmax" else
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
            + f"; timing ({r['speed_mode']} mode): {memory}" + unquantized_text(r),
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
        if s.get("certified_flip_ids") and outputs == "softmax":
            lines += ["Certified examples that flipped (ε was exceeded on them): "
                      + ", ".join(s["certified_flip_ids"][:20]), ""]
    return "\n".join(lines) + "\n"

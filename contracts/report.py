"""Render a sweep's summary table and Markdown report from metrics, verdicts and timings."""

import math

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


def _batch_sizes(summary):
    return sorted(int(c[1:].split("_")[0]) for c in summary.columns
                  if c.startswith("b") and c.endswith("_var_p50_ms"))


def _fmt(x, f):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f.format(x)


def summary_row(name, build, summary, verdict, timing):
    """One flat row (dict) of summary.csv for variant ``name``."""
    row = {"variant": name, "family": build.get("family"), **build.get("config", {}),
           "bits_per_weight": build.get("bits_per_weight"), "model_bytes": build.get("model_bytes"),
           "quality_mode": build.get("quality_mode"), "speed_mode": timing.get("mode")}
    for k, v in summary.items():
        if not isinstance(v, (list, tuple, dict)):
            row[k] = v
    for b, t in timing["batches"].items():
        p = f"b{b}_"
        row.update({p + "seq_len": t["seq_len"], p + "rounds": t["rounds"],
                    p + "ref_p50_ms": t["ref"]["p50_ms"], p + "ref_p95_ms": t["ref"]["p95_ms"],
                    p + "var_p50_ms": t["var"]["p50_ms"], p + "var_p95_ms": t["var"]["p95_ms"],
                    p + "speedup": t["speedup"]["speedup_median"],
                    p + "speedup_ci_low": t["speedup"]["speedup_ci_low"],
                    p + "speedup_ci_high": t["speedup"]["speedup_ci_high"],
                    p + "var_peak_memory_bytes": t["var_peak_memory_bytes"],
                    p + "ref_peak_memory_bytes": t["ref_peak_memory_bytes"]})
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
        cells["verdict"] = r["verdict"]
        out.append(cells)
    return pd.DataFrame(out)


def render_report(meta, summary, details, contract):
    """report.md text: run facts, the main table, then each variant's clauses."""
    cfg = meta["config"]
    data = meta["data"]
    lines = [
        f"# Sweep `{cfg['run']}` — {cfg['model']}, {cfg['family']} ("
        + ", ".join(f"{k} {v}" for k, v in cfg.get("params", {}).items()) + ")",
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
        + (f" ({meta['blas']['library']})" if meta["blas"].get("library") else ""),
        "- timing: forward only (prepared token ids → option logits), warm, `mx.eval` inside the "
        "timed region, reference and variant in strict alternation; speed-up = median of "
        "per-round ratios [95% bootstrap CI]",
        f"- ε = largest max|Δlogit| on the calibration split; certified = eval examples whose "
        f"reference top-2 margin > 2ε; near tie = reference margin < {cfg['near_tie_margin']}",
        f"- reference model: {meta.get('reference_model_bytes', float('nan')) / 1e6:.1f} MB "
        f"(fp32), checkpoint sha256 {meta['checkpoint']['sha256'][:12]}…",
        f"- temperatures per option count: "
        + ", ".join(f"K={k}: {v:.3f}" for k, v in meta["temperatures"].items()),
        f"- wall time of this invocation: {meta['wall_s']:.0f} s"
        + (f" ({len(meta['reused_variants'])} variants reused from an earlier invocation)"
           if meta.get("reused_variants") else ""),
        "",
        "====== Variants ======",
        "",
        format_table(summary).to_markdown(index=False),
        "",
    ]
    if cfg["speed_mode"] == "native" and "cpu" in meta["device"].lower():
        lines += ["Speed-ups below 1 are real: on MLX's CPU backend `mx.quantized_matmul` is a plain "
                  "kernel (no BLAS), tens of times slower than the fp32 OpenBLAS GEMM at batch 32. "
                  "Quantization here buys memory (model MB), not CPU speed; run on Apple silicon "
                  "(Metal) for the speed side.", ""]
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
            f"Build: {r['bits_per_weight']:.2f} bits per quantized weight, model "
            f"{r['model_bytes'] / 1e6:.1f} MB; timing ({r['speed_mode']} mode): {memory}",
            "",
        ]
        frame = verdict.to_frame()[["id", "metric", "stratum", "statistic", "value", "op",
                                    "threshold", "n", "status"]]
        lines += [frame.to_markdown(index=False, floatfmt=".4g"), ""]
        if s.get("certified_flip_ids"):
            lines += ["Certified examples that flipped (ε was exceeded on them): "
                      + ", ".join(s["certified_flip_ids"][:20]), ""]
    return "\n".join(lines) + "\n"

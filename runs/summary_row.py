"""One variant's row of a sweep's summary.csv (flat: build, metrics, timing per batch size and
region, cold start, verdict), which pandas reads; :mod:`runs.report` renders the tables from
these rows."""

from runs.report_elsewhere import elsewhere_cells
from runs.report_facts import plausibility_cells, unquantized_cells
from runs.report_memory import COLD_MEMORY, held_cells
from runs.report_warmth import cold_cells

#: Cold-start stages shown in the report: (key in the cold_start dict, header, format).
COLD_START_COLUMNS = (("startup_s", "start-up s", "{:.2f}"), ("import_s", "import s", "{:.2f}"),
                      ("weight_load_s", "weights s", "{:.2f}"), ("build_s", "build s", "{:.2f}"),
                      ("first_forward_ms", "1st forward ms", "{:.0f}"),
                      ("second_forward_ms", "2nd forward ms", "{:.0f}"),
                      ("total_s", "total s", "{:.2f}"), ("model_bytes", "model MB", "{:.1f}"),
                      ("peak_memory_bytes", "allocator peak MB", "{:.1f}"))


def summary_row(name, build, summary, verdict, timing):
    """One flat row (dict) of summary.csv for variant ``name``."""
    row = {"variant": name, "family": build.get("family"), **build.get("config", {}),
           "bits_per_weight": build.get("bits_per_weight"), "model_bytes": build.get("model_bytes"),
           "bits_per_weight_note": build.get("bits_per_weight_note", "bits per quantized weight"),
           "ideal_speedup": build.get("ideal_speedup"), "param_ratio": build.get("param_ratio"),
           "quality_mode": build.get("quality_mode"), "speed_mode": timing.get("mode"),
           # variants.sweep.timed_check: the timed build's eval logits against the judged ones
           "timed_check_max_dlogit": (build.get("timed_check") or {}).get("max_abs_dlogit"),
           "timed_check_tolerance": (build.get("timed_check") or {}).get("tolerance")}
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
                        p + "ref_peak_over_active_bytes": t.get("ref_peak_over_active_bytes"),
                        **held_cells(p, t), **cold_cells(p, t), **plausibility_cells(p, t)})
    row.update(elsewhere_cells(timing))  # latency an outputs file reports (variants judge)
    mb = timing.get("model_bytes") or {}
    row["timed_model_bytes"] = mb.get("variant")
    row["timed_ref_model_bytes"] = mb.get("reference")
    if timing.get("kernel"):  # timing.json written before the kernel was recorded: no column
        row["kernel"] = timing["kernel"].get("variant")
    cold = timing.get("cold_start") or {}
    if cold and "error" not in cold:
        row.update({f"cold_{k}": cold.get(k) for k, _, _ in COLD_START_COLUMNS})
        row.update({f"cold_{k}": cold[k] for k, _ in COLD_MEMORY if k in cold})
        row["cold_start_s"] = cold.get("total_s")
        if cold.get("source"):  # what the fresh process loaded (older runs: fp32 + build)
            row["cold_source"] = cold["source"]
    row.update(unquantized_cells(build))
    row["verdict"] = verdict.word
    row["failed_clauses"] = ";".join(verdict.failed)
    row["undecided_clauses"] = ";".join(verdict.undecided)
    return row

"""What the run's tables say about variants judged from an outputs file (``variants judge RUN
--outputs FILE``, :mod:`runs.judge_file`): made by another runtime, timed (if at all) by it, so
their latency is shown apart from the suite's alternated timings and marked "measured
elsewhere". No MLX."""

import math

#: build.json ``family`` of a variant judged from an outputs file
OUTPUTS_FAMILY = "outputs"
#: summary.csv columns from timing.json's ``measured_elsewhere`` block: (column, key)
COLUMNS = (("elsewhere_latency_p50_ms", "p50_ms"), ("elsewhere_latency_p95_ms", "p95_ms"),
           ("elsewhere_latency_mean_ms", "mean_ms"), ("elsewhere_latency_rows", "n"))


def elsewhere_cells(timing):
    """summary.csv cells of timing.json's ``measured_elsewhere`` ({} when it has none)."""
    block = timing.get("measured_elsewhere") or {}
    return {col: block.get(key) for col, key in COLUMNS} if block else {}


def is_outputs_row(r):
    """True for a summary row of a variant judged from an outputs file."""
    return r.get("family") == OUTPUTS_FAMILY


def _cell(x, f):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f.format(x)


def elsewhere_lines(summary):
    """report.md's section on the latencies measured elsewhere (a Markdown table), [] when no
    variant of ``summary`` (summary.csv's DataFrame) has one."""
    import pandas as pd

    if "elsewhere_latency_p50_ms" not in summary.columns:
        return []
    rows = [{"variant": r["variant"],
             "p50 / p95 ms": f"{_cell(r['elsewhere_latency_p50_ms'], '{:.2f}')} / "
                             f"{_cell(r['elsewhere_latency_p95_ms'], '{:.2f}')}",
             "mean ms": _cell(r["elsewhere_latency_mean_ms"], "{:.2f}"),
             "rows timed": _cell(r["elsewhere_latency_rows"], "{:.0f}")}
            for _, r in summary.iterrows() if not pd.isna(r.get("elsewhere_latency_p50_ms"))]
    if not rows:
        return []
    return ["====== Latency measured elsewhere ======", "",
            "Per-row `latency_ms` as the runtime that wrote each outputs file timed it (`variants "
            "judge --outputs`): not timed here, not in alternation with the reference, on "
            "whatever machine and batch size that runtime used; no speed-up is derived from it.",
            "", pd.DataFrame(rows).to_markdown(index=False), ""]


def judged_part(summary):
    """The "judged model = timed model" line's part for outputs-file variants ("" when none):
    their outputs came from another runtime, none of their builds is timed here."""
    if "family" not in summary.columns:
        return ""
    names = summary.loc[summary["family"] == OUTPUTS_FAMILY, "variant"].tolist()
    if not names:
        return ""
    return (f"{len(names)} judged from an outputs file ({', '.join(names)}: logits made by "
            "another runtime; no model of theirs is timed here)")

"""The report's "warm" claim is computed from the timed rounds' cold labels (runs.report_warmth):
"both warm" only when every measurement was labelled and none had a cold call; otherwise how
many calls were cold, for which model and where; a run from before the labels says what its
warm-up setting allows."""

import pandas as pd

from runs.report import summary_row, timing_table
from runs.report_warmth import warm_text


class _Verdict:
    passed, failed, undecided, word = False, ["x"], [], "FAIL"


def _timing(ref_cold=None, var_cold=None):
    per = {"seq_len": 20, "rounds": 2, "stopped_by": "rounds", "warmup": 0,
           "ref_ms": [60.0, 10.0], "var_ms": [15.0, 10.0],
           "ref": {"p50_ms": 35.0, "p95_ms": 57.5}, "var": {"p50_ms": 12.5, "p95_ms": 14.75},
           "speedup": {"speedup_median": 2.5, "speedup_ci_low": 1.0, "speedup_ci_high": 4.0},
           "ref_peak_memory_bytes": 100, "var_peak_memory_bytes": 90, "batch_size": 1}
    if ref_cold is not None:
        per.update(ref_cold=ref_cold, var_cold=var_cold, ref_cold_calls=sum(ref_cold),
                   var_cold_calls=sum(var_cold))
    return {"timed_region": "forward", "mode": "native", "batches": {"1": per},
            "end_to_end": {"1": dict(per)}}


def _summary(*timings):
    return pd.DataFrame([summary_row(f"v{i}", {"family": "quant", "config": {}}, {},
                                     _Verdict(), t) for i, t in enumerate(timings)])


def test_warm_only_when_no_timed_call_was_cold():
    warm = _summary(_timing([False, False], [False, False]))
    assert warm["b1_ref_cold_calls"].iloc[0] == 0 and warm["e2e_b1_var_cold_calls"].iloc[0] == 0
    assert warm_text(warm, {"timing_warmup": 5}).startswith("both warm")
    cold = _summary(_timing([False, False], [False, False]), _timing([True, False], [True, False]))
    text = warm_text(cold, {"timing_warmup": 0})
    assert "both warm" not in text and text.startswith("**not all warm**: 2 timed calls")
    assert "reference 1, variant 1" in text and "`v1` B=1" in text and "`v0`" not in text
    assert timing_table(cold)["cold calls variant (ref)"].tolist() == ["0 (0)"] * 2 + ["1 (1)"] * 2


def test_a_run_from_before_the_labels_is_not_called_warm():
    old = _summary(_timing())
    assert "b1_ref_cold_calls" not in old.columns  # summary.csv unchanged for such runs
    assert "cold calls variant (ref)" not in timing_table(old).columns
    text = warm_text(old, {"timing_warmup": 0})
    assert text.startswith("**not warm**: 0 warm-ups") and "1 measurement(s)" in text
    text = warm_text(old, {"timing_warmup": 5})
    assert text.startswith("after warm-ups, warmth not checked")


def test_a_saved_run_timed_without_warmups_is_reported_as_such(tmp_path):
    """The saved fixture run was timed with 0 warm-ups before calls were labelled: its report
    no longer claims "both warm"."""
    from pathlib import Path

    from variants.cli import main

    run = Path(__file__).parents[1] / "fixtures" / "sweep_small"
    assert main(["check", str(run), "--output-dir", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "both warm" not in text and "**not warm**: 0 warm-ups" in text

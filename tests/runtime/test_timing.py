"""Timing harness: budget and rounds bookkeeping, both timed regions, no self-pollution,
cold start in a fresh process, and old timing.json files still readable."""

import gc

import mlx.core as mx
import numpy as np
import pandas as pd
import pytest

from metrics.latency import relative_trend
from variants.runtime.timing import (TIMED_REGIONS, Staged, end_to_end_call, split_regions,
                                     time_alternating)


def _sleeper(clock, ms):
    """A call that takes exactly ``ms`` on the fake clock (tests/conftest.py)."""
    def fn():
        clock.advance_ms(ms)
        return mx.array(0.0)
    return fn


def test_budget_stops_rounds_and_records_why(fake_clock):
    r = time_alternating(_sleeper(fake_clock, 5), _sleeper(fake_clock, 5), warmup=2,
                         rounds=1000, min_rounds=3, budget_s=0.25)
    assert r["stopped_by"] == "budget"
    # 2 warm-ups (20 ms) + 10 ms rounds: after 23 rounds (250 ms) a 24th would end past it
    assert r["rounds"] == 23 and r["rounds_requested"] == 1000
    assert r["elapsed_s"] == pytest.approx(0.25)  # no round starts that would end past it
    assert r["ref_ms"] == r["var_ms"] == pytest.approx([5.0] * 23)


def test_min_rounds_run_past_the_budget_and_warmups_stop_early(fake_clock):
    r = time_alternating(_sleeper(fake_clock, 20), _sleeper(fake_clock, 20), warmup=50,
                         rounds=10, min_rounds=4, budget_s=0.05)
    assert r["rounds"] == 4 and r["stopped_by"] == "budget"
    assert r["warmup"] == 50 and r["warmup_run"] == 1  # the first warm-up used the budget share
    full = time_alternating(_sleeper(fake_clock, 1), _sleeper(fake_clock, 1), warmup=2,
                            rounds=5, budget_s=30)
    assert full["stopped_by"] == "rounds" and full["rounds"] == 5 and full["warmup_run"] == 2
    with pytest.raises(ValueError, match="budget_s"):
        time_alternating(_sleeper(fake_clock, 1), _sleeper(fake_clock, 1), budget_s=0)


def test_staged_calls_give_both_regions_from_the_same_rounds(fake_clock):
    def staged(fwd_ms):
        def fn():
            fake_clock.advance_ms(1.0 + fwd_ms)
            return Staged(ms={"tokenise": 1.0, "forward": float(fwd_ms), "postprocess": 0.0},
                          peak_bytes={"tokenise": 1, "forward": 10, "postprocess": 1})
        return fn

    r = time_alternating(staged(8), staged(4), warmup=1, rounds=5, budget_s=30)
    fwd, e2e = split_regions(r)
    assert fwd["timed_region"] == TIMED_REGIONS["forward"]
    assert e2e["timed_region"] == TIMED_REGIONS["end_to_end"]
    assert fwd["rounds"] == e2e["rounds"] == 5
    assert all(f <= e for f, e in zip(fwd["var_ms"], e2e["var_ms"]))  # forward is inside
    assert fwd["speedup"]["speedup_median"] == pytest.approx(2.0)
    assert e2e["speedup"]["speedup_median"] == pytest.approx(9.0 / 5.0)  # diluted by tokenising
    assert set(e2e["stages_p50_ms"]) == {"tokenise", "forward", "postprocess"}
    assert fwd["var_peak_memory_bytes"] == 10
    assert r["stages"]["postprocess"]["speedup"] is None  # 0 ms: no ratio, no crash


def test_relative_trend():
    assert relative_trend([5.0] * 10) == pytest.approx(0.0, abs=1e-12)
    assert relative_trend(np.arange(1, 11, dtype=float)) > 0.1
    assert relative_trend([1.0, 2.0]) == 0.0  # too few rounds to fit
    with pytest.raises(ValueError):
        relative_trend([])


@pytest.fixture(scope="module")
def sentiment(checkpoint):
    from variants.datasets import bundled as data
    from variants.models import get_module

    mod = get_module("minilm-sentiment")
    model = mod.build(checkpoint)
    model.temperatures = {3: 1.5}
    frame = data.sample(data.split_frame(data.load_vader(), "eval"), 8, seed=0)
    return model, mod.make_taskset(frame)


def test_a_vs_a_end_to_end_does_not_grow(sentiment):
    """The harness must not pollute itself (no growing state across rounds). That A vs
    A is centred on one is tested on exact durations (test_profile.py, a fake clock): on this
    shared machine a real-clock ratio is the benchmarks' business, not a test's."""
    model, ts = sentiment
    call = end_to_end_call(model, ts)
    gc.collect()
    objects = len(gc.get_objects())
    r = time_alternating(call, call, warmup=2, rounds=12, budget_s=60)
    gc.collect()
    assert len(gc.get_objects()) - objects < 500  # no table growing per round
    fwd, e2e = split_regions(r)
    for region in (fwd, e2e):
        assert region["rounds"] == 12 and region["speedup"]["n_rounds"] == 12
    # memory: every round's peak ~ the first round's, nothing left allocated between rounds
    for key in ("ref_peak_memory_bytes_rounds", "var_peak_memory_bytes_rounds"):
        peaks = np.array(e2e[key], float)
        assert np.all(np.abs(peaks - peaks[0]) <= 0.02 * peaks[0])
    assert abs(e2e["active_memory_growth_bytes"]) < 1 << 20
    # the allocator peak, MLX's cache and the process RSS are three numbers, each recorded
    for region in (fwd, e2e):
        for side in ("ref", "var"):
            assert region[f"{side}_cache_memory_bytes"] >= 0
            # the process holds the interpreter and its libraries besides MLX's arrays
            assert region[f"{side}_process_rss_bytes"] > region[f"{side}_peak_memory_bytes"]
    # end to end adds tokenisation and post-processing to the forward
    assert all(f < e for f, e in zip(fwd["ref_ms"], e2e["ref_ms"]))
    out = call().result
    assert out.probs.shape == (len(ts), 3)
    np.testing.assert_allclose(out.probs.sum(1), 1.0, rtol=1e-5)


def test_cold_start_runs_in_a_fresh_process(sentiment):
    from variants.sweep.coldstart import measure_cold_start

    model, ts = sentiment
    r = measure_cold_start({"model": "minilm-sentiment", "head_path": None,
                            "taskset": ts.subset([0])}, timeout_s=120)
    assert "error" not in r, r
    for k in ("startup_s", "import_s", "weight_load_s", "first_forward_ms", "total_s"):
        assert r[k] > 0, k
    assert r["build_s"] == 0.0 and r["what"] == "reference"
    assert r["model_bytes"] > 80e6 and r["peak_memory_bytes"] >= r["model_bytes"]
    assert r["process_wall_s"] >= r["total_s"] - r["startup_s"]
    # loading and the first call apart: both peaks hold the weights; the first call's is its own
    assert r["load_peak_memory_bytes"] >= r["model_bytes"]
    assert r["model_bytes"] <= r["first_call_peak_memory_bytes"] <= r["peak_memory_bytes"]
    assert r["peak_memory_bytes"] >= r["load_peak_memory_bytes"]  # the whole child's peak
    assert r["first_call_process_rss_bytes"] > r["first_call_peak_memory_bytes"]
    assert r["load_process_rss_bytes"] > r["load_peak_memory_bytes"]
    assert r["first_call_cache_memory_bytes"] >= 0 and r["load_cache_memory_bytes"] >= 0
    bad = measure_cold_start({"model": "minilm-sentiment", "head_path": None,
                              "taskset": ts.subset([0]), "family": "quant",
                              "params": {"bits": [4]}, "variant": "q9-g64"}, timeout_s=120)
    assert "not in family" in bad["error"]


class _Verdict:
    passed, failed, undecided, word = False, ["x"], [], "FAIL"


def _legacy_timing():
    per = {"seq_len": 20, "rounds": 3, "stopped_by": "rounds", "warmup": 1,
           "ref_ms": [1.0, 1.0, 1.0], "var_ms": [2.0, 2.0, 2.0],
           "ref": {"p50_ms": 1.0, "p95_ms": 1.0}, "var": {"p50_ms": 2.0, "p95_ms": 2.0},
           "speedup": {"speedup_median": 0.5, "speedup_ci_low": 0.5, "speedup_ci_high": 0.5},
           "ref_peak_memory_bytes": 100, "var_peak_memory_bytes": 90, "batch_size": 1}
    return {"timed_region": "forward", "mode": "native", "batches": {"1": per}}


def test_old_timing_json_still_renders():
    from runs.report import cold_start_table, format_table, summary_row, timing_table

    row = summary_row("q8", {"family": "quant", "config": {}, "model_bytes": 5e7,
                             "bits_per_weight": 9.0}, {"agreement": 1.0, "ece_ref": 0.03}, _Verdict(),
                      _legacy_timing())
    summary = pd.DataFrame([row])
    table = format_table(summary)
    assert "speed-up B=1" in table.columns and not any("end-to-end" in c for c in table.columns)
    tt = timing_table(summary)
    assert list(tt["region"]) == ["forward"] and tt["rounds run / requested"].iloc[0] == "3 (rounds)"
    assert cold_start_table({}, summary).empty


def test_report_labels_call_peak_and_rss_apart():
    """report.md's timing table shows the call's own memory, the allocator peak and the
    process RSS in their own labelled columns (the buffer cache, emptied before each
    measurement, is no column: its buffers are in the RSS), the cold-start table the cache
    too, and the cold start's load apart from its first call; runs without these numbers
    keep their old columns (tested above)."""
    from runs.report import cold_start_table, summary_row, timing_table

    timing = _legacy_timing()
    timing["batches"]["1"].update(ref_cache_memory_bytes=38e6, var_cache_memory_bytes=12e6,
                                  ref_process_rss_bytes=470e6, var_process_rss_bytes=471e6)
    timing["cold_start"] = {"total_s": 5.0, "peak_memory_bytes": 180e6,
                            "load_peak_memory_bytes": 92e6, "load_process_rss_bytes": 400e6,
                            "first_call_peak_memory_bytes": 155e6,
                            "first_call_cache_memory_bytes": 38e6,
                            "first_call_process_rss_bytes": 470e6}
    row = summary_row("q8", {"family": "quant", "config": {}, "model_bytes": 5e7,
                             "bits_per_weight": 9.0}, {"agreement": 1.0}, _Verdict(), timing)
    summary = pd.DataFrame([row])
    tt = timing_table(summary).iloc[0]
    assert tt["allocator peak MB variant (ref)"] == "0.0 (0.0)"  # 90 and 100 bytes
    # the RSS is of the whole process: one number, not a variant's and a reference's
    assert list(tt.index[-3:]) == ["call's own MB variant (ref)",
                                   "allocator peak MB variant (ref)", "process RSS MB"]
    assert not any("cache" in c for c in tt.index)
    assert tt["process RSS MB"] == "471"
    assert row["b1_var_cache_memory_bytes"] == 12e6  # still in summary.csv
    cold = cold_start_table({}, summary).iloc[0]
    assert (cold["load: allocator peak MB"], cold["1st call: allocator peak MB"],
            cold["1st call: cache MB"], cold["load: RSS MB"], cold["1st call: RSS MB"],
            cold["allocator peak MB"]) == ("92.0", "155.0", "38.0", "400.0", "470.0", "180.0")


def test_cold_start_of_a_variant_given_as_a_config(sentiment):
    """A search's finalist (a mixed map) is in no ladder of its sweep's parameters: its cold
    start failed 'not in family'; the spec now carries the variant's config."""
    from variants.families.quant.config import QuantConfig
    from variants.sweep.coldstart import measure_cold_start

    model, ts = sentiment
    cfg = QuantConfig(bits=8, bits_map="value=4")
    r = measure_cold_start({"model": "minilm-sentiment", "head_path": None,
                            "taskset": ts.subset([0]), "family": "quant", "params": {},
                            "variant": cfg.name, "config": cfg}, timeout_s=120)
    assert "error" not in r, r
    assert r["what"] == cfg.name and r["build_s"] > 0
    assert r["model_bytes"] < 60e6  # built quantized (fp32 MiniLM: 90.3 MB)

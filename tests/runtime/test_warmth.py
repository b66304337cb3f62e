"""Timing labels tell the truth (issue #39): a timed call that is the first of its shape since
the buffer cache was cleared is labelled cold, ``--timing-warmup 0`` yields such labels and the
timing alarm's reason, warm-ups >= 1 yield none, and every measurement starts from an empty
buffer cache, so a tiny B=1 call's cache is its own (not the hundreds of MB earlier work left)."""

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from variants.runtime import warmth
from variants.runtime.timing import end_to_end_call, time_alternating
from variants.sweep import timing as sweep_timing


@pytest.fixture(scope="module")
def models(checkpoint):
    from variants.datasets import bundled as data
    from variants.models import sentiment

    frame = data.load_vader()
    ts = sentiment.make_taskset(data.sample(data.split_frame(frame, "eval"), 30, seed=0))
    ref = sentiment.build(checkpoint)
    ref.fit_head(ts)
    ref.temperatures = {3: 1.0}
    var = ref.replace_module(ref.module)  # another DecisionModel: its shapes are its own
    var.temperatures = dict(ref.temperatures)
    return ref, var, ts


def test_first_call_of_a_shape_is_cold(models):
    ref, var, ts = models
    one, four = ts.subset(np.arange(1)), ts.subset(np.arange(4))
    warmth.clear_buffer_cache()
    assert end_to_end_call(ref, one)().cold is True
    assert end_to_end_call(ref, one)().cold is False  # same (B, L), same model: warm
    assert end_to_end_call(var, one)().cold is True  # another model: its own first
    assert end_to_end_call(ref, four)().cold is True  # another shape
    assert end_to_end_call(ref, four)().cold is False
    warmth.clear_buffer_cache()  # fresh buffers: cold again
    assert end_to_end_call(ref, one)().cold is True


def _cfg(warmup, rounds=3):
    return SimpleNamespace(speed_mode="simulated", timing_warmup=warmup, timing_rounds=rounds,
                           timing_min_rounds=rounds, timing_budget_s=60.0)


def test_warmup_zero_labels_cold_calls_and_the_alarm_flags_them(models):
    ref, var, ts = models
    sets = sweep_timing.timing_batches(ref, ts, [1, 4], seed=0)
    out = sweep_timing.time_pair(ref, var, sets, _cfg(0))
    for region in ("batches", "end_to_end"):
        for b in ("1", "4"):
            e = out[region][b]
            # the first round of each model is the first call after the clear
            assert e["ref_cold"][0] and e["var_cold"][0], (region, b)
            assert e["ref_cold_calls"] >= 1 and e["var_cold_calls"] >= 1
            assert len(e["ref_cold"]) == len(e["ref_ms"]) == e["rounds"]
            p = e["plausibility"]
            assert p["implausible"] and p["cold_rounds"] >= 1
            assert any("includes cold calls" in r for r in p["reasons"])
    # B=4 repeats one batch: only its first round is cold
    assert out["batches"]["4"]["ref_cold"] == [True, False, False]
    assert out["implausible"]


def test_warmups_leave_no_cold_call(models):
    ref, var, ts = models
    sets = sweep_timing.timing_batches(ref, ts, [1, 4], seed=0)
    out = sweep_timing.time_pair(ref, var, sets, _cfg(1))
    for region in ("batches", "end_to_end"):
        for b in ("1", "4"):
            e = out[region][b]
            assert e["ref_cold_calls"] == e["var_cold_calls"] == 0
            assert not any(e["ref_cold"] + e["var_cold"])
            assert e["plausibility"]["cold_rounds"] == 0
            assert not any("cold" in r for r in e["plausibility"]["reasons"])
    # the rounds read as a table: one row per round, the cold labels a boolean column
    import pandas as pd

    e = out["batches"]["1"]
    frame = pd.DataFrame({k: e[k] for k in ("ref_ms", "var_ms", "ref_cold", "var_cold")})
    assert frame["ref_cold"].dtype == bool and len(frame) == 3


def test_the_cache_is_cleared_before_a_measurement(models):
    """A tiny B=1 call's cache after the measurement is its own buffers, not what earlier work
    (here a 256 MB array, freed) left in MLX's cache."""
    ref, var, ts = models
    one = ts.subset(np.arange(1))
    big = mx.zeros((64, 1 << 20))  # 256 MB
    mx.eval(big)
    del big
    assert mx.get_cache_memory() >= 256e6
    r = time_alternating(end_to_end_call(ref, one), end_to_end_call(var, one), warmup=1,
                         rounds=3, budget_s=60)
    assert r["cache_cleared_bytes"] >= 256e6
    for side in ("ref", "var"):
        assert r[f"{side}_cache_memory_bytes"] < 64e6, r[f"{side}_cache_memory_bytes"]
        # the call's own bytes are a few MB here; the allocator peak holds the weights too
        assert 0 <= r[f"{side}_peak_over_active_bytes"] < r[f"{side}_peak_memory_bytes"]

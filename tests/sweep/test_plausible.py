"""The implausible-timing alarm (variants.sweep.plausible): a call faster than its Linear FLOPs at the
measured GEMM peak, or a speed-up over 3× the cost model's ideal, is flagged in timing.json and
report.md; a variant whose forward returns cached logits is caught, the reference against
itself is not."""

from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import pandas as pd
import pytest

from variants.sweep import plausible


def test_assess_floor_and_ideal_by_hand():
    # 1e9 FLOPs at 2 × 5e10 FLOP/s: no call can take less than 10 ms
    r = plausible.assess([12.0, 9.0, 15.0], 1.1, flops=1e9, rate=5e10)
    assert plausible.SAFETY == 2.0 and r["reference_flops_per_s"] is None
    assert r["floor_ms"] == pytest.approx(10.0, rel=1e-12) and r["rounds_below_floor"] == 1
    assert r["implausible"] and len(r["reasons"]) == 1 and "1 of 3 variant calls" in r["reasons"][0]
    # an ideal of 2 halves the work the variant claims: 5 ms floor, nothing below it
    r = plausible.assess([12.0, 9.0, 15.0], 6.0, flops=1e9, rate=5e10, ideal_speedup=2.0)
    assert r["floor_ms"] == pytest.approx(5.0, rel=1e-12) and not r["implausible"]
    assert r["speedup_over_ideal"] == pytest.approx(3.0)  # exactly 3×: not more than 3×
    r = plausible.assess([12.0], 7.0, flops=1e9, rate=5e10, ideal_speedup=2.0)
    assert r["implausible"] and "3.5× the cost model's ideal" in r["reasons"][0]
    assert not plausible.assess([12.0], None, flops=1e9, rate=5e10)["implausible"]
    # early exit: one batch may leave at layer 1 of 6 (max 6×) though the average gains 1.2×
    r = plausible.assess([12.0], 5.5, flops=1e9, rate=5e10, ideal_speedup=1.2, max_speedup=6.0)
    assert not r["implausible"] and r["ideal_speedup"] == 6.0
    # the reference's own forward ran at 1e9 FLOPs / 4 ms = 2.5e11 FLOP/s > 5e10: floor 2 ms
    r = plausible.assess([3.0], 1.3, flops=1e9, rate=5e10, ref_ms=[4.0, 5.0])
    assert r["reference_flops_per_s"] == pytest.approx(2.5e11) and not r["implausible"]
    assert r["floor_ms"] == pytest.approx(2.0, rel=1e-12)
    assert plausible.assess([1.9], 2.1, flops=1e9, rate=5e10, ref_ms=[4.0])["implausible"]


def test_linear_flops_of_minilm(checkpoint):
    from variants.models import sentiment

    model = sentiment.build(checkpoint)
    # 6 layers of Q, K, V, O (384 x 384) and the MLP (384 x 1536, 1536 x 384), 2 FLOPs a MAC
    per_layer = 2 * (4 * 384 * 384 + 2 * 384 * 1536)
    assert plausible.linear_flops_per_token(model.module) == 6 * per_layer == 21_233_664
    # a packed (exported) encoder counts its unpacked sizes: the same FLOPs
    from variants.families.quant.family import QuantConfig
    from variants.families.quant.build import quantize_module

    for bits in (3, 8):
        packed, _ = quantize_module(model.module, QuantConfig(bits=bits), mode="native")
        assert plausible.linear_flops_per_token(packed) == 21_233_664
    with pytest.raises(ValueError, match="no Linear layer"):
        plausible.linear_flops_per_token(nn.Sequential(nn.ReLU()))


def test_gemm_rate_is_measured():
    r = plausible.gemm_rate()
    assert r["flops_per_s"] == pytest.approx(2 * r["n"] ** 3 / (r["best_ms"] / 1e3), rel=1e-9)
    assert r["flops_per_s"] == max(r["per_size"].values())
    assert set(r["per_size"]) == {384, 768, 1024}
    assert 1e8 < r["flops_per_s"] < 1e14  # anything from a phone core to a GPU


class CachedLogits(nn.Module):
    """A 'variant' whose forward does no model work: stored logits, whatever the input."""

    def __call__(self, input_ids, attention_mask, token_type_ids):
        return mx.zeros((input_ids.shape[0], 3))


@pytest.fixture(scope="module")
def timed(checkpoint):
    from variants.datasets import bundled as data
    from variants.models import sentiment
    from variants.sweep.timing import time_pair

    model = sentiment.build(checkpoint)
    model.temperatures = {3: 1.0}
    ts = sentiment.make_taskset(data.sample(data.split_frame(data.load_vader(), "eval"), 8,
                                            seed=0))
    cfg = SimpleNamespace(speed_mode="simulated", timing_warmup=1, timing_rounds=3,
                          timing_min_rounds=3, timing_budget_s=30.0)
    sets = {8: (ts, 0)}
    cached = time_pair(model, model.replace_module(CachedLogits()), sets, cfg)
    same = time_pair(model, model, sets, cfg)
    return cached, same


def test_cached_logits_are_flagged_and_the_reference_is_not(timed):
    cached, same = timed
    assert cached["implausible"] and not same["implausible"]
    for region in ("batches", "end_to_end"):
        p = cached[region]["8"]["plausibility"]
        assert p["implausible"] and p["rounds_below_floor"] == 3
        assert p["fastest_var_ms"] < p["floor_ms"]
        assert not same[region]["8"]["plausibility"]["implausible"]
    assert cached["gemm_rate"]["flops_per_s"] > 0


def test_report_shows_the_flag(timed):
    from runs.report import format_table, summary_row
    from runs.report_facts import implausible_lines

    cached, _ = timed
    verdict = SimpleNamespace(passed=True, failed=[], undecided=[], word="PASS")
    row = summary_row("cached", {"family": "x", "config": {}}, {"agreement": 1.0, "ece_ref": 0.03},
                      verdict, cached)
    summary = pd.DataFrame([row])
    assert format_table(summary)["speed-up B=8"].iloc[0].endswith("⚠ implausible")
    lines = implausible_lines(summary)
    assert lines[0] == "====== Implausible timings ======"
    assert sum(line.startswith("- `cached`, ") for line in lines) == 2  # forward and end to end
    assert "faster than the" in lines[-2]
    ok = summary_row("same", {"family": "x", "config": {}}, {"agreement": 1.0}, verdict,
                     timed[1])
    assert implausible_lines(pd.DataFrame([ok])) == []


def test_a_speedup_resting_on_cold_calls_is_flagged():
    """A cold reference call (the first of its shape) inflates the ratio: 4.31× here, from one
    round of 63.8 vs 14.8 ms (the q4 sweep of issue #39 under --timing-warmup 0); the reason
    gives the warm rounds' median."""
    kw = dict(flops=1e6, rate=5e10)  # a floor far under every call: only coldness can flag
    r = plausible.assess([14.8, 15.0, 15.2], 4.31, ref_ms=[63.8, 15.0, 15.2],
                         ref_cold=[True, False, False], var_cold=[False, False, False], **kw)
    assert r["implausible"] and r["cold_rounds"] == 1
    assert r["warm_speedup_median"] == pytest.approx(1.0)
    assert len(r["reasons"]) == 2 and "includes cold calls: 1 of 3 rounds" in r["reasons"][1]
    assert "reference 1, variant 0" in r["reasons"][1] and "1× " in r["reasons"][1]
    # every round cold (one round, no warm-up): no warm median to give
    r = plausible.assess([14.8], 1.0, ref_ms=[14.8], ref_cold=[True], var_cold=[True], **kw)
    assert r["implausible"] and "no round had both calls warm" in r["reasons"][0]
    # warm rounds, or no labels (a run from before them): nothing to flag
    for cold in ([False, False], None):
        r = plausible.assess([10.0, 10.0], 1.0, ref_ms=[10.0, 10.0], ref_cold=cold,
                             var_cold=cold, **kw)
        assert not r["implausible"] and r["cold_rounds"] == 0

"""The sweep's B=1 timing cycles over several eval texts (variants.sweep.timing): the timed
inputs differ from call to call, and reference and variant time the same text in every round."""

import numpy as np
import pytest

from variants.sweep import timing as sweep_timing
from variants.runtime.timing import rotating, time_alternating


def test_rotation_gives_both_sides_the_same_position_every_round():
    import mlx.core as mx

    log = []
    ref = rotating([lambda k=k: log.append(("ref", k)) or mx.array(k) for k in range(3)])
    var = rotating([lambda k=k: log.append(("var", k)) or mx.array(k) for k in range(3)])
    r = time_alternating(ref, var, warmup=2, rounds=5, min_rounds=5, budget_s=60.0)
    # warm-ups (one per position: 3, though 2 were asked) and rounds: strict alternation, ref
    # then var, positions 0 1 2 | 0 1 2 0 1
    assert log == [(side, k % 3) for k in range(8) for side in ("ref", "var")]
    assert r["warmup"] == 2 and r["warmup_run"] == 3
    assert not any(r["ref_cold"] + r["var_cold"])

    def single():
        return mx.array(0)
    assert rotating([single]) is single  # one call: itself, as before the cycle


@pytest.fixture(scope="module")
def models(checkpoint):
    from variants.datasets import bundled as data
    from variants.models import sentiment

    frame = data.load_vader()
    ts = sentiment.make_taskset(data.sample(data.split_frame(frame, "eval"), 30, seed=0))
    ref = sentiment.build(checkpoint)
    ref.fit_head(ts)
    ref.temperatures = {3: 1.0}
    var = ref.replace_module(ref.module)  # another DecisionModel: its calls are told apart
    var.temperatures = dict(ref.temperatures)
    return ref, var, ts


def test_b1_set_is_distinct_texts_around_the_median_length(models):
    ref, _, ts = models
    sets = sweep_timing.timing_batches(ref, ts, [1, 4], seed=0)
    one, seq_len = sets[1]
    lengths = [len(e.ids) for e in ref.tokenizer.encode(list(ts.texts))[0]]
    median = sorted(lengths)[len(lengths) // 2]
    assert len(one) == sweep_timing.B1_TEXTS == len(set(one.texts))
    first = one.texts[0]
    assert lengths[list(ts.texts).index(first)] == median  # the median text first, as before
    # the 8 nearest the median in length order: none further out than the 4th either side
    ranked = sorted(lengths)
    m = len(ranked) // 2
    lo, hi = ranked[m - 4], ranked[m + 4]
    assert all(lo <= lengths[list(ts.texts).index(t)] <= hi for t in one.texts)
    assert seq_len == ref.prepare(one.subset(np.arange(1)), batch_size=1)[0][0].input_ids.shape[1]
    assert [len(b) for b in sweep_timing.timed_batches(one, 1)] == [1] * 8
    assert len(sets[4][0]) == 4 and sweep_timing.timed_batches(sets[4][0], 4) == [sets[4][0]]


def test_time_pair_times_other_texts_each_call_and_the_same_for_both(models, monkeypatch):
    from types import SimpleNamespace

    ref, var, ts = models
    sets = sweep_timing.timing_batches(ref, ts, [1, 4], seed=0)
    seen = []
    real = sweep_timing.end_to_end_call

    def recording(model, taskset):
        fn = real(model, taskset)
        side = "ref" if model is ref else "var"

        def call():
            seen.append((side, tuple(taskset.texts)))
            return fn()
        return call

    monkeypatch.setattr(sweep_timing, "end_to_end_call", recording)
    cfg = SimpleNamespace(speed_mode="simulated", timing_warmup=1, timing_rounds=10,
                          timing_min_rounds=10, timing_budget_s=60.0)
    out = sweep_timing.time_pair(ref, var, sets, cfg)
    b1 = [t for _, t in seen if len(t) == 1]
    refs, vars_ = b1[0::2], b1[1::2]
    # warm-ups: one per text (8, though 1 was asked), then 10 rounds
    assert [s for s, t in seen if len(t) == 1] == ["ref", "var"] * 18
    assert refs == vars_  # the same text for reference and variant in every round
    assert all(a != b for a, b in zip(refs, refs[1:]))  # a new text every call
    assert {t[0] for t in refs[8:]} == set(sets[1][0].texts)  # all 8 timed (10 rounds)
    e = out["end_to_end"]["1"]
    assert e["batch_size"] == 1 and e["texts_cycled"] == 8 and e["rounds"] == 10
    assert e["seq_lens"] == [ref.prepare(ts.subset(np.array([list(ts.texts).index(t)])),
                                         batch_size=1)[0][0].input_ids.shape[1]
                             for t in sets[1][0].texts]
    assert e["seq_len"] == e["seq_lens"][0] and out["batches"]["1"]["texts_cycled"] == 8
    # B=4: one batch, repeated, as before
    b4 = {t for _, t in seen if len(t) == 4}
    assert len(b4) == 1 and "texts_cycled" not in out["end_to_end"]["4"]
    assert out["end_to_end"]["4"]["batch_size"] == 4

"""Segment profile, Amdahl ceilings, work-count slopes and the fast exp/softmax (issue #6)."""

import mlx.core as mx
import numpy as np
import pytest

from variants import fast_ops
from variants.encoder import BertEncoder, ModelArgs, mean_pool
from variants.profile import amdahl, amdahl_ceilings, count_work, work_slopes
from variants.timing import time_alternating

TINY = ModelArgs.from_dict({"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "intermediate_size": 128})


def test_amdahl_matches_the_seed_example():
    # DIGEST.md: a 67.87x kernel at p = 5.32% gives at most 1.055x
    assert amdahl(0.0532, 67.87) == pytest.approx(1.055, abs=1e-3)
    assert amdahl(0.0532) == pytest.approx(1 / (1 - 0.0532))
    with pytest.raises(ValueError, match="p must be a share"):
        amdahl(1.5)


def test_ceilings_sum_the_family_segments():
    prof = {"share": {"a": 0.25, "b": 0.25, "c": 0.5}}
    out = amdahl_ceilings(prof, {"fam": ("a", "b")})
    assert out["fam"] == (0.5, pytest.approx(2.0))


def test_fast_exp_is_float32_accurate():
    x = np.linspace(-87, 88, 400_001, dtype=np.float32)
    got = np.array(mx.compile(fast_ops.exp)(mx.array(x)), np.float64)
    want = np.exp(x.astype(np.float64))
    assert (np.abs(got - want) / want).max() < 2e-7


def test_masked_softmax_matches_precise_softmax_and_survives_full_masking():
    s = mx.random.normal((2, 3, 5, 7), key=mx.random.key(0)) * 10
    bias = mx.array(np.where(np.arange(7) < 4, 0.0, -1e9).astype(np.float32))[None, None, None, :]
    got = np.array(fast_ops.masked_softmax(s, bias))
    want = np.array(mx.softmax(s + bias, axis=-1, precise=True))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    full = np.array(fast_ops.masked_softmax(s, mx.full((1, 1, 1, 7), -1e9)))
    assert np.all(np.isfinite(full))
    np.testing.assert_allclose(full.sum(-1), 1.0, atol=1e-5)


def test_work_per_forward_does_not_grow_with_tokens_or_examples():
    enc = BertEncoder(TINY)
    mx.eval(enc.parameters())

    def forward(batch):
        ids, mask = batch
        return mean_pool(enc(ids, mask).last_hidden, mask)

    def make(B, L):
        return mx.zeros((B, L), mx.int32), mx.ones((B, L), mx.int32)

    from variants.parallel import single_stream
    with single_stream():  # the two-stream split (variants.parallel) doubles the calls above a size
        rows, slopes = work_slopes(forward, make, seq_lens=(4, 8, 16), batch_sizes=(1, 2, 4))
    assert len(rows) == 9
    assert all(r["compiled_calls"] == 2 * TINY.num_hidden_layers for r in rows)  # softmax + gelu
    for s in slopes.values():
        assert s["per_token"] == pytest.approx(0.0, abs=1e-9)
        assert s["per_example"] == pytest.approx(0.0, abs=1e-9)


def test_count_work_restores_what_it_patched():
    real_eval, real_gelu = mx.eval, fast_ops.gelu
    with count_work() as c:
        mx.eval(mx.array(1.0))
    assert c["evals"] == 1
    assert mx.eval is real_eval and fast_ops.gelu is real_gelu


def test_a_vs_a_timing_is_tight_and_centred_on_one():
    """Issue #6: the harness must not pollute itself; A vs A gives a median ratio ~1."""
    x = mx.random.normal((256, 256), key=mx.random.key(1))
    fn = lambda: x @ x  # noqa: E731
    r = time_alternating(fn, fn, warmup=2, rounds=15, budget_s=30.0)
    assert 0.8 < r["speedup"]["speedup_median"] < 1.25
    assert r["speedup"]["speedup_ci_low"] < 1.0 < r["speedup"]["speedup_ci_high"] or \
        abs(r["speedup"]["speedup_median"] - 1.0) < 0.1

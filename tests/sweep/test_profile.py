"""Segment profile, Amdahl ceilings, work-count slopes and the fast exp/softmax."""

import mlx.core as mx
import numpy as np
import pytest

from variants.runtime import fast_ops
from variants.arch.encoder import BertEncoder, ModelArgs, mean_pool
from variants.sweep.profile import (FAMILY_SEGMENTS, LAYER_SEGMENTS, amdahl, amdahl_ceilings,
                                    exit_speedup, prune_speedup)
from variants.sweep.work_counts import count_work, work_slopes
from variants.runtime.timing import time_alternating

TINY = ModelArgs.from_dict({"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "intermediate_size": 128})


def test_amdahl_matches_the_seed_example():
    # a 67.87x kernel at p = 5.32% gives at most 1.055x
    assert amdahl(0.0532, 67.87) == pytest.approx(1.055, abs=1e-3)
    assert amdahl(0.0532) == pytest.approx(1 / (1 - 0.0532))
    with pytest.raises(ValueError, match="p must be a share"):
        amdahl(1.5)


def test_ceilings_sum_the_family_segments():
    prof = {"share": {"a": 0.25, "b": 0.25, "c": 0.5}}
    out = amdahl_ceilings(prof, {"fam": ("a", "b")})
    assert out["fam"] == (0.5, pytest.approx(2.0))


def test_fast_exp_is_float32_accurate_on_what_softmax_passes():
    x = np.linspace(-87, 0, 400_001, dtype=np.float32)
    got = np.array(fast_ops.exp_nonpositive(mx.array(x)), np.float64)
    want = np.exp(x.astype(np.float64))
    assert (np.abs(got - want) / want).max() < 2e-7
    # below float32's normal range it stays a tiny positive normal instead of a denormal or 0
    low = np.array(fast_ops.exp_nonpositive(mx.array([-100.0, -1e9], mx.float32)))
    assert np.all(low > 0) and np.all(low < 1.3e-38)


def test_fast_gelu_matches_exact_erf_gelu():
    from scipy.special import erf
    x = np.linspace(-10, 10, 400_001, dtype=np.float32)
    got = np.array(fast_ops.gelu(mx.array(x)), np.float64)
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * (1 + erf(x64 / np.sqrt(2)))
    assert np.abs(got - want).max() < 1.5e-6
    # small inputs keep their relative accuracy (GELU(x) ~ x/2 there)
    small = np.abs(x64) < 1e-2
    assert (np.abs(got - want)[small] / np.abs(want[small]).clip(1e-30)).max() < 1e-5


def test_softmax_parts_normalise_to_the_softmax():
    s = mx.random.normal((2, 3, 5, 7), key=mx.random.key(3)) * 10
    e, total = fast_ops.softmax_parts(s)
    np.testing.assert_allclose(np.array(e / total), np.array(mx.softmax(s, axis=-1, precise=True)),
                               rtol=1e-5, atol=1e-7)
    assert np.array(e).max() == 1.0 and total.shape == (2, 3, 5, 1)


def test_masked_softmax_matches_precise_softmax_and_survives_full_masking():
    s = mx.random.normal((2, 3, 5, 7), key=mx.random.key(0)) * 10
    bias = mx.array(np.where(np.arange(7) < 4, 0.0, -1e9).astype(np.float32))[None, None, None, :]
    got = np.array(fast_ops.masked_softmax(s, bias))
    want = np.array(mx.softmax(s + bias, axis=-1, precise=True))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    full = np.array(fast_ops.masked_softmax(s, mx.full((1, 1, 1, 7), -1e9)))
    assert np.all(np.isfinite(full))
    np.testing.assert_allclose(full.sum(-1), 1.0, atol=1e-5)


def test_work_per_forward_does_not_grow_with_tokens_or_examples(monkeypatch):
    monkeypatch.setenv("VARIANTS_FUSED_LAYER", "off")  # the MLX path's compiled functions
    enc = BertEncoder(TINY)
    mx.eval(enc.parameters())

    def forward(batch):
        ids, mask = batch
        return mean_pool(enc(ids, mask).last_hidden, mask)

    def make(B, L):
        return mx.zeros((B, L), mx.int32), mx.ones((B, L), mx.int32)

    try:  # the two-stream layer split (variants.runtime.parallel) doubles the compiled calls above a size
        from variants.runtime.parallel import single_stream
    except ImportError:
        from contextlib import nullcontext as single_stream
    with single_stream():
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


def test_a_vs_a_timing_is_centred_on_one_under_drift_and_spikes(fake_clock):
    """The harness must not pollute itself; A vs A gives a median ratio ~1 even on a
    machine that slows down 1% per call and stalls 3x on one call in ten (exact durations from
    a fake clock: on the real one this test failed on CI, median 1.15 on a loaded machine)."""
    rng = np.random.default_rng(0)
    n_calls = [0]

    def fn():
        n_calls[0] += 1
        spike = 3.0 if rng.random() < 0.1 else 1.0
        fake_clock.advance_ms(10.0 * (1 + 0.01 * n_calls[0]) * spike * rng.lognormal(0, 0.05))
        return mx.array(0.0)

    r = time_alternating(fn, fn, warmup=2, rounds=15, budget_s=30.0)
    assert n_calls[0] == 2 * (2 + 15) and r["rounds"] == 15
    s = r["speedup"]
    assert 0.95 < s["speedup_median"] < 1.05
    assert s["speedup_ci_low"] < 1.0 < s["speedup_ci_high"]
    # the drift is strong: unpaired, the last rounds look ~15% slower than the first ones
    ms = np.array(r["ref_ms"] + r["var_ms"])
    assert np.median(r["ref_ms"][-5:]) / np.median(r["ref_ms"][:5]) > 1.1
    assert r["ref_trend_per_round"] > 0.005 and ms.min() > 0


def test_a_vs_a_peak_memory_and_time_do_not_grow_across_rounds():
    x = mx.random.normal((128, 128), key=mx.random.key(2))
    fn = lambda: (x @ x).sum()  # noqa: E731
    r = time_alternating(fn, fn, warmup=2, rounds=20, budget_s=30.0)
    for key in ("ref_peak_memory_bytes_rounds", "var_peak_memory_bytes_rounds"):
        peaks = np.array(r[key], float)
        assert np.all(np.abs(peaks - peaks[0]) <= 0.01 * peaks[0] + 4096)
    assert abs(r["active_memory_growth_bytes"]) < 1 << 16
    assert r["rounds"] == r["rounds_requested"] == 20 and r["stopped_by"] == "rounds"


# A profile of a 6-layer encoder: the layers hold 90% of the time, attention 20 points of it.
PROFILE = {"n_layers": 6, "share": {
    "tokenisation": 0.02, "embeddings": 0.03, "qkv_proj": 0.2, "attention_core": 0.2,
    "out_proj": 0.1, "mlp_gemm": 0.3, "mlp_act": 0.05, "norms": 0.05, "pooling": 0.02,
    "head": 0.01, "postprocess": 0.02}}


def test_prune_and_exit_ceilings_count_only_the_layers_after_the_cut():
    """Regression: prune was credited with ~all of the forward (ceiling 48x or 653x)."""
    assert set(FAMILY_SEGMENTS) >= {"quant", "lowrank", "prune", "exit"}
    ceil = amdahl_ceilings(PROFILE)
    layers = sum(PROFILE["share"][s] for s in LAYER_SEGMENTS)
    assert layers == pytest.approx(0.9)
    p, c = ceil["prune"]  # default cut: after layer 1 of 6 -> 5/6 of the layer work
    assert p == pytest.approx(0.9 * 5 / 6)
    assert c == pytest.approx(1 / (1 - 0.75))  # 4x, not 1/(1 - 0.9) = 10x nor 48x
    assert ceil["exit"][0] == pytest.approx(0.75)
    assert ceil["quant"][0] == pytest.approx(0.6)
    deeper = amdahl_ceilings(PROFILE, depth={"prune": 3, "exit": 5})
    assert deeper["prune"][0] == pytest.approx(0.45) and deeper["exit"][0] == pytest.approx(0.15)
    with pytest.raises(ValueError, match="n_layers"):
        amdahl_ceilings({"share": PROFILE["share"]})
    with pytest.raises(ValueError, match="cut layer"):
        amdahl_ceilings(PROFILE, depth={"prune": 7})


def test_prune_speedup_shrinks_tokens_linearly_and_attention_quadratically():
    r = prune_speedup(PROFILE, after_layer=3, keep_ratio=0.5)
    p_tok, p_att = 0.5 * 0.7, 0.5 * 0.2
    assert r["p_per_token"] == pytest.approx(p_tok) and r["p_attention"] == pytest.approx(p_att)
    assert r["speedup"] == pytest.approx(1 / (1 - p_tok * 0.5 - p_att * 0.75))
    assert r["ceiling"] == pytest.approx(1 / (1 - 0.45))
    assert prune_speedup(PROFILE, after_layer=1, keep_ratio=1.0)["speedup"] == pytest.approx(1.0)
    assert prune_speedup(PROFILE, after_layer=6, keep_ratio=0.1)["speedup"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="keep_ratio"):
        prune_speedup(PROFILE, after_layer=1, keep_ratio=0.0)


def test_exit_speedup_counts_the_skipped_layers_and_the_exiting_share():
    r = exit_speedup(PROFILE, exit_layer=3, exit_share=0.5)
    assert r["p"] == pytest.approx(0.45)
    assert r["speedup"] == pytest.approx(1 / (1 - 0.225))
    assert r["ceiling"] == pytest.approx(1 / (1 - 0.45))
    with pytest.raises(ValueError, match="exit_share"):
        exit_speedup(PROFILE, exit_layer=3, exit_share=1.5)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_fast_ops_in_half_precision_compute_in_float32(dtype):
    x = mx.array(np.linspace(-20, 0, 1001, dtype=np.float32))
    got = fast_ops.exp_nonpositive(x.astype(dtype))
    assert got.dtype == dtype
    want = np.exp(np.array(x.astype(dtype).astype(mx.float32), np.float64))
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), want, rtol=1e-2, atol=1e-7)
    g = fast_ops.gelu(x.astype(dtype) + 10)
    assert g.dtype == dtype and np.isfinite(np.array(g.astype(mx.float32))).all()
    s = mx.array([[0.0, 0.0]], dtype)
    from variants.arch.encoder import attention_bias
    bias = attention_bias(mx.array([[1, 0]]), dtype)  # -1e9 is -inf in float16
    assert np.isfinite(np.array(bias.astype(mx.float32))).all()
    p = np.array(fast_ops.masked_softmax(s, bias[0, 0]).astype(mx.float32))
    np.testing.assert_allclose(p, [[1.0, 0.0]], atol=1e-3)


@pytest.mark.parametrize("lengths,L,mlp_rows", [
    ([16, 3, 10, 4, 8], 16, 41),   # packed: the MLP sees the 41 real tokens, not 5 x 16
    ([16, 16, 15, 16], 16, 64),    # under MIN_PADDING: the padded batch
    ([9], 12, 9),                  # one sequence, under 32 tokens: one packed part
    ([40], 64, None),              # one sequence the forward splits by heads: padded, one part
    ([12], 12, 12)])               # no padding: the plain batch
def test_segmented_forward_runs_the_forward_it_profiles(enc, monkeypatch, lengths, L, mlp_rows):
    """The segments time the same execution as the whole forward (packed when it packs; the
    profile used to time padded batches while the forward packed them, and printed -87%
    unattributed time): same pooled output, same rows through the MLP."""
    from variants.arch import encoder as encoder_module
    from variants.runtime import parallel
    from variants.sweep.profile import SEGMENTS, _segmented_forward
    if mlp_rows is None:  # head split with two or more streams, else packed like any batch
        mlp_rows = L if len(parallel.streams()) > 1 else sum(lengths)
    rows = []
    gelu = encoder_module.ACTIVATIONS["gelu"]
    monkeypatch.setitem(encoder_module.ACTIVATIONS, "gelu",
                        lambda x: rows.append(x.size // x.shape[-1]) or gelu(x))
    rng = np.random.default_rng(L)
    ids = mx.array(rng.integers(1, 50, (len(lengths), L)).astype(np.int32))
    mask = mx.array((np.arange(L)[None] < np.array(lengths)[:, None]).astype(np.int32))
    types = mx.zeros_like(ids)
    acc = {}
    got, gemm_rows = _segmented_forward(enc, ids, mask, types, acc)
    assert sum(rows) == mlp_rows * len(enc.layers) and gemm_rows == mlp_rows
    want = mean_pool(enc(ids, mask, types).last_hidden, mask)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=1e-6)
    assert set(acc) == set(SEGMENTS) - {"tokenisation", "head", "postprocess"}
    assert all(v >= 0 for v in acc.values())


@pytest.mark.parametrize("scale,shift", [(1.0, 0.0), (10.0, 5.0), (1.0, 50.0)])
def test_layer_norm_matches_float64_at_least_as_well_as_mlx(scale, shift):
    rng = np.random.default_rng(int(scale + shift))
    x = (rng.standard_normal((300, 384)) * scale + shift).astype(np.float32)
    w, b = rng.standard_normal((2, 384)).astype(np.float32)
    x64 = x.astype(np.float64)
    normed = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-12)
    want = normed * w + b
    got = np.array(fast_ops.layer_norm(mx.array(x), mx.array(w), mx.array(b), 1e-12))
    ref = np.array(mx.fast.layer_norm(mx.array(x), mx.array(w), mx.array(b), 1e-12))
    # shift 50 with unit spread loses ~7 bits to the mean in float32 either way
    tol = 2e-4 if shift > 10 else 5e-6
    assert np.abs(got - want).max() < tol
    assert np.abs(got - want).max() <= 1.5 * np.abs(ref - want).max()
    # no affine parameters, and a half-precision input (mx.fast's path) keep working
    plain = np.array(fast_ops.layer_norm(mx.array(x), eps=1e-12), np.float64)
    np.testing.assert_allclose(plain, normed, rtol=0, atol=tol)
    half = fast_ops.layer_norm(*(mx.array(a).astype(mx.float16) for a in (x, w, b)), 1e-5)
    assert half.dtype == mx.float16 and np.isfinite(np.array(half.astype(mx.float32))).all()

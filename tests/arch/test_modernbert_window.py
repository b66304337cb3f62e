"""ModernBERT's windowed local attention (variants/arch/modernbert_window.py) computes exactly what
the dense masked path computes: against an independent NumPy dense reference (padding, gapped
positions, the window edges), on every layer of the two fixture checkpoints (a 307-token row
with padding; window 128 and 64), against Hugging Face with the windowed path forced, and the
choice of path (mode, crossover, positions that do not increase, env var)."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from variants.arch import modernbert_window as W
from variants.checkpoints.load import load_checkpoint

HF = Path(__file__).parents[1] / "fixtures" / "hf"
NAMES = ["modernbert", "modernbert_g2"]


@pytest.fixture(scope="module")
def loaded():
    return {n: load_checkpoint(HF / n) for n in NAMES}


def _ref(name):
    return dict(np.load(HF / name / "reference.npz"))


def _hidden(enc, ids, mask, real, mode):
    enc.local_attention_impl = mode
    try:
        out = enc(ids, mask, output_hidden_states=True)
    finally:
        enc.local_attention_impl = None
    return np.stack([np.array(h)[real] for h in out.hidden_states])


def _numpy_window_attention(q, k, v, scale, mask, pos, half):
    """Dense softmax over the keys with mask 1 and |p_q - p_k| <= half, in float64."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    ok = (np.abs(pos[:, :, None] - pos[:, None, :]) <= half) & (mask[:, None, :] == 1)
    s = np.where(ok[:, None], s, -1e30)  # padded query rows: uniform, dropped below
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", s / s.sum(axis=-1, keepdims=True), v)


@pytest.mark.parametrize("half,block,L", [(8, 8, 50), (8, 16, 37), (5, 3, 23), (16, 16, 16)])
def test_windowed_attention_equals_a_dense_numpy_reference(half, block, L):
    rng = np.random.default_rng(half * 100 + L)
    B, H, d = 3, 2, 4
    q, k, v = (rng.normal(size=(B, H, L, d)).astype(np.float32) for _ in range(3))
    mask = np.ones((B, L), np.int32)
    mask[1, L - L // 3:] = 0  # trailing padding
    # row 2: pruned positions, increasing with gaps (0, 2, 3, 7, ...)
    pos = np.stack([np.arange(L), np.arange(L),
                    np.cumsum(rng.integers(1, 4, L)) - 1]).astype(np.int32)
    plan = W.make_plan(mx.array(mask), mx.array(pos), half, block)
    got = np.array(W.windowed_attention(mx.array(q), mx.array(k), mx.array(v), 0.5, plan))
    want = _numpy_window_attention(q, k, v, 0.5, mask, pos, half)
    real = mask.astype(bool)
    assert got.shape == (B, H, L, d)
    assert np.abs(got.transpose(0, 2, 1, 3)[real] - want.transpose(0, 2, 1, 3)[real]).max() < 1e-5
    # the window matters: a half-width window gives other outputs
    narrow = W.make_plan(mx.array(mask), mx.array(pos), max(half // 2, 1), block)
    other = np.array(W.windowed_attention(mx.array(q), mx.array(k), mx.array(v), 0.5, narrow))
    if L > half + 1:
        assert np.abs(other - got).max() > 1e-2


@pytest.mark.parametrize("name", NAMES)
def test_windowed_equals_masked_on_every_layer(name, loaded):
    enc, ref = loaded[name].encoder, _ref(name)
    ids, mask = mx.array(ref["input_ids"]), mx.array(ref["attention_mask"])
    real = ref["attention_mask"].astype(bool)
    assert ids.shape[1] == 307 and not real.all()  # L = 307, padding in the batch
    # auto takes the window here (307 >= CROSSOVER * window): test_parity_hf runs this path
    assert enc.context(mask).windowed and enc.context(mask).window() is not None
    masked = _hidden(enc, ids, mask, real, "masked")
    windowed = _hidden(enc, ids, mask, real, "windowed")
    assert np.abs(windowed - masked).max(axis=(1, 2)).max() <= 1e-5
    # and both match transformers (the layers differ: a wrong window would show)
    assert np.abs(windowed - ref["hidden"]).max() <= 1e-4
    assert np.abs(masked[-1]).std() > 0.1


def test_pruned_in_order_positions_keep_the_window_and_its_outputs(loaded):
    """take_tokens keeping every other slot of the 307-token row: positions 0, 2, 4, ...
    still increase, so the windowed path is used and equals the masked one."""
    enc, ref = loaded["modernbert"].encoder, _ref("modernbert")
    ids, mask = mx.array(ref["input_ids"][:1]), mx.array(ref["attention_mask"][:1])
    keep = mx.arange(0, ids.shape[1], 2)[None]
    x = enc.embed(ids)[:, keep[0]]
    out = {}
    for mode in ("masked", "windowed"):
        enc.local_attention_impl = mode
        ctx = enc.context(mask).take_tokens(keep, mx.ones(keep.shape, mx.int32))
        assert ctx.windowed == (mode == "windowed")
        h = x
        for i in range(len(enc.layers)):
            h, _ = enc.apply_layer(i, h, ctx)
        out[mode] = np.array(h)
    enc.local_attention_impl = None
    assert np.abs(out["windowed"] - out["masked"]).max() <= 1e-5


def test_the_path_is_chosen_by_mode_length_and_positions(loaded, monkeypatch):
    enc = loaded["modernbert"].encoder  # window 128
    short = mx.ones((1, 200), mx.int32)  # 200 < CROSSOVER * 128: masked under auto
    long = mx.ones((1, 300), mx.int32)
    assert enc.context(long).windowed  # auto: 300 >= CROSSOVER * 128
    assert not enc.context(short).windowed
    rev = mx.arange(299, -1, -1)[None]
    assert not enc.context(long).take_tokens(rev, long).windowed  # reversed: masked path
    assert not W.positions_increase(np.array([[0, 1, 1, 2]]))
    monkeypatch.setenv(W.ENV, "masked")
    assert not enc.context(long).windowed
    monkeypatch.setenv(W.ENV, "windowed")
    assert enc.context(short).windowed
    enc.local_attention_impl = "masked"  # the attribute wins over the env var
    try:
        assert not enc.context(short).windowed
    finally:
        enc.local_attention_impl = None
    monkeypatch.setenv(W.ENV, "sparse")
    with pytest.raises(ValueError) as e:
        enc.context(long)
    assert "\n" not in str(e.value) and W.ENV in str(e.value) and "masked" in str(e.value)


def test_attention_probabilities_stay_dense_with_the_window_on(loaded):
    enc, ref = loaded["modernbert"].encoder, _ref("modernbert")
    ids, mask = mx.array(ref["input_ids"]), mx.array(ref["attention_mask"])
    enc.local_attention_impl = "windowed"
    try:
        out = enc(ids, mask, output_attentions=True)
    finally:
        enc.local_attention_impl = None
    probs = np.array(out.attentions[1])
    L = ids.shape[1]
    assert probs.shape == (3, 4, L, L)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    q, k = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    assert probs[0][:, np.abs(q - k) > 64].max() == 0.0

"""Attempts to break the merged fast paths (variants.runtime.fused_layer + qkernel/fused_layer.cpp,
variants.arch.modernbert_fast, variants.families.exact.outsel) with inputs their own tests do not use.

Each test compares the fast path against the MLX path of the same module
(``VARIANTS_FUSED_LAYER=off``; ``ModernBertEncoder.fast = False``), which is the stated contract
("else the caller keeps the MLX path (the same results)").

The four bugs this file first found as strict xfails (ids past the embedding table: SIGSEGV;
one non-float32 parameter: an error from the compiled op; L = 0: different outcomes per path;
rows past the position table) are fixed; their tests now assert the fixed behaviour."""

import copy
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from variants.runtime import fused_layer  # noqa: I001  (variants before mlx: OpenBLAS)
import mlx.core as mx
from mlx.utils import tree_flatten

from variants.arch.encoder import BertEncoder, ModelArgs, attention_bias

HF = Path(__file__).parents[1] / "fixtures" / "hf"


def _enc(D=32, H=4, F=64, act="gelu", seed=0, **kw):
    mx.random.seed(seed)
    e = BertEncoder(ModelArgs(vocab_size=50, hidden_size=D, num_hidden_layers=2,
                              num_attention_heads=H, intermediate_size=F, hidden_act=act,
                              max_position_embeddings=600, **kw))
    mx.eval(e.parameters())
    return e


def _mlx_layer(layer, x, bias, monkeypatch):
    """The layer's MLX path (the fused layer switched off), as NumPy."""
    with monkeypatch.context() as m:
        m.setenv(fused_layer.ENV_SWITCH, "off")
        y, _ = layer._forward(x, bias)
        return np.array(y)


def _fused(layer, x, bias, threads=0):
    y = fused_layer.forward(layer, x, bias, threads=threads)
    assert y is not None, "the fused layer should apply here"
    return np.array(y)


# ---- open bugs --------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["norm-weight-fp16", "query-bias-bf16"])
def test_a_layer_with_one_non_float32_parameter_takes_the_mlx_path(qk, which, monkeypatch):
    """fp32 projections but one low-precision norm weight / bias: the docstring promises the
    MLX path (same results) for anything but a plain fp32 layer; today the call raises."""
    layer = _enc().layers[0]
    if which == "norm-weight-fp16":
        layer.attention_norm.weight = layer.attention_norm.weight.astype(mx.float16)
    else:
        layer.attention.query.bias = layer.attention.query.bias.astype(mx.bfloat16)
    x = mx.array(np.random.default_rng(0).standard_normal((1, 6, 32)).astype(np.float32))
    want = _mlx_layer(layer, x, None, monkeypatch).astype(np.float32)
    got = np.array(layer(x, None)[0].astype(mx.float32))  # the stream layer: fused first
    assert np.abs(got - want).max() < 1e-2  # fp16/bf16 parameter: loose


def test_zero_length_batch_is_refused_on_both_paths(qk, monkeypatch):
    """L = 0 (no token at all): the same one-line ValueError with the fused layer on and off
    (the MLX path used to fail deep inside the attention, the fused one returned (B, 0, D))."""
    e = _enc()
    ids, mask = mx.zeros((2, 0), mx.int32), mx.ones((2, 0), mx.int32)
    with pytest.raises(ValueError, match="L >= 1"):
        e(ids, mask)
    monkeypatch.setenv(fused_layer.ENV_SWITCH, "off")
    with pytest.raises(ValueError, match="L >= 1"):
        e(ids, mask)


def test_ids_outside_the_table_and_too_long_rows_are_refused(qk):
    """In-process: a negative id, vocab_size itself, and a row longer than the position table
    (max_position_embeddings; RoBERTa pad_token_id + 1 fewer) are refused naming the limit."""
    e = _enc()
    with pytest.raises(ValueError, match=r"token id -1 .*vocab_size 50"):
        e(mx.array([[3, -1]]), mx.ones((1, 2), mx.int32))
    with pytest.raises(ValueError, match=r"token id 50 .*ids 0\.\.49"):
        e(mx.array([[50, 1]]), mx.ones((1, 2), mx.int32))
    long = mx.zeros((1, e.args.max_position_embeddings + 1), mx.int32)
    with pytest.raises(ValueError, match="exceeds the model's 600 positions"):
        e(long, mx.ones(long.shape, mx.int32))
    assert e(long[:, :600], mx.ones((1, 600), mx.int32)).last_hidden.shape == (1, 600, 32)


_OOB = """
import sys
import variants
import mlx.core as mx
from variants.arch.encoder import BertEncoder, ModelArgs
e = BertEncoder(ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=4, intermediate_size=64))
try:
    e(mx.array([[3, 1000000]]), mx.ones((1, 2), mx.int32)).last_hidden.tolist()
except (ValueError, IndexError) as err:
    print("refused:", err)
    sys.exit(2)
"""


def test_token_id_beyond_the_vocabulary_is_refused_not_a_segfault():
    """A checkpoint whose tokenizer knows more tokens than config.json's vocab_size (added
    tokens) reaches this; the process must not die with SIGSEGV."""
    r = subprocess.run([sys.executable, "-c", _OOB], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert r.returncode == 2 and "refused" in r.stdout, (r.returncode, r.stderr[-300:])


# ---- checks that hold today (not covered by tests/runtime/test_fused_layer.py) ------------------------

@pytest.mark.parametrize("view", ["stride2", "transposed", "broadcast", "reversed-features",
                                  "offset-slice"])
def test_non_contiguous_inputs_equal_the_mlx_path(qk, view, monkeypatch):
    layer = _enc().layers[0]
    xn = np.random.default_rng(1).standard_normal((2, 40, 32)).astype(np.float32)
    X = mx.array(xn)
    x = {"stride2": lambda: X[:, ::2],
         "transposed": lambda: mx.array(xn.transpose(1, 0, 2)).transpose(1, 0, 2),
         "broadcast": lambda: mx.broadcast_to(X[:1], (3, 40, 32)),
         "reversed-features": lambda: X[..., ::-1],
         "offset-slice": lambda: X[:, 3:36]}[view]()
    assert np.abs(_fused(layer, x, None) - _mlx_layer(layer, x, None, monkeypatch)).max() < 2e-6


@pytest.mark.parametrize("bias_kind", ["shared-row", "sliced", "reversed", "float16", "-inf"])
def test_key_bias_layouts_equal_the_mlx_path(qk, bias_kind, monkeypatch):
    layer = _enc().layers[0]
    X = mx.array(np.random.default_rng(2).standard_normal((2, 40, 32)).astype(np.float32))
    m = np.ones((2, 40), np.int32)
    m[1, 10:] = 0
    bias = attention_bias(mx.array(m))
    x, b = {"shared-row": (X, bias[1:]), "sliced": (X[1:], bias[1:]),
            "reversed": (X, bias[::-1]), "float16": (X, bias.astype(mx.float16)),
            "-inf": (X, mx.where(bias < 0, -mx.inf, 0.0))}[bias_kind]
    assert np.abs(_fused(layer, x, b) - _mlx_layer(layer, x, b, monkeypatch)).max() < 2e-6


@pytest.mark.parametrize("D,H,F", [(24, 3, 40), (40, 5, 72), (20, 4, 36), (48, 6, 96),
                                   (64, 1, 128), (16, 16, 16)])
@pytest.mark.parametrize("B,L", [(1, 7), (1, 32), (1, 33), (2, 16), (2, 17)])
def test_widths_off_the_16_column_panels_equal_the_mlx_path(qk, D, H, F, B, L, monkeypatch):
    """Hidden / FFN widths that are not multiples of 16 (no panels: OpenBLAS at any row count),
    head splits that cut a panel (D=48, 6 heads of 8), one head, 16 heads of 1; on both sides
    of PANEL_ROWS = 32 rows, one and two parts."""
    layer = _enc(D, H, F).layers[0]
    x = mx.array(np.random.default_rng(D + L).standard_normal((B, L, D)).astype(np.float32))
    want = _mlx_layer(layer, x, None, monkeypatch)
    for threads in (1, 2):
        assert np.abs(_fused(layer, x, None, threads) - want).max() < 2e-6


def test_weights_replaced_after_the_first_call_are_seen(qk, monkeypatch):
    """update(), attribute assignment, load_weights and a deep copy, each after a call that
    built the cached panels (B*L <= PANEL_ROWS): the next call uses the new weights."""
    e = _enc()
    layer = e.layers[0]
    x = mx.array(np.random.default_rng(3).standard_normal((1, 8, 32)).astype(np.float32))
    before = _fused(layer, x, None)
    assert hasattr(layer, "_fused_panels")
    layer.update({"attention": {"query": {"weight": layer.attention.query.weight * 2}}})
    y = _fused(layer, x, None)
    assert np.abs(y - before).max() > 1e-3
    assert np.abs(y - _mlx_layer(layer, x, None, monkeypatch)).max() < 2e-6
    layer.intermediate.weight = layer.intermediate.weight * 0.5
    layer.attention_norm.weight = layer.attention_norm.weight * 3
    assert np.abs(_fused(layer, x, None) - _mlx_layer(layer, x, None, monkeypatch)).max() < 2e-6
    twin = copy.deepcopy(e).layers[0]
    twin.output.weight = twin.output.weight + 1
    assert np.abs(_fused(twin, x, None) - _mlx_layer(twin, x, None, monkeypatch)).max() < 1e-5
    assert np.abs(_fused(layer, x, None) - _mlx_layer(layer, x, None, monkeypatch)).max() < 2e-6
    other = _enc(seed=7)
    _fused(other.layers[0], x, None)  # warm its caches on its own weights
    other.load_weights(list(tree_flatten(e.parameters())))
    assert np.abs(_fused(other.layers[0], x, None)
                  - _mlx_layer(layer, x, None, monkeypatch)).max() < 2e-6


def test_two_python_threads_share_one_layer_and_the_helper_thread(qk, monkeypatch):
    """Three threads call one layer split over the kernel's single helper (threads=2): the
    helper's busy lock must make the losers run alone, never mix two layers' phases."""
    layer = _enc().layers[0]
    x = mx.array(np.random.default_rng(4).standard_normal((1, 40, 32)).astype(np.float32))
    want = _mlx_layer(layer, x, None, monkeypatch)
    errs = []

    def work():
        for _ in range(20):
            errs.append(float(np.abs(_fused(layer, x, None, threads=2) - want).max()))

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(errs) == 60 and max(errs) < 2e-6


def test_empty_batches_and_fully_padded_rows_stay_finite(qk, monkeypatch):
    layer = _enc().layers[0]
    assert _fused(layer, mx.zeros((0, 5, 32)), None).shape == (0, 5, 32)
    assert _fused(layer, mx.zeros((2, 0, 32)), None).shape == (2, 0, 32)
    x = mx.array(np.random.default_rng(5).standard_normal((3, 20, 32)).astype(np.float32))
    m = np.ones((3, 20), np.int32)
    m[1] = 0  # a row with no real key: uniform attention on both paths, no NaN
    b = attention_bias(mx.array(m))
    got, want = _fused(layer, x, b), _mlx_layer(layer, x, b, monkeypatch)
    assert np.isfinite(got).all() and np.abs(got - want).max() < 2e-6


@pytest.mark.parametrize("B,L,pad", [(1, 1, False), (1, 32, False), (1, 33, False),
                                     (1, 40, True), (5, 7, True), (2, 512, True)])
def test_output_selection_equals_the_full_model_at_edge_lengths(B, L, pad):
    """outsel on the CLS fixture at L = 1, the panel threshold, B = 1 padded (its last layer
    runs packed there while the reference's runs padded: equal to round-off, not bit for bit
    as the comment in outsel.hidden_at says), a 1-token row next to a 512-token one."""
    from variants.families.exact.outsel import OutputSelectNet
    from variants.checkpoints.load import load_checkpoint
    from variants.models.classifier import ClassifierNet

    ck = load_checkpoint(HF / "bert")
    net = ClassifierNet(ck.encoder, ck.classifier)
    rng = np.random.default_rng(B * L)
    ids = rng.integers(5, 2900, (B, L)).astype(np.int32)
    mask = np.ones_like(ids)
    if pad:
        mask[-1, 1:] = 0
        if B == 1:
            mask[0, L // 2:] = 0
    args = (mx.array(ids), mx.array(mask), mx.zeros_like(mx.array(ids)))
    full, sel = np.array(net(*args)), np.array(OutputSelectNet(net, "cls")(*args))
    assert np.abs(full - sel).max() < 1e-6 and np.abs(full).max() > 1e-3


@pytest.fixture(scope="module")
def modernbert():
    from variants.checkpoints.load import load_checkpoint

    return {n: load_checkpoint(HF / n).encoder for n in ("modernbert", "modernbert_g2")}


@pytest.mark.parametrize("name", ["modernbert", "modernbert_g2"])
@pytest.mark.parametrize("layout", ["left-padded-B1", "left-padded-B2", "hole-in-middle",
                                    "fully-padded-row", "one-token-next-to-512", "L1", "B0"])
def test_modernbert_fast_path_on_unusual_masks(modernbert, name, layout):
    """Masks the fast path's tests do not use (left padding, a hole, a row with no real token,
    1 next to 512 tokens across every window regime, L = 1, B = 0): equal to the plain path at
    real positions."""
    enc = modernbert[name]
    B, L = {"left-padded-B1": (1, 150), "left-padded-B2": (2, 150), "hole-in-middle": (2, 150),
            "fully-padded-row": (3, 150), "one-token-next-to-512": (2, 512), "L1": (2, 1),
            "B0": (0, 10)}[layout]
    rng = np.random.default_rng(L)
    ids = rng.integers(5, 2900, (B, L)).astype(np.int32)
    m = np.ones((B, L), np.int32)
    if layout == "left-padded-B1":
        m[0, :10] = 0
    elif layout == "left-padded-B2":
        m[1, :40] = 0
    elif layout == "hole-in-middle":
        m[1, 20:60] = 0
    elif layout == "fully-padded-row":
        m[1] = 0
    elif layout == "one-token-next-to-512":
        m[0, 1:] = 0
    enc.fast = False
    try:
        plain = np.array(enc(mx.array(ids), mx.array(m)).last_hidden)
    finally:
        enc.fast = True
    quick = np.array(enc(mx.array(ids), mx.array(m)).last_hidden)
    real = m.astype(bool)
    assert quick.shape == plain.shape == (B, L, 64)
    if real.any():
        assert np.abs(quick[real] - plain[real]).max() <= 1e-5
        assert np.isfinite(quick[real]).all()

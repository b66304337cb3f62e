"""Breaking the compiled ModernBERT layer (variants/arch/modernbert_fused.py) and what it runs in:
each test here failed before the fix its commit names."""

import re
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from variants.runtime import parallel
from variants.checkpoints.load import load_checkpoint

HF = Path(__file__).parents[1] / "fixtures" / "hf"


@pytest.fixture
def two_streams(monkeypatch):
    """The two-stream split on, built afresh (and rebuilt for later tests)."""
    monkeypatch.setenv("VARIANTS_STREAMS", "2")
    monkeypatch.setitem(parallel._state, "streams", None)
    yield
    monkeypatch.undo()
    parallel._state["streams"] = None


def _in_thread(fn):
    out = {}

    def run():
        try:
            out["y"] = fn()
        except Exception as e:  # noqa: BLE001 - reported to the test below
            out["error"] = f"{type(e).__name__}: {e}"
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


@pytest.mark.parametrize("which", ["modernbert", "bert"])
def test_batches_split_by_streams_run_from_another_thread(two_streams, enc, which):
    """MLX 0.32's streams belong to the thread that made them: a B >= 2 batch (split over the
    streams) from a second thread raised "There is no Stream(cpu, 1) in current thread" (and
    the MLX path's process then aborted at exit, SIGABRT). Now each thread splits over its own
    streams, with the main thread's results."""
    if which == "modernbert":
        model = load_checkpoint(HF / "modernbert").encoder
        vocab = model.args.vocab_size
    else:
        model, vocab = enc, 50
    rng = np.random.default_rng(1)
    ids = mx.array(rng.integers(5, vocab, (3, 40)).astype(np.int32))
    mask = np.ones((3, 40), np.int32)
    mask[1, 7:] = 0
    mask = mx.array(mask)
    assert len(parallel.streams()) == 2
    want = np.array(model(ids, mask).last_hidden)
    got = _in_thread(lambda: np.array(model(ids, mask).last_hidden))
    assert "error" not in got, got.get("error")
    real = np.array(mask).astype(bool)
    assert np.abs(got["y"][real] - want[real]).max() <= 1e-6
    assert np.abs(want[real]).std() > 0.1


def test_an_odd_head_dim_is_refused_when_the_config_is_read(tmp_path):
    """Rotary rotates pairs of dimensions (HF ModernBERT needs an even head_dim too): a
    config with num_attention_heads 64 on hidden_size 64 (head_dim 1) loaded, then every
    forward failed deep inside MLX ("[reshape] Cannot reshape array of size 6 into shape
    (3,2,0)", and `variants sweep` exited 2 with that line). Now reading it raises one
    ValueError naming the fields (load_checkpoint: a CheckpointError naming config.json; the
    sweep: that line, exit 2, no run folder)."""
    import json
    import shutil

    from variants.checkpoints.files import CheckpointError
    from variants.arch.modernbert_layers import ModernBertArgs

    folder = tmp_path / "odd"
    shutil.copytree(HF / "modernbert", folder)
    cfg = json.loads((folder / "config.json").read_text())
    with pytest.raises(ValueError, match=r"head_dim \(hidden_size / num_attention_heads = 1\)"):
        ModernBertArgs.from_dict({**cfg, "num_attention_heads": 64})
    (folder / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 64}))
    with pytest.raises(CheckpointError, match=r"config\.json: head_dim .* must be even"):
        load_checkpoint(folder)
    assert ModernBertArgs.from_dict({**cfg, "num_attention_heads": 32}).num_attention_heads == 32


def test_panels_are_dropped_when_a_layer_stops_being_plain(qk):
    """The 16-column panels (one more fp32 copy of every projection weight, ~20 MB a
    ModernBERT-base layer) stayed with each layer after its Linears were quantized in place
    (nn.quantize): the op no longer applies, but every layer's panels stayed alive (measured:
    4 layers of D=256, F=512: 22.8 MB active after quantizing, 1.8 MB with the fix). Now they
    go with the fast weights (modernbert_fast.layer_weights drops every derived copy)."""
    import mlx.nn as nn

    from variants.arch import modernbert

    assert hasattr(qk, "fused_mbert_layer")  # the kernel builds every source in SOURCES
    enc = load_checkpoint(HF / "modernbert").encoder
    ids, mask = mx.array([[5, 6, 7, 8, 9, 10]]), mx.ones((1, 6), mx.int32)
    mx.eval(enc(ids, mask).last_hidden)
    assert all(layer._mbert_panels.arrays is not None for layer in enc.layers)
    nn.quantize(enc, group_size=32, bits=4,
                class_predicate=lambda _, m: isinstance(m, nn.Linear))
    assert modernbert.compiled_paths(enc) is None
    y = np.array(enc(ids, mask).last_hidden)
    assert np.isfinite(y).all() and y.std() > 0.1
    assert all(layer._mbert_panels.arrays is None for layer in enc.layers)


@pytest.mark.parametrize("shape", [(2, 5), (2, 7), (3, 4), (4, 6), (2, 6, 1)])
@pytest.mark.parametrize("which", ["modernbert", "bert"])
def test_a_mask_of_another_shape_is_refused(enc, which, shape):
    """ids (2, 6) with a mask of another shape: the compiled op ran and returned (2, 6, D)
    reading the mask as if it fit (all ones: ignored; (3, 4): 12 key biases laid over 12
    rows), where ModernBERT's plain path failed in MLX's broadcasting; BERT ran on both
    paths. Now one ValueError naming both shapes, on every path."""
    model = load_checkpoint(HF / "modernbert").encoder if which == "modernbert" else enc
    ids = mx.array(np.random.default_rng(0).integers(5, 50, (2, 6)).astype(np.int32))
    for fast in (True, False) if which == "modernbert" else (True,):
        model.fast = fast  # ModernBERT: the compiled op / MLX fast path, then the plain path
        try:
            with pytest.raises(ValueError, match=r"attention_mask .*\(2, 6\).* got " +
                               re.escape(str(shape))):
                model(ids, mx.ones(shape, mx.int32))
        finally:
            model.fast = True
    assert model(ids, mx.ones((2, 6), mx.int32)).last_hidden.shape[:2] == (2, 6)


def _plain_and_fused(model, ids, mask):
    model.fast = False
    try:
        plain = np.array(model(ids, mask).last_hidden)
    finally:
        model.fast = True
    return plain, np.array(model(ids, mask).last_hidden)


@pytest.mark.parametrize("L", [64, 65, 66, 128, 129, 130, 192, 193])
def test_lengths_around_the_window_equal_the_plain_path(qk, L):
    """Held (no fix needed): the fixture's window is 128 (half 64): L - 1 = half is the last
    length with every key in the window, L = 2 half + 1 the first whose middle query alone
    sees every key, L <= 2 half + 64 takes 64-query blocks. B = 1 unpadded and B = 2 with one
    row cut to a third, real rows within 1e-5 of the plain path."""
    assert hasattr(qk, "fused_mbert_layer")  # the kernel builds every source in SOURCES
    model = load_checkpoint(HF / "modernbert").encoder
    rng = np.random.default_rng(L)
    for B in (1, 2):
        ids = mx.array(rng.integers(5, 2900, (B, L)).astype(np.int32))
        mask = np.ones((B, L), np.int32)
        mask[B - 1, L // 3 if B > 1 else L:] = 0
        plain, fused = _plain_and_fused(model, ids, mx.array(mask))
        real = mask.astype(bool)
        assert np.abs(fused[real] - plain[real]).max() <= 1e-5
        assert np.abs(plain[real]).std() > 0.1


def test_two_threads_share_the_helper_thread(qk, enc, monkeypatch):
    """Held: B = 1 calls forced into two parts (VARIANTS_FUSED_THREADS=2) of the ModernBERT op
    and the BERT op from two Python threads at once share the kernel's one helper thread (the
    one that finds it busy runs its parts in turn): every result equals the one-thread one
    to float32 round-off (measured up to 4.8e-7: one part and two sum in other orders)."""
    assert hasattr(qk, "fused_mbert_layer")  # the kernel builds every source in SOURCES
    monkeypatch.setenv("VARIANTS_FUSED_THREADS", "2")
    mb = load_checkpoint(HF / "modernbert").encoder
    rng = np.random.default_rng(4)
    jobs = [(mb, mx.array(rng.integers(5, 2900, (1, 40)).astype(np.int32))),
            (enc, mx.array(rng.integers(5, 50, (1, 40)).astype(np.int32)))]
    mask = mx.ones((1, 40), mx.int32)
    want = [np.array(m(ids, mask).last_hidden) for m, ids in jobs]
    diffs = []

    def run(k):
        for _ in range(15):
            m, ids = jobs[k]
            diffs.append(float(np.abs(np.array(m(ids, mask).last_hidden) - want[k]).max()))
    threads = [threading.Thread(target=run, args=(k % 2,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(diffs) == 60 and max(diffs) <= 1e-5  # one part or two: float32 round-off


def test_streams_of_a_thread_that_ended_are_not_reused(two_streams):
    """The first fix told threads apart by threading.get_ident(), which Python reuses once a
    thread has ended: with the streams first built by a short-lived thread, later threads that
    got its ident failed with "There is no Stream(cpu, 2) in current thread" (measured: 2 of
    5 later threads, 4 distinct idents of 6). Now each thread knows the streams it made."""
    model = load_checkpoint(HF / "modernbert").encoder
    ids = mx.array(np.random.default_rng(2).integers(5, 2900, (3, 40)).astype(np.int32))
    mask = np.ones((3, 40), np.int32)
    mask[2, 9:] = 0
    mask = mx.array(mask)
    want = np.array(model(ids, mask).last_hidden)  # weights, caches: evaluated on this thread
    parallel._state["streams"] = None  # the streams: first built by the first thread below
    outs = [_in_thread(lambda: np.array(model(ids, mask).last_hidden)) for _ in range(6)]
    assert [o.get("error") for o in outs] == [None] * 6
    assert max(np.abs(o["y"] - want).max() for o in outs) <= 1e-6


@pytest.mark.parametrize("name", ["modernbert", "bert"])
def test_a_model_loaded_on_one_thread_runs_on_another(monkeypatch, name):
    """Load on the main thread, first forward on a worker thread (a server's pool): failed
    with "There is no Stream(cpu, 0) in current thread" for both architectures. The layer
    norm's cached column of 1/D (fast_ops._AVG) was made lazily by load_checkpoint's head
    check on the loading thread's stream and never evaluated there. Now it is made from NumPy
    (no graph, no stream)."""
    from variants.runtime import fast_ops

    monkeypatch.setattr(fast_ops, "_AVG", {})  # as in a fresh process
    model = load_checkpoint(HF / name).encoder
    ids = mx.array(np.random.default_rng(3).integers(5, 900, (1, 12)).astype(np.int32))
    mask = mx.array(np.ones((1, 12), np.int32))
    got = _in_thread(lambda: np.array(model(ids, mask).last_hidden))
    assert "error" not in got, got.get("error")
    want = np.array(model(ids, mask).last_hidden)
    assert np.abs(got["y"] - want).max() <= 1e-6 and want.std() > 0.1

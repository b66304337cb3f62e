"""The ModernBERT ONNX graph (:mod:`variants.onnx.graph_modernbert`) run by ONNX Runtime
against the MLX encoder on the parity fixtures (tests/fixtures/hf/modernbert: window 128,
global every 3rd layer, no biases, exact GELU; modernbert_g2: window 64, global every 2nd,
every bias on, tanh GELU): rows of 300 tokens (past 2x the window, where the MLX module takes
its windowed path) and 200 (its dense masked path) beside padded rows, every real position
within 1e-4; the window is live (the same graph with every layer global differs by far more)."""

from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

import mlx.core as mx  # noqa: E402

from variants.checkpoints.load import load_checkpoint  # noqa: E402
from variants.onnx.graph_modernbert import OPSET, encoder_graph  # noqa: E402

HF = Path(__file__).parents[1] / "fixtures" / "hf"
NAMES = ["modernbert", "modernbert_g2"]
TOL = 1e-4


def _session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _batch(vocab, length, seed):
    """(ids, mask) int64 (4, length): one full row, rows padded to length // 2, 7 tokens and
    length - 1."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, (4, length))
    mask = np.ones((4, length), np.int64)
    for row, n in ((1, length // 2), (2, 7), (3, length - 1)):
        mask[row, n:] = 0
    ids[mask == 0] = 0
    return ids, mask


def _mlx(encoder, ids, mask):
    return np.array(encoder(mx.array(ids.astype(np.int32)),
                            mx.array(mask.astype(np.int32))).last_hidden)


@pytest.fixture(scope="module")
def built():
    out = {}
    for name in NAMES:
        ck = load_checkpoint(HF / name)
        model = encoder_graph(ck.encoder)
        out[name] = (ck, model, _session(model))
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("length", [300, 200, 24])
def test_fp32_graph_matches_the_mlx_encoder(built, name, length):
    ck, _, sess = built[name]
    assert 2 * ck.args.local_attention <= 300 and 200 > ck.args.local_attention
    ids, mask = _batch(ck.args.vocab_size, length, seed=length)
    (y,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})
    ref = _mlx(ck.encoder, ids, mask)
    real = mask.astype(bool)
    assert y.shape == ref.shape == (4, length, ck.args.hidden_size) and y.dtype == np.float32
    assert np.abs(y[real] - ref[real]).max() <= TOL
    assert np.abs(ref[real]).std() > 0.3  # not trivially small
    assert np.isfinite(y).all()


@pytest.mark.parametrize("name", NAMES)
def test_the_local_window_is_live(built, name):
    """The same weights with every layer global give another answer on a 300-token row: the
    graph's window bias is what makes it match."""
    ck, _, sess = built[name]
    ids, mask = _batch(ck.args.vocab_size, 300, seed=3)
    (y,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})
    kinds = [layer.is_global for layer in ck.encoder.layers]
    try:
        for layer in ck.encoder.layers:
            layer.is_global = True
        (y_glob,) = _session(encoder_graph(ck.encoder)).run(
            None, {"input_ids": ids, "attention_mask": mask})
    finally:
        for layer, k in zip(ck.encoder.layers, kinds):
            layer.is_global = k
    real = mask.astype(bool)
    assert np.abs(y_glob[real] - y[real]).max() > 100 * TOL


def test_graph_interface(built):
    ck, model, _ = built["modernbert"]
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]
    ins = {i.name: i for i in model.graph.input}
    assert list(ins) == ["input_ids", "attention_mask"]
    for i in ins.values():
        assert i.type.tensor_type.elem_type == 7  # int64
        assert [d.dim_param for d in i.type.tensor_type.shape.dim] == ["batch", "sequence"]
    (out,) = model.graph.output
    assert out.name == "last_hidden_state" and out.type.tensor_type.elem_type == 1
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == \
        ["batch", "sequence", ck.args.hidden_size]
    with_types = encoder_graph(ck.encoder, token_type_ids=True)
    assert [i.name for i in with_types.graph.input] == ["input_ids", "attention_mask",
                                                        "token_type_ids"]
    ids, mask = _batch(ck.args.vocab_size, 24, seed=1)
    (a,) = _session(with_types).run(None, {"input_ids": ids, "attention_mask": mask,
                                           "token_type_ids": np.ones_like(ids)})
    (b,) = built["modernbert"][2].run(None, {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_array_equal(a, b)


def test_refuses_another_encoder_and_layer_type(built):
    import mlx.nn as nn

    ck, _, _ = built["modernbert"]
    with pytest.raises(ValueError, match="takes a ModernBertEncoder"):
        encoder_graph(nn.Linear(2, 2))
    layer = ck.encoder.layers[1].mlp
    orig = layer.Wo
    try:
        layer.Wo = nn.Sequential(nn.Linear(96, 8), nn.Linear(8, 64))
        with pytest.raises(ValueError, match=r"layers\.1\.mlp\.Wo is a Sequential"):
            encoder_graph(ck.encoder)
    finally:
        layer.Wo = orig

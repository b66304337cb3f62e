"""The BERT-family encoder graph (variants/onnx/graph_bert.py) run by ONNX Runtime against the
MLX encoder it was built from, on the bundled all-MiniLM-L6-v2 and real sentences of different
lengths (padding in the batch): the fp32 graph, quant variants (4-bit g64 fp16 scales through
MatMulNBits, 6-bit, 8-bit, mxfp4, a mixed map with quantized and row-width tables) within 1e-4
on real positions; W8A8 with and without SmoothQuant within the spread the simulated MLX
variant itself shows when its input moves by float32 round-off; RoBERTa's and XLM-R's
positions on the transformers parity fixtures."""

import dataclasses
from pathlib import Path

import pytest

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.onnxgraphs

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

from variants.arch.encoder import attention_bias  # noqa: E402
from variants.checkpoints.load import load_checkpoint  # noqa: E402
from variants.families.quant.build import QuantConfig, quantize_module  # noqa: E402
from variants.families.w8a8 import build as w8a8  # noqa: E402
from variants.families.w8a8.family import W8A8Config  # noqa: E402
from variants.models import sentiment  # noqa: E402
from variants.onnx import graph_bert  # noqa: E402
from variants.runtime.row_embedding import RowWidthEmbedding  # noqa: E402

HF = Path(__file__).parents[1] / "fixtures" / "hf"
TOL = 1e-4
TEXTS = ["A truly wonderful film.",
         "I hated every minute of this boring, overlong mess of a movie, and the acting was "
         "worse than the plot, which is saying something.",
         "ok",
         "The soup was cold but the staff were friendly and quick to fix it."]
#: a mixed map: 8-bit layer 0, 6-bit g32 fp16 values, mxfp4 FFN down projections, a 3-bit g128
#: bf16 query, 2-bit fp16 FFN up projections (MatMulNBits), quantized position (8-bit) and
#: token-type (mxfp8) tables, the word table 4-bit fp16 with its unseen rows 2-bit g32
MAP = (r"layers\.0\.=8,value=6:32:f16,output=mxfp4,layers\.5\.attention\.query=3:128:bf16,"
       r"intermediate=2:64:f16,position_embeddings=8,token_type_embeddings=mxfp8,"
       r"word_embeddings=4:64:f16,word_embeddings@unseen=2:32")


def _session(model_proto):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(model_proto.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _feeds(ids, mask, types):
    return {"input_ids": np.asarray(ids, np.int64), "attention_mask": np.asarray(mask, np.int64),
            "token_type_ids": np.asarray(types, np.int64)}


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)


@pytest.fixture(scope="module")
def batch(checkpoint):
    ids, mask, types = checkpoint.tokenizer.batch(checkpoint.tokenizer.encode(TEXTS)[0])
    assert (mask == 0).any() and mask.sum(1).min() <= 3  # padding, a very short row
    return ids, mask, types


def _onnx_vs_mlx(encoder, batch, **kw):
    """(ONNX last_hidden_state, MLX last_hidden) on the real positions of ``batch``, and the
    graph."""
    proto = graph_bert.encoder_graph(encoder, **kw)
    got = _session(proto).run(None, _feeds(*batch))[0]
    want = np.array(encoder(*(mx.array(a) for a in batch)).last_hidden)
    real = batch[1].astype(bool)
    assert got.shape == want.shape == batch[0].shape + (encoder.args.hidden_size,)
    return got[real], want[real], proto


def test_fp32_graph_matches_the_reference(model, batch):
    got, want, proto = _onnx_vs_mlx(model.module.encoder, batch)
    assert np.abs(got - want).max() <= TOL
    assert np.abs(want).std() > 0.1
    assert [i.name for i in proto.graph.input] == list(graph_bert.INPUTS)
    assert [o.name for o in proto.graph.output] == [graph_bert.OUTPUT]
    assert {n.op_type for n in proto.graph.node} >= {"Gelu", "LayerNormalization", "Softmax"}


@pytest.mark.parametrize("cfg, nbits", [
    (QuantConfig(4, 64, scale_dtype="float16"), True),
    (QuantConfig(6, 64), False),
    (QuantConfig(8, 64), False),
    (QuantConfig(4, 32, quant_mode="mxfp4"), False),
], ids=lambda v: getattr(v, "name", str(v)))
def test_quant_variants_match_mlx(model, batch, cfg, nbits):
    qmod, _ = quantize_module(model.module, cfg, "native", model=model)
    got, want, proto = _onnx_vs_mlx(qmod.encoder, batch)
    ops = [n.op_type for n in proto.graph.node]
    assert (ops.count("MatMulNBits") == 36) == nbits  # every encoder Linear, where exact
    assert np.abs(got - want).max() <= TOL
    ref = np.array(model.module.encoder(*(mx.array(a) for a in batch)).last_hidden)
    assert np.abs(want - ref[batch[1].astype(bool)]).max() > 0.03  # a real approximation


def test_mixed_map_with_quantized_tables_matches_mlx(model, batch, checkpoint):
    ids = batch[0]
    used = np.zeros(checkpoint.encoder.args.vocab_size, bool)
    used[np.unique(ids[:2])] = True  # rows 3 and 4 hold ids the "fit texts" never used
    assert not used[np.unique(ids[2:])].all()
    qmod, info = quantize_module(model.module, QuantConfig(4, 64, bits_map=MAP), "native",
                                 model=model, row_use=used)
    emb = qmod.encoder.embeddings
    assert isinstance(emb.word_embeddings, RowWidthEmbedding)
    assert isinstance(emb.position_embeddings, nn.QuantizedEmbedding)
    assert emb.token_type_embeddings.mode == "mxfp8"
    assert {tuple(f) for f in info["layer_formats"].values()} >= {
        (8, 64, "affine", "float32"), (6, 32, "affine", "float16"), (4, 32, "mxfp4", "float32"),
        (3, 128, "affine", "bfloat16"), (2, 64, "affine", "float16")}
    got, want, proto = _onnx_vs_mlx(qmod.encoder, batch)
    assert "MatMulNBits" in {n.op_type for n in proto.graph.node}
    assert np.abs(got - want).max() <= TOL
    assert proto.ByteSize() < 20e6  # the word table stays packed in the file (fp32: 47 MB)


def _roundoff_spread(encoder, batch, seeds=(0, 1)):
    """The largest change of the MLX encoder's last hidden state (real positions) when its
    embeddings move by one float32 round-off (relative 2^-23 Gaussian noise), over ``seeds``."""
    ids, mask, types = (mx.array(a) for a in batch)
    x0, bias = encoder.embed(ids, types), attention_bias(mask)
    real = batch[1].astype(bool)

    def run(x):
        for layer in encoder.layers:
            x, _ = layer(x, bias)
        return np.array(x)[real]

    base = run(x0)
    spread = 0.0
    for s in seeds:
        noise = mx.array(np.random.default_rng(s).standard_normal(x0.shape).astype(np.float32))
        spread = max(spread, float(np.abs(run(x0 * (1 + 2 ** -23 * noise)) - base).max()))
    return spread


@pytest.fixture(scope="module")
def fit():
    from variants.datasets import bundled as data

    return sentiment.make_taskset(data.sample(data.split_frame(data.load_vader(), "fit"), 24,
                                              seed=0))


@pytest.mark.parametrize("cfg", [W8A8Config(), W8A8Config(smooth=True, alpha=0.5)],
                         ids=lambda c: c.name)
def test_w8a8_matches_the_simulated_mlx_variant(model, batch, fit, cfg):
    variant, _ = w8a8.build(model, cfg, mode="simulated", fit=fit)
    enc = variant.module.encoder
    got, want, proto = _onnx_vs_mlx(enc, batch)
    assert [n.op_type for n in proto.graph.node].count("MatMulInteger") == 36
    diff = np.abs(got - want).max()
    # The per-row uint8 codes are exact functions of a Linear's input (test_onnx_linear_nodes:
    # equal codes for equal x), but any float32 round-off upstream (ORT's LayerNorm, GEMM
    # order) can move an x across a code boundary; that code step, mixed over the sequence by
    # attention, compounds through the layers. The MLX variant shows the same spread when only
    # its embeddings move by one round-off, so the graph must stay within (twice) that spread:
    # a wrong code, scale or zero point anywhere would move it by a W8A8 error's size (0.15-0.24).
    spread = _roundoff_spread(enc, batch)
    ref = np.array(model.module.encoder(*(mx.array(a) for a in batch)).last_hidden)
    w8a8_error = np.abs(want - ref[batch[1].astype(bool)]).max()
    print(f"{cfg.name}: ONNX vs simulated MLX max {diff:.4f}, round-off spread {spread:.4f}, "
          f"W8A8 error vs fp32 {w8a8_error:.4f}")
    assert 0.01 < spread < 0.5 * w8a8_error
    assert diff <= 2 * spread


@pytest.fixture(scope="module")
def roberta_family():
    return {n: load_checkpoint(HF / n) for n in ("roberta", "xlm_roberta")}


@pytest.mark.parametrize("name", ["roberta", "xlm_roberta"])
def test_roberta_positions_match_transformers(roberta_family, name):
    ck = roberta_family[name]
    ref = dict(np.load(HF / name / "reference.npz"))
    real = ref["attention_mask"].astype(bool)
    assert ck.encoder.args.roberta_positions and (~real).any()
    feeds = {k: ref[k].astype(np.int64) for k in graph_bert.INPUTS}
    got = _session(graph_bert.encoder_graph(ck.encoder)).run(None, feeds)[0][real]
    assert np.abs(got - ref["last_hidden"]).max() <= TOL  # transformers' own output
    # the fixture exercises the positions: BERT's 0..L-1 would be far off
    args = ck.encoder.args
    try:
        ck.encoder.args = dataclasses.replace(args, model_type="bert")
        wrong = _session(graph_bert.encoder_graph(ck.encoder)).run(None, feeds)[0][real]
    finally:
        ck.encoder.args = args
    assert np.abs(wrong - ref["last_hidden"]).max() > 1e-2


def test_save_writes_one_file_that_runs(tmp_path):
    ck = load_checkpoint(HF / "bert")
    ref = dict(np.load(HF / "bert" / "reference.npz"))
    path = graph_bert.save(graph_bert.encoder_graph(ck.encoder), tmp_path / "bert.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert.onnx"]  # no external data
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = s.run(None, {k: ref[k].astype(np.int64) for k in graph_bert.INPUTS})[0]
    real = ref["attention_mask"].astype(bool)
    assert np.abs(got[real] - ref["last_hidden"]).max() <= TOL


def test_other_encoders_are_refused():
    ck = load_checkpoint(HF / "distilbert")
    with pytest.raises(ValueError, match="encoder_graph builds BertEncoder .* not "
                                         "DistilBertEncoder"):
        graph_bert.encoder_graph(ck.encoder)

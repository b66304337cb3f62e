"""The ONNX graph of a BERT-family encoder (BERT, RoBERTa, XLM-R:
:class:`variants.arch.encoder.BertEncoder`), built from the MLX module's own arrays with the
``onnx`` package (issue #43, item 2): the reference and its quant / W8A8 / low-rank variants
(each Linear and table through :mod:`variants.onnx.linear_nodes` and
:mod:`variants.onnx.embedding_nodes`).

The graph computes what ``encoder(input_ids, attention_mask, token_type_ids).last_hidden``
computes in MLX (Devlin et al. 2019, post-norm layers):

- inputs ``input_ids``, ``attention_mask``, ``token_type_ids``: int64 (batch, sequence), both
  axes dynamic;
- embeddings: word + position + token type rows, then ``LayerNormalization``; position ids
  ``0..L-1`` (BERT) or, for RoBERTa / XLM-R, ``cumsum(real) · real + pad_token_id`` with
  ``real = input_ids != pad_token_id`` (Hugging Face ``create_position_ids_from_input_ids``);
- attention: ``softmax(q kᵀ / √d + bias) v`` per head, ``bias`` = ``(1 - mask) · -1e9``
  (:data:`variants.arch.encoder.MASK_BIAS`) over the keys, as
  :func:`variants.arch.encoder.attention_bias`; for a plain ``nn.Linear`` query the 1/√d is
  folded into its weight and bias (as MLX's fused path does), else applied to its output;
- the FFN's activation: ``Gelu`` for ``gelu`` (MiniLM's: :func:`variants.runtime.fast_ops.gelu`,
  the exact-erf GELU to 1.1e-6) and ``gelu_exact``, ``Gelu(approximate="tanh")`` for
  ``gelu_new`` / ``gelu_pytorch_tanh``, ``Relu`` for ``relu``;
- output ``last_hidden_state`` float32 (batch, sequence, hidden); no pooling (the model's
  readout stays outside the graph). Padded positions hold what the layers computed there: only
  real positions carry meaning, as in MLX.
"""

import mlx.nn as nn
import numpy as np

from variants.onnx.builder import FLOAT, INT64, Graph
from variants.onnx.embedding_nodes import embedding
from variants.onnx.linear_nodes import linear

#: the graph's inputs (int64, (batch, sequence)) and output
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "last_hidden_state"
#: the activation names of variants.arch.encoder.ACTIVATIONS -> (ONNX op, attributes)
ACTIVATION_OPS = {"gelu": ("Gelu", {}), "gelu_exact": ("Gelu", {}),
                  "gelu_new": ("Gelu", {"approximate": "tanh"}),
                  "gelu_pytorch_tanh": ("Gelu", {"approximate": "tanh"}), "relu": ("Relu", {})}
#: ONNX protobuf files cannot exceed 2 GiB without external data (not written here)
MAX_BYTES = 2 ** 31 - 1


def _check(encoder):
    from variants.arch.encoder import Attention, BertEncoder, TransformerLayer

    if type(encoder) is not BertEncoder:
        raise ValueError(f"encoder_graph builds BertEncoder (BERT, RoBERTa, XLM-R), not "
                         f"{type(encoder).__name__}; ModernBERT has its own graph builder")
    for i, layer in enumerate(encoder.layers):
        if type(layer) is not TransformerLayer or type(layer.attention) is not Attention:
            raise ValueError(f"encoder.layers.{i} is a {type(layer).__name__}, not the BERT "
                             "TransformerLayer the graph builds; export the variant's "
                             "reference-shaped form or another family")
        if layer.hidden_act not in ACTIVATION_OPS:
            raise ValueError(f"encoder.layers.{i}: activation {layer.hidden_act!r} has no "
                             f"ONNX form here; the activations are {sorted(ACTIVATION_OPS)}")


def _layer_norm(g, x, norm, name):
    w, b = (np.array(norm[k], np.float32) if k in norm else None for k in ("weight", "bias"))
    if w is None or b is None:
        raise ValueError(f"{name}: a LayerNorm without weight or bias; the BERT graph needs "
                         "both (nn.LayerNorm's default affine=True)")
    return g.op("LayerNormalization", [x, g.const(w, f"{name}.weight"),
                                       g.const(b, f"{name}.bias")], f"{name}/out",
                axis=-1, epsilon=float(norm.eps))


def _positions(g, ids, args):
    if args.roberta_positions:
        pad = g.scalar(args.pad_token_id, np.int64)
        real = g.op("Cast", [g.op("Not", [g.op("Equal", [ids, pad], "positions/is_pad")],
                                  "positions/is_real")], "positions/real", to=INT64)
        count = g.op("CumSum", [real, g.scalar(1, np.int64)], "positions/count")
        return g.op("Add", [g.op("Mul", [count, real], "positions/real_count"), pad],
                    "position_ids")
    length = g.op("Gather", [g.op("Shape", [ids], "positions/shape"), g.scalar(1, np.int64)],
                  "positions/length")
    pos = g.op("Range", [g.scalar(0, np.int64), length, g.scalar(1, np.int64)],
               "positions/range")
    return g.op("Unsqueeze", [pos, g.ints([0])], "position_ids")  # (1, L)


def _embeddings(g, encoder, ids, types):
    emb, pre = encoder.embeddings, "encoder.embeddings"
    x = g.op("Add", [embedding(g, ids, emb.word_embeddings, f"{pre}.word_embeddings"),
                     embedding(g, _positions(g, ids, encoder.args), emb.position_embeddings,
                               f"{pre}.position_embeddings")], f"{pre}/word_pos")
    x = g.op("Add", [x, embedding(g, types, emb.token_type_embeddings,
                                  f"{pre}.token_type_embeddings")], f"{pre}/sum")
    return _layer_norm(g, x, emb.norm, f"{pre}.norm")


def _key_bias(g, mask):
    m = g.op("Cast", [mask], "mask/f32", to=FLOAT)
    from variants.arch.encoder import MASK_BIAS

    bias = g.op("Mul", [g.op("Sub", [g.scalar(1.0), m], "mask/padding"),
                        g.scalar(MASK_BIAS)], "mask/bias")
    return g.op("Unsqueeze", [bias, g.ints([1, 2])], "attention_bias")  # (B, 1, 1, L)


def _scaled_query(attn):
    """The query Linear with 1/√d folded in (a plain biased nn.Linear, as MLX's fused path
    folds it), or None for another kind."""
    q = attn.query
    if type(q) is not nn.Linear or "bias" not in q:
        return None
    folded = nn.Linear(q.weight.shape[1], q.weight.shape[0])
    folded.weight, folded.bias = q.weight * attn.scale, q.bias * attn.scale
    return folded


def _attention(g, x, bias, attn, name, int8):
    d = attn.head_dim
    folded = _scaled_query(attn)
    if folded is not None:
        q = linear(g, x, folded, f"{name}.query", int8=int8)
    else:
        q = g.op("Mul", [linear(g, x, attn.query, f"{name}.query", int8=int8),
                         g.scalar(attn.scale)], f"{name}.query/scaled")
    k = linear(g, x, attn.key, f"{name}.key", int8=int8)
    v = linear(g, x, attn.value, f"{name}.value", int8=int8)
    split = g.ints([0, 0, -1, d])  # (B, L, heads, d): heads from the projection's width
    qh = g.op("Transpose", [g.op("Reshape", [q, split], f"{name}/q4")], f"{name}/qh",
              perm=[0, 2, 1, 3])
    kt = g.op("Transpose", [g.op("Reshape", [k, split], f"{name}/k4")], f"{name}/kt",
              perm=[0, 2, 3, 1])
    vh = g.op("Transpose", [g.op("Reshape", [v, split], f"{name}/v4")], f"{name}/vh",
              perm=[0, 2, 1, 3])
    scores = g.op("Add", [g.op("MatMul", [qh, kt], f"{name}/scores0"), bias], f"{name}/scores")
    probs = g.op("Softmax", [scores], f"{name}/probs", axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, vh], f"{name}/ctx_h")], f"{name}/ctx_t",
               perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.ints([0, 0, -1])], f"{name}/ctx")
    return linear(g, ctx, attn.out, f"{name}.out", int8=int8)


def _layer(g, x, bias, layer, name, int8):
    a = _attention(g, x, bias, layer.attention, f"{name}.attention", int8)
    x = _layer_norm(g, g.op("Add", [x, a], f"{name}/attn_res"), layer.attention_norm,
                    f"{name}.attention_norm")
    h = linear(g, x, layer.intermediate, f"{name}.intermediate", int8=int8)
    op, attrs = ACTIVATION_OPS[layer.hidden_act]
    h = g.op(op, [h], f"{name}/act", **attrs)
    y = linear(g, h, layer.output, f"{name}.output", int8=int8)
    return _layer_norm(g, g.op("Add", [x, y], f"{name}/ffn_res"), layer.output_norm,
                       f"{name}.output_norm")


def encoder_graph(encoder, *, int8="u8u8", name="bert-encoder"):
    """The ``onnx.ModelProto`` of ``encoder`` (module docstring).

    Parameters
    ----------
    encoder : variants.arch.encoder.BertEncoder
        The reference or a variant's encoder (its Linears and tables of any kind
        :func:`variants.onnx.linear_nodes.linear` / :func:`variants.onnx.embedding_nodes.embedding`
        handle); read, not changed.
    int8 : {"u8u8", "u8s8"}
        How W8A8 layers store their weight (:mod:`variants.onnx.linear_nodes`).
    name : str
        The graph's name.

    Returns
    -------
    onnx.ModelProto
        Opset 21 (plus ``com.microsoft`` when a MatMulNBits layer is in it), IR version 10;
        inputs :data:`INPUTS` int64 (batch, sequence), output :data:`OUTPUT` float32 (batch,
        sequence, hidden).

    Raises
    ------
    ValueError
        Not a :class:`~variants.arch.encoder.BertEncoder` (ELECTRA, ALBERT, DistilBERT,
        ModernBERT ... are other classes), a layer or module kind with no ONNX form here,
        an unknown ``int8`` scheme; each names the module and the fix.
    """
    _check(encoder)
    g = Graph(name)
    axes = ["batch", "sequence"]
    ids, mask, types = (g.input(n, INT64, axes) for n in INPUTS)
    x = _embeddings(g, encoder, ids, types)
    bias = _key_bias(g, mask)
    for i, layer in enumerate(encoder.layers):
        x = _layer(g, x, bias, layer, f"encoder.layers.{i}", int8)
    g.output(x, OUTPUT, FLOAT, axes + [int(encoder.args.hidden_size)])
    a = encoder.args
    return g.model(doc="BERT-family encoder exported by mlx-variants (issue #43)", metadata={
        "mlx_variants.graph": "bert-encoder", "model_type": a.model_type,
        "hidden_act": a.hidden_act, "pad_token_id": a.pad_token_id})


def save(model, path):
    """Write ``model`` (an ``onnx.ModelProto``) to ``path`` as one .onnx file (no external
    data); returns the path. Raises ValueError when the model is over 2 GiB, the most one
    protobuf file holds."""
    import onnx

    size = model.ByteSize()
    if size > MAX_BYTES:
        raise ValueError(f"the ONNX model is {size / 2 ** 30:.2f} GiB, over the 2 GiB one .onnx "
                         "file holds; export a quantized variant or save with external data")
    onnx.save_model(model, str(path))
    return path

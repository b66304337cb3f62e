"""The ONNX graph of a ModernBERT encoder (Warner et al. 2024; the MLX module
:class:`variants.arch.modernbert.ModernBertEncoder`), built from its weights with the ``onnx``
package (no PyTorch), standard ONNX operators only (opset 21).

What the graph computes, op for op as the MLX module (:mod:`variants.arch.modernbert_layers`):
token embeddings (``Gather``) -> ``LayerNormalization``; per layer, pre-norm (layer 0's
``attn_norm`` is the identity) attention with a fused ``Wqkv``, rotary q and k at
``global_rope_theta`` on the global layers and ``local_rope_theta`` on the local ones (angles
computed in the graph from positions 0..L-1, so any L runs), scores masked by the padding bias
(global) or the padding bias plus the sliding window |q - k| > ``local_attention // 2``
(local, dense: all L x L scores, masked as the MLX module's ``masked`` path; the MLX windowed
path equals it to float32 round-off), GeGLU MLP (``Gelu`` exact or tanh, or ``Relu``), then
``final_norm``. Biases appear only where the checkpoint has them.

Inputs ``input_ids`` and ``attention_mask``, int64 (batch, sequence), both axes dynamic; the
padding must be at the end of each row (positions 0..L-1 per row, as the MLX forward without
``positions``). ModernBERT has no token types: the graph takes no ``token_type_ids`` unless
asked (``token_type_ids=True`` adds one, accepted and unused, for a runner that feeds every
graph the BERT inputs); Hugging Face / Optimum ModernBERT exports take the same two inputs.
Output ``last_hidden_state`` float32 (batch, sequence, hidden_size): the MLX forward's
``last_hidden`` on the real positions (padded positions hold finite values of no meaning).

Each Linear goes through :func:`linear_node`: an ``nn.Linear`` becomes ``MatMul`` (+ ``Add``).
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.arch.encoder import MASK_BIAS
from variants.arch.modernbert import ModernBertEncoder
from variants.arch.modernbert_layers import inv_freq

__all__ = ["OPSET", "encoder_graph"]

#: ONNX opset of the graph (``Gelu`` needs 20; ``LayerNormalization`` 17).
OPSET = 21
#: the activation names of :data:`variants.arch.encoder.ACTIVATIONS` -> (op, attributes)
_ACTIVATIONS = {"gelu": ("Gelu", {"approximate": "none"}),
                "gelu_exact": ("Gelu", {"approximate": "none"}),
                "gelu_new": ("Gelu", {"approximate": "tanh"}),
                "gelu_pytorch_tanh": ("Gelu", {"approximate": "tanh"}),
                "relu": ("Relu", {})}


class _Graph:
    """A minimal graph builder: ``node`` appends one node and returns its output name(s);
    ``const`` adds an initializer."""

    def __init__(self):
        self.nodes, self.inits, self._n = [], [], 0

    def fresh(self, hint):
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, array, hint="c"):
        import onnx.numpy_helper as nh

        name = self.fresh(hint)
        self.inits.append(nh.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op, inputs, hint=None, outputs=1, **attrs):
        from onnx import helper

        outs = [self.fresh(hint or op.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, **attrs))
        return outs[0] if outputs == 1 else outs


def _weight(module, name):
    w = getattr(module, name, None) if name in module else None
    return None if w is None else np.array(w.astype(mx.float32))


def linear_node(g, x, module, path):
    """``module`` (an ``nn.Linear``, path ``path``) applied to ``x`` (..., in) -> (..., out).
    Raises ValueError for another Linear type."""
    if type(module) is not nn.Linear:
        raise ValueError(f"{path} is a {type(module).__name__}: the ModernBERT ONNX graph takes "
                         "nn.Linear layers; export the fp32 reference")
    y = g.node("MatMul", [x, g.const(_weight(module, "weight").T, path + ".weight")], path)
    b = _weight(module, "bias")
    return y if b is None else g.node("Add", [y, g.const(b, path + ".bias")], path)


def _layer_norm(g, x, norm, path):
    if isinstance(norm, nn.Identity):
        return x
    d = norm.dims if hasattr(norm, "dims") else None
    w = _weight(norm, "weight")
    b = _weight(norm, "bias")
    if w is None:
        w = np.ones(d, np.float32)
    ins = [x, g.const(w, path + ".weight")] + ([g.const(b, path + ".bias")] if b is not None else [])
    return g.node("LayerNormalization", ins, path, axis=-1, epsilon=float(norm.eps))


def _embedding_table(emb, path):
    if type(emb) is nn.Embedding:
        return np.array(emb.weight.astype(mx.float32))
    if isinstance(emb, nn.QuantizedEmbedding):  # the table MLX gathers rows from, dequantized
        ids = mx.arange(emb.num_embeddings)
        return np.array(emb(ids).astype(mx.float32))
    raise ValueError(f"{path} is a {type(emb).__name__}: the ModernBERT ONNX graph takes "
                     "nn.Embedding or nn.QuantizedEmbedding")


def _rope(g, length, theta, head_dim, hint):
    """(cos, sin), each (L, head_dim) float32: rotary tables of positions 0..L-1 at ``theta``
    (angles in float32 as :func:`variants.arch.modernbert_layers.rope_tables`)."""
    freq = np.array(inv_freq(theta, head_dim))
    inv2 = np.concatenate([freq, freq])[None, :].astype(np.float32)  # (1, head_dim)
    pos = g.node("Cast", [g.node("Range", [g.const(np.array(0, np.int64)), length,
                                           g.const(np.array(1, np.int64))])], to=1)
    ang = g.node("Mul", [g.node("Unsqueeze", [pos, g.const(np.array([1], np.int64))]),
                         g.const(inv2, hint + ".inv_freq")])  # (L, head_dim)
    return g.node("Cos", [ang], hint), g.node("Sin", [ang], hint)


def _rotate_half(head_dim):
    """(head_dim, head_dim) float32 R with x @ R = rotate_half(x) = concat(-x2, x1): one ±1 a
    column, so the product is exact (a MatMul by R runs faster in ONNX Runtime than a
    ``Gather`` or ``Split`` + ``Concat`` on the last axis)."""
    h = head_dim // 2
    r = np.zeros((head_dim, head_dim), np.float32)
    r[np.arange(h, head_dim), np.arange(h)] = -1.0
    r[np.arange(h), np.arange(h, head_dim)] = 1.0
    return r


def _attention(g, x, attn, bias, rope, consts, path):
    """Pre-normed ``x`` (B, L, D) -> attention output (B, L, D): q and k rotated together,
    scores = q kᵀ · scale + bias, softmax over keys, ``Wo``."""
    qkv = linear_node(g, x, attn.Wqkv, path + ".Wqkv")
    qkv = g.node("Reshape", [qkv, consts["qkv_shape"]])  # (B, L, 3, H, hd)
    qkv = g.node("Transpose", [qkv], path + ".qkv", perm=[2, 0, 3, 1, 4])  # (3, B, H, L, hd)
    qk, v = g.node("Split", [qkv, consts["split_qk_v"]], outputs=2, axis=0)
    cos, sin = rope
    rot = g.node("MatMul", [qk, consts["rotate_half"]])
    qk = g.node("Add", [g.node("Mul", [qk, cos]), g.node("Mul", [rot, sin])], path + ".rope")
    q, k = g.node("Split", [qk], outputs=2, axis=0, num_outputs=2)
    q, k, v = (g.node("Squeeze", [t, consts["axis0"]]) for t in (q, k, v))  # (B, H, L, hd)
    kt = g.node("Transpose", [k], perm=[0, 1, 3, 2])
    scores = g.node("Mul", [g.node("MatMul", [q, kt]), g.const(np.array(attn.scale, np.float32))],
                    path + ".scores")
    probs = g.node("Softmax", [g.node("Add", [scores, bias])], path + ".probs", axis=-1)
    out = g.node("Transpose", [g.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])  # (B, L, H, hd)
    out = g.node("Reshape", [out, consts["bld_shape"]])
    return linear_node(g, out, attn.Wo, path + ".Wo")


def _mlp(g, x, mlp, path):
    h = linear_node(g, x, mlp.Wi, path + ".Wi")
    inp, gate = g.node("Split", [h], path + ".Wi_split", outputs=2, axis=-1, num_outputs=2)
    op, attrs = _ACTIVATIONS[mlp.hidden_activation]
    act = g.node(op, [inp], path + ".act", **attrs)
    return linear_node(g, g.node("Mul", [act, gate]), mlp.Wo, path + ".Wo")


def _masks(g, mask, length, half):
    """(global (B, 1, 1, L), local (B, 1, L, L)) additive biases, MASK_BIAS where masked."""
    m = g.node("Cast", [mask], to=1)
    key = g.node("Mul", [g.node("Sub", [g.const(np.array(1.0, np.float32)), m]),
                         g.const(np.array(MASK_BIAS, np.float32))])
    glob = g.node("Unsqueeze", [key, g.const(np.array([1, 2], np.int64))], "global_bias")
    pos = g.node("Range", [g.const(np.array(0, np.int64)), length,
                           g.const(np.array(1, np.int64))])
    rows = g.node("Unsqueeze", [pos, g.const(np.array([1], np.int64))])
    dist = g.node("Abs", [g.node("Sub", [rows, pos])])  # (L, L)
    far = g.node("Greater", [dist, g.const(np.array(half, np.int64))])
    local = g.node("Where", [far, g.const(np.array(MASK_BIAS, np.float32)), glob], "local_bias")
    return glob, local


def encoder_graph(encoder, token_type_ids=False):
    """The ONNX model of ``encoder`` (a :class:`variants.arch.modernbert.ModernBertEncoder`).

    Parameters
    ----------
    encoder : ModernBertEncoder
        Its weights are copied into the graph (float32 initializers).
    token_type_ids : bool, default False
        Add an int64 (batch, sequence) ``token_type_ids`` input the graph ignores.

    Returns
    -------
    onnx.ModelProto
        Opset :data:`OPSET`; inputs ``input_ids``, ``attention_mask`` (int64, (batch,
        sequence)); output ``last_hidden_state`` float32 (batch, sequence, hidden_size).

    Raises
    ------
    ValueError
        ``encoder`` is not a ModernBERT encoder, or holds a layer type the graph does not take
        (one line naming the layer).
    """
    from onnx import TensorProto, checker, helper

    if not isinstance(encoder, ModernBertEncoder):
        raise ValueError(f"encoder_graph takes a ModernBertEncoder, not a "
                         f"{type(encoder).__name__}; pass the checkpoint's encoder")
    args = encoder.args
    D, heads = args.hidden_size, args.num_attention_heads
    hd = D // heads
    g = _Graph()
    shape = g.node("Shape", ["input_ids"])
    zero = g.const(np.array([0], np.int64))
    length = g.node("Squeeze", [g.node("Gather", [shape, g.const(np.array([1], np.int64))]),
                                zero], "length")
    consts = {"qkv_shape": g.const(np.array([0, 0, 3, heads, hd], np.int64), "qkv_shape"),
              "bld_shape": g.const(np.array([0, 0, D], np.int64), "bld_shape"),
              "split_qk_v": g.const(np.array([2, 1], np.int64), "split_qk_v"),
              "axis0": zero, "rotate_half": g.const(_rotate_half(hd), "rotate_half")}
    table = _embedding_table(encoder.embeddings.tok_embeddings, "embeddings.tok_embeddings")
    x = g.node("Gather", [g.const(table, "embeddings.tok_embeddings.weight"), "input_ids"],
               "embeddings", axis=0)
    x = _layer_norm(g, x, encoder.embeddings.norm, "embeddings.norm")
    glob, local = _masks(g, "attention_mask", length, args.local_attention // 2)
    ropes = {True: _rope(g, length, args.global_rope_theta, hd, "rope_global"),
             False: _rope(g, length, args.local_rope_theta, hd, "rope_local")}
    for i, layer in enumerate(encoder.layers):
        p = f"layers.{i}"
        h = _layer_norm(g, x, layer.attn_norm, p + ".attn_norm")
        a = _attention(g, h, layer.attn, glob if layer.is_global else local,
                       ropes[bool(layer.is_global)], consts, p + ".attn")
        x = g.node("Add", [x, a], p + ".attn_out")
        h = _layer_norm(g, x, layer.mlp_norm, p + ".mlp_norm")
        x = g.node("Add", [x, _mlp(g, h, layer.mlp, p + ".mlp")], p + ".out")
    y = _layer_norm(g, x, encoder.final_norm, "final_norm")
    g.nodes.append(helper.make_node("Identity", [y], ["last_hidden_state"]))
    dims = ["batch", "sequence"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims)
              for n in ("input_ids", "attention_mask")
              + (("token_type_ids",) if token_type_ids else ())]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, dims + [D])
    graph = helper.make_graph(g.nodes, "modernbert_encoder", inputs, [out], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="mlx-variants")
    model.ir_version = 10
    checker.check_model(model)
    return model

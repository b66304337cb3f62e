"""The ONNX graph of a ModernBERT encoder (Warner et al. 2024; the MLX module
:class:`variants.arch.modernbert.ModernBertEncoder`), built from its weights with the ``onnx``
package (no PyTorch): standard ONNX operators (opset 21), plus ONNX Runtime's
``com.microsoft.MatMulNBits`` for 2- and 4-bit quantized Linears.

What the graph computes, op for op as the MLX module (:mod:`variants.arch.modernbert_layers`):
token embeddings (``Gather``) -> ``LayerNormalization``; per layer, pre-norm (layer 0's
``attn_norm`` is the identity) attention with a fused ``Wqkv``, rotary q and k at
``global_rope_theta`` on the global layers and ``local_rope_theta`` on the local ones (angles
computed in the graph from positions 0..L-1, so any L runs), scores masked by the padding bias
(global) or the padding bias plus the sliding window |q - k| > ``local_attention // 2``
(local), GeGLU MLP (``Gelu`` exact or tanh, or ``Relu``), then ``final_norm``. Biases appear
only where the checkpoint has them.

The local layers, as the MLX module's ``local_attention_impl``
(:mod:`variants.arch.modernbert_window`): ``masked`` scores all L x L pairs and masks the
window; ``banded`` scores only each query's window, block by block
(:mod:`variants.onnx.window_nodes`: L · (block + 2·half) scores, linear in L); ``auto``
(default) holds both behind one ``If`` per local layer and takes the banded path from L >=
:data:`CROSSOVER` · local_attention on, as MLX does. The three agree to float32 round-off.
Measured (ONNX Runtime 1.32, 2 threads, the 6-layer parity fixture, window 128; a shared,
loaded machine, so ratios only), masked / banded time at B=1: 0.63 at L=128, ~1.0 at 256,
1.2-1.3 at 384-512, 1.6 at 1024; at B=32: 0.81 at 128, 1.1 at 256 and 384. ``auto`` costs
what ``masked`` costs below the crossover (one length test a layer).

Inputs ``input_ids`` and ``attention_mask``, int64 (batch, sequence), both axes dynamic; the
padding must be at the end of each row (positions 0..L-1 per row, as the MLX forward without
``positions``). ModernBERT has no token types: the graph takes no ``token_type_ids`` unless
asked (``token_type_ids=True`` adds one, accepted and unused, for a runner that feeds every
graph the BERT inputs); Hugging Face / Optimum ModernBERT exports take the same two inputs.
Output ``last_hidden_state`` float32 (batch, sequence, hidden_size): the MLX forward's
``last_hidden`` on the real positions (padded positions hold finite values of no meaning).

Every Linear goes through :func:`variants.onnx.linear_nodes.linear` and the token table through
:func:`variants.onnx.embedding_nodes.embedding`, so the reference and its quant (``MatMulNBits``
or in-graph dequantization), W8A8 (``MatMulInteger``), low-rank and AWQ variants export alike;
a module kind they do not take raises ValueError naming its path.
"""

import numpy as np

from variants.arch.encoder import MASK_BIAS
from variants.arch.modernbert import ModernBertEncoder
from variants.arch.modernbert_layers import inv_freq
from variants.onnx.builder import FLOAT, INT64, OPSET, Graph
from variants.onnx.embedding_nodes import embedding
from variants.onnx.linear_nodes import linear
from variants.onnx.window_nodes import banded_attention, if_node, scalar0, window_plan

__all__ = ["INPUTS", "OPSET", "OUTPUT", "encoder_graph"]

#: the graph's inputs (int64, (batch, sequence)); ``token_type_ids`` only when asked
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "last_hidden_state"
#: ``local="auto"``: the local layers score only each query's window (banded) from L >=
#: CROSSOVER · local_attention tokens on, all L x L scores masked below (measured: see the
#: module docstring)
CROSSOVER = 2
#: the local layers' attention paths (``encoder_graph(local=...)``)
LOCAL_MODES = ("auto", "banded", "masked")
#: the activation names of :data:`variants.arch.encoder.ACTIVATIONS` -> (op, attributes)
ACTIVATION_OPS = {"gelu": ("Gelu", {}), "gelu_exact": ("Gelu", {}),
                  "gelu_new": ("Gelu", {"approximate": "tanh"}),
                  "gelu_pytorch_tanh": ("Gelu", {"approximate": "tanh"}), "relu": ("Relu", {})}


def _f32(a):
    """An MLX array (any float dtype) as a float32 NumPy array."""
    import mlx.core as mx

    return np.array(a.astype(mx.float32))


def _layer_norm(g, x, norm, name):
    """``LayerNormalization`` over the last axis with ``norm``'s weight and, where it has one,
    bias (``norm_bias: false`` checkpoints have none); ``nn.Identity`` (layer 0's
    ``attn_norm``) passes ``x`` through."""
    import mlx.nn as nn

    if isinstance(norm, nn.Identity):
        return x
    if "weight" not in norm:
        raise ValueError(f"{name}: a LayerNorm without weight; the ModernBERT graph needs "
                         "nn.LayerNorm's default affine=True")
    ins = [x, g.const(_f32(norm["weight"]), f"{name}.weight")]
    if "bias" in norm:
        ins.append(g.const(_f32(norm["bias"]), f"{name}.bias"))
    return g.op("LayerNormalization", ins, f"{name}/out", axis=-1, epsilon=float(norm.eps))


def _rope(g, length, theta, head_dim, hint):
    """(cos, sin), each (L, head_dim) float32: rotary tables of positions 0..L-1 at ``theta``
    (angles in float32 as :func:`variants.arch.modernbert_layers.rope_tables`)."""
    freq = np.array(inv_freq(theta, head_dim))
    inv2 = np.concatenate([freq, freq])[None, :].astype(np.float32)  # (1, head_dim)
    pos = g.op("Cast", [g.op("Range", [scalar0(g, 0), length, scalar0(g, 1)],
                             f"{hint}/positions")], f"{hint}/positions_f32", to=FLOAT)
    ang = g.op("Mul", [g.op("Unsqueeze", [pos, g.ints([1])], f"{hint}/column"),
                       g.const(inv2, f"{hint}.inv_freq")], f"{hint}/angles")  # (L, head_dim)
    return g.op("Cos", [ang], f"{hint}/cos"), g.op("Sin", [ang], f"{hint}/sin")


def _rotate_half(head_dim):
    """(head_dim, head_dim) float32 R with x @ R = rotate_half(x) = concat(-x2, x1): one ±1 a
    column, so the product is exact (a MatMul by R runs faster in ONNX Runtime than a
    ``Gather`` or ``Split`` + ``Concat`` on the last axis)."""
    h = head_dim // 2
    r = np.zeros((head_dim, head_dim), np.float32)
    r[np.arange(h, head_dim), np.arange(h)] = -1.0
    r[np.arange(h), np.arange(h, head_dim)] = 1.0
    return r


def _dense_core(g, q, k, v, scale, bias, name):
    """softmax(q kᵀ · scale + bias) v on (B, H, L, d) tensors, all L x L scores."""
    kt = g.op("Transpose", [k], f"{name}/kt", perm=[0, 1, 3, 2])
    scores = g.op("Mul", [g.op("MatMul", [q, kt], f"{name}/qk"), g.scalar(scale)],
                  f"{name}/scores0")
    probs = g.op("Softmax", [g.op("Add", [scores, bias], f"{name}/scores")], f"{name}/probs",
                 axis=-1)
    return g.op("MatMul", [probs, v], f"{name}/ctx_h")


def _attention(g, x, attn, bias, rope, name, int8, plan=None):
    """Pre-normed ``x`` (B, L, D) -> attention output (B, L, D): q and k rotated together
    (x·cos + rotate_half(x)·sin), scores = q kᵀ · scale + bias, softmax over the keys,
    ``Wo``; with a window ``plan`` (:func:`variants.onnx.window_nodes.window_plan`) only the
    keys inside each query's window are scored, or (a plan with a ``cond``) only when its
    length test holds, else the dense scores with ``bias``."""
    H, d = attn.n_heads, attn.head_dim
    qkv = linear(g, x, attn.Wqkv, f"{name}.Wqkv", int8=int8)
    qkv = g.op("Reshape", [qkv, g.ints([0, 0, 3, H, d])], f"{name}/qkv5")  # (B, L, 3, H, d)
    qkv = g.op("Transpose", [qkv], f"{name}/qkv", perm=[2, 0, 3, 1, 4])  # (3, B, H, L, d)
    qk, v = g.op("Split", [qkv, g.ints([2, 1])], f"{name}/split", outputs=2, axis=0)
    cos, sin = rope
    rot = g.op("MatMul", [qk, g.const(_rotate_half(d), "rotate_half", share=True)],
               f"{name}/rotate_half")
    qk = g.op("Add", [g.op("Mul", [qk, cos], f"{name}/qk_cos"),
                      g.op("Mul", [rot, sin], f"{name}/qk_sin")], f"{name}/qk_rope")
    q, k = g.op("Split", [qk], f"{name}/split_qk", outputs=2, axis=0, num_outputs=2)
    q, k, v = (g.op("Squeeze", [t, g.ints([0])], f"{name}/{n}")  # (B, H, L, d)
               for t, n in ((q, "q"), (k, "k"), (v, "v")))
    dense = (lambda: _dense_core(g, q, k, v, attn.scale, bias, name))
    banded = (lambda: banded_attention(g, q, k, v, d, attn.scale, plan, name))
    if plan is None:
        ctx = dense()
    elif "cond" not in plan:
        ctx = banded()
    else:  # the window's length test: banded from plan["cond"] on, else the dense scores
        ctx = if_node(g, plan["cond"], banded, dense, f"{name}/local")
    out = g.op("Transpose", [ctx], f"{name}/ctx_t", perm=[0, 2, 1, 3])  # (B, L, H, d)
    out = g.op("Reshape", [out, g.ints([0, 0, H * d])], f"{name}/ctx")
    return linear(g, out, attn.Wo, f"{name}.Wo", int8=int8)


def _mlp(g, x, mlp, name, int8):
    """GeGLU: ``Wo``(act(input) · gate) with input | gate the two halves of ``Wi``(x)."""
    if mlp.hidden_activation not in ACTIVATION_OPS:
        raise ValueError(f"{name}: activation {mlp.hidden_activation!r} has no ONNX form here; "
                         f"the activations are {sorted(ACTIVATION_OPS)}")
    h = linear(g, x, mlp.Wi, f"{name}.Wi", int8=int8)
    inp, gate = g.op("Split", [h], f"{name}/Wi_split", outputs=2, axis=-1, num_outputs=2)
    op, attrs = ACTIVATION_OPS[mlp.hidden_activation]
    act = g.op(op, [inp], f"{name}/act", **attrs)
    return linear(g, g.op("Mul", [act, gate], f"{name}/glu"), mlp.Wo, f"{name}.Wo", int8=int8)


def _global_bias(g, mask):
    """(B, 1, 1, L) additive key bias: MASK_BIAS on the padded keys, else 0."""
    m = g.op("Cast", [mask], "mask/f32", to=FLOAT)
    key = g.op("Mul", [g.op("Sub", [g.scalar(1.0), m], "mask/padding"), g.scalar(MASK_BIAS)],
               "mask/bias")
    return g.op("Unsqueeze", [key, g.ints([1, 2])], "global_bias")


def _local_bias(g, glob, length, half):
    """(B, 1, L, L) additive bias of the local layers: ``glob`` plus MASK_BIAS on every key
    with |q - k| > ``half`` (= where it is, MASK_BIAS, as the MLX module)."""
    pos = g.op("Range", [scalar0(g, 0), length, scalar0(g, 1)], "window/pos")
    rows = g.op("Unsqueeze", [pos, g.ints([1])], "window/rows")
    dist = g.op("Abs", [g.op("Sub", [rows, pos], "window/offset")], "window/distance")  # (L, L)
    far = g.op("Greater", [dist, g.scalar(half, np.int64)], "window/far")
    return g.op("Where", [far, g.scalar(MASK_BIAS), glob], "local_bias")


def _check(encoder):
    from variants.arch.modernbert_layers import ModernBertLayer

    if not isinstance(encoder, ModernBertEncoder):
        raise ValueError(f"this encoder_graph builds ModernBertEncoder, not "
                         f"{type(encoder).__name__}; the BERT family has "
                         "variants.onnx.graph_bert")
    for i, layer in enumerate(encoder.layers):
        if type(layer) is not ModernBertLayer:
            raise ValueError(f"encoder.layers.{i} is a {type(layer).__name__}, not the "
                             "ModernBertLayer the graph builds; export the variant's "
                             "reference-shaped form or another family")


def encoder_graph(encoder, *, token_type_ids=False, int8="u8u8", name="modernbert-encoder",
                  local="auto", block=None):
    """The ``onnx.ModelProto`` of ``encoder`` (module docstring).

    Parameters
    ----------
    encoder : variants.arch.modernbert.ModernBertEncoder
        The reference or a variant's encoder (its Linears and token table of any kind
        :func:`variants.onnx.linear_nodes.linear` / :func:`variants.onnx.embedding_nodes.embedding`
        handle); read, not changed.
    token_type_ids : bool, default False
        Add an int64 (batch, sequence) ``token_type_ids`` input the graph ignores (ModernBERT
        has none; for a runner that feeds every graph BERT's three inputs).
    int8 : {"u8u8", "u8s8"}
        How W8A8 layers store their weight (:mod:`variants.onnx.linear_nodes`).
    name : str
        The graph's name.
    local : {"auto", "banded", "masked"}
        How the local layers attend (module docstring); "auto" picks per call by L.
    block : int, optional
        Query slots per block of the banded path (default
        :func:`variants.onnx.window_nodes.default_block`).

    Returns
    -------
    onnx.ModelProto
        Opset :data:`OPSET` (plus ``com.microsoft`` when a MatMulNBits layer is in it), IR
        version 10; inputs :data:`INPUTS` int64 (batch, sequence), output :data:`OUTPUT`
        float32 (batch, sequence, hidden_size).

    Raises
    ------
    ValueError
        Not a ModernBertEncoder, a layer, Linear, table or activation with no ONNX form here,
        an unknown ``int8`` scheme or ``local`` path: one line naming the module and the fix.
    """
    g = Graph(name)
    x, _ = body(g, encoder, token_type_ids=token_type_ids, int8=int8, local=local, block=block)
    args = encoder.args
    g.output(x, OUTPUT, FLOAT, ["batch", "sequence", int(args.hidden_size)])
    pattern = "".join("g" if layer.is_global else "l" for layer in encoder.layers)
    return g.model(doc="ModernBERT encoder exported by mlx-variants (issue #43)", metadata={
        "mlx_variants.graph": "modernbert-encoder", "model_type": args.model_type,
        "hidden_activation": args.hidden_activation, "pad_token_id": args.pad_token_id,
        "local_attention": args.local_attention, "layer_kinds": pattern})


def body(g, encoder, *, token_type_ids=False, int8="u8u8", local="auto", block=None):
    """Declare :data:`INPUTS` (int64 (batch, sequence); ``token_type_ids`` too when asked) in
    ``g`` and add ``encoder``'s nodes through its final norm; returns the names of (last hidden
    state (B, L, D) float32, the attention mask input), for a caller that adds a head
    (:mod:`variants.onnx.graph`). ``int8``, ``local``, ``block`` as :func:`encoder_graph`;
    raises ValueError as it does."""
    _check(encoder)
    if local not in LOCAL_MODES:
        raise ValueError(f"local={local!r} is not one of {', '.join(LOCAL_MODES)}; pass one of "
                         "them (auto: banded from L >= 2 windows on)")
    args = encoder.args
    axes = ["batch", "sequence"]
    ids, mask = (g.input(n, INT64, axes) for n in INPUTS)
    if token_type_ids:
        g.input("token_type_ids", INT64, axes)
    length = g.op("Gather", [g.op("Shape", [ids], "length/shape"), scalar0(g, 1)],
                  "length")  # 0-d
    emb = "encoder.embeddings"
    x = embedding(g, ids, encoder.embeddings.tok_embeddings, f"{emb}.tok_embeddings")
    x = _layer_norm(g, x, encoder.embeddings.norm, f"{emb}.norm")
    kinds = {bool(layer.is_global) for layer in encoder.layers}  # the tables the layers read
    bias = {True: _global_bias(g, mask)}
    plan, half = None, args.local_attention // 2
    if False in kinds and local != "banded":
        bias[False] = _local_bias(g, bias[True], length, half)
    if False in kinds and local != "masked":
        plan = window_plan(g, mask, length, half, block)
    if False in kinds and local == "auto":
        plan["cond"] = g.op("GreaterOrEqual", [length, scalar0(
            g, int(CROSSOVER * args.local_attention))], "window/banded")
        glob, dense = bias[True], (lambda: _local_bias(g, glob, length, half))
        bias[False] = if_node(g, plan["cond"], lambda: g.const(
            np.zeros((1, 1, 1, 1), np.float32), "window.unused_bias"), dense, "local_bias_if")
    hd = args.hidden_size // args.num_attention_heads
    ropes = {kind: _rope(g, length, args.global_rope_theta if kind else args.local_rope_theta,
                         hd, "rope_global" if kind else "rope_local") for kind in kinds}
    for i, layer in enumerate(encoder.layers):
        p = f"encoder.layers.{i}"
        kind = bool(layer.is_global)
        h = _layer_norm(g, x, layer.attn_norm, f"{p}.attn_norm")
        a = _attention(g, h, layer.attn, bias.get(kind), ropes[kind], f"{p}.attn", int8,
                       None if kind else plan)
        x = g.op("Add", [x, a], f"{p}/attn_res")
        h = _layer_norm(g, x, layer.mlp_norm, f"{p}.mlp_norm")
        x = g.op("Add", [x, _mlp(g, h, layer.mlp, f"{p}.mlp", int8)], f"{p}/mlp_res")
    x = _layer_norm(g, x, encoder.final_norm, "encoder.final_norm")
    return x, mask


def layer_norm(g, x, norm, name):
    """Public name of the LayerNormalization nodes for ``norm`` (a head's norm)."""
    return _layer_norm(g, x, norm, name)


def activation(g, x, act, name):
    """``x`` through activation ``act`` (a key of :data:`ACTIVATION_OPS`); ValueError else."""
    if act not in ACTIVATION_OPS:
        raise ValueError(f"{name}: activation {act!r} has no ONNX form here; use one of "
                         f"{sorted(ACTIVATION_OPS)}")
    op, attrs = ACTIVATION_OPS[act]
    return g.op(op, [x], f"{name}/{op}", **attrs)

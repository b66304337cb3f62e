"""ONNX nodes for ModernBERT's sliding-window attention computed band by band (the graph form of
:mod:`variants.arch.modernbert_window`; Longformer-style banded attention, Beltagy et al. 2020):
a query at position p attends to the keys with |p - p_k| <= ``half`` (``local_attention //
2``), positions 0..L-1.

The queries are cut into blocks of ``block`` slots; block j scores only key slots
[j·block - half, (j+1)·block + half), gathered from the keys padded by ``half`` on each side:
L · (block + 2·half) scores a layer instead of the dense path's L², the rest masked as the
dense path masks them (MASK_BIAS on padded keys and on keys outside the window; the window
part is one constant (block, block + 2·half) table). Every key the dense path weights lies in
its query's block span, so the weights are the dense path's up to float32 summation order.

:func:`window_plan` builds the per-forward tables once (a dict of tensor names);
:func:`banded_attention` uses them in each local layer.
"""

import numpy as np

from variants.arch.encoder import MASK_BIAS


def scalar0(g, value, dtype=np.int64):
    """A 0-d initializer of ``dtype`` in graph ``g`` (its name): ``Range`` takes 0-d bounds, and
    :meth:`variants.onnx.builder.Graph.scalar` stores a (1,) tensor (``np.ascontiguousarray``
    makes 0-d arrays 1-d)."""
    from onnx import numpy_helper

    a = np.asarray(value, dtype)
    made = g.__dict__.setdefault("_scalar0", {})  # one initializer per (dtype, value)
    key = (a.dtype.str, a.item())
    if key not in made:
        made[key] = g.fresh(f"s0_{a.dtype.name}_{a.item()}".replace("-", "m"))
        g.initializers.append(numpy_helper.from_array(a, made[key]))
    return made[key]


def default_block(half):
    """Query slots per block in the graph: ``half`` (a span of 3·half keys), floored at 8.
    ONNX has no strided view, so each block's keys are a gathered copy (span / block copies of
    k and v): larger blocks than MLX's (:func:`variants.arch.modernbert_window.default_block`)
    copy less."""
    return max(8, int(half))


def window_plan(g, mask, length, half, block=None):
    """The tables every local layer of one forward shares, as tensor names: ``idx`` (nb, span)
    int64 key slot of each block position, ``bias`` (B, 1, nb, block, span) float32 (0 or
    MASK_BIAS, padding and window summed), ``q_pads`` / ``kv_pads`` (``Pad``'s 8 int64) and
    ``length1`` (1,) int64; plus ``half``, ``block``. ``mask`` (B, L) int64 and ``length`` (0-d
    int64, the sequence length) are tensor names of the graph ``g``."""
    if block is not None and (int(block) != block or block < 1):
        raise ValueError(f"block={block!r} is not a positive whole number of query slots; pass "
                         "e.g. block=64, or None for the default")
    w = int(block or default_block(half))
    span = w + 2 * half
    nb = g.op("Div", [g.op("Add", [length, scalar0(g, w - 1)], "window/len_up"),
                      scalar0(g, w)], "window/n_blocks")  # 0-d
    tail = g.op("Sub", [g.op("Mul", [nb, scalar0(g, w)], "window/padded"), length],
                "window/tail")
    tail1 = g.op("Reshape", [tail, g.ints([1])], "window/tail1")
    end = g.op("Add", [tail1, g.ints([half])], "window/kv_end")
    q_pads = g.op("Concat", [g.ints([0, 0, 0, 0, 0, 0]), tail1, g.ints([0])], "window/q_pads",
                  axis=0)
    kv_pads = g.op("Concat", [g.ints([0, 0, half, 0, 0, 0]), end, g.ints([0])],
                   "window/kv_pads", axis=0)
    starts = g.op("Mul", [g.op("Range", [scalar0(g, 0), nb, scalar0(g, 1)], "window/blocks"),
                          scalar0(g, w)], "window/starts")
    idx = g.op("Add", [g.op("Unsqueeze", [starts, g.ints([1])], "window/start_col"),
                       g.const(np.arange(span, dtype=np.int64)[None, :], "window.span")],
               "window/idx")  # (nb, span)
    m = g.op("Cast", [mask], "window/mask_f32", to=1)
    key = g.op("Mul", [g.op("Sub", [g.scalar(1.0), m], "window/padding"), g.scalar(MASK_BIAS)],
               "window/key_bias")  # (B, L)
    pads = g.op("Concat", [g.ints([0, half]), g.ints([0]), end], "window/key_pads", axis=0)
    key = g.op("Pad", [key, pads, g.scalar(MASK_BIAS)], "window/key_bias_padded")
    key = g.op("Gather", [key, idx], "window/key_blocks", axis=1)  # (B, nb, span)
    key = g.op("Unsqueeze", [key, g.ints([1, 3])], "window/key_bias5")  # (B, 1, nb, 1, span)
    t, s = np.arange(w)[:, None], np.arange(span)[None, :]
    far = np.where(np.abs(t + half - s) > half, MASK_BIAS, 0.0).astype(np.float32)
    bias = g.op("Add", [key, g.const(far, "window.far")], "window/bias")
    length1 = g.op("Reshape", [length, g.ints([1])], "window/length1")
    return {"idx": idx, "bias": bias, "q_pads": q_pads, "kv_pads": kv_pads,
            "length1": length1, "half": half, "block": w}


def banded_attention(g, q, k, v, head_dim, scale, plan, name):
    """softmax(q kᵀ · scale + window bias) v over each query's window only: ``q``, ``k``, ``v``
    (B, H, L, head_dim) float32 tensor names (rotary applied) -> (B, H, L, head_dim); ``plan``
    from :func:`window_plan`."""
    w = plan["block"]
    qb = g.op("Pad", [q, plan["q_pads"]], f"{name}/q_padded")
    qb = g.op("Reshape", [qb, g.ints([0, 0, -1, w, head_dim])],
              f"{name}/q_blocks")  # (B, H, nb, w, d)
    kb, vb = (g.op("Gather", [g.op("Pad", [t, plan["kv_pads"]], f"{name}/{n}_padded"),
                              plan["idx"]], f"{name}/{n}_blocks", axis=2)  # (B, H, nb, span, d)
              for t, n in ((k, "k"), (v, "v")))
    kt = g.op("Transpose", [kb], f"{name}/k_blocks_t", perm=[0, 1, 2, 4, 3])
    scores = g.op("Mul", [g.op("MatMul", [qb, kt], f"{name}/band_qk"), g.scalar(scale)],
                  f"{name}/band_scores0")
    probs = g.op("Softmax", [g.op("Add", [scores, plan["bias"]], f"{name}/band_scores")],
                 f"{name}/band_probs", axis=-1)
    out = g.op("MatMul", [probs, vb], f"{name}/band_ctx")  # (B, H, nb, w, d)
    out = g.op("Reshape", [out, g.ints([0, 0, -1, head_dim])], f"{name}/band_ctx_flat")
    return g.op("Slice", [out, g.ints([0]), plan["length1"], g.ints([2])], f"{name}/band_out")


def if_node(g, cond, then_build, else_build, hint):
    """An ONNX ``If`` on ``cond`` (a bool tensor name, one element) whose branches are the nodes
    ``then_build()`` / ``else_build()`` append to ``g`` (each returns its float32 output's name;
    the nodes may read any tensor built before, and the initializers they add stay in the
    outer graph); returns the ``If``'s output name. Only the branch taken runs, so its tables
    may be as large as that branch needs."""
    from onnx import TensorProto, helper

    branches = []
    for side, build in (("then", then_build), ("else", else_build)):
        saved, g.nodes = g.nodes, []
        try:
            out = build()
        finally:
            nodes, g.nodes = g.nodes, saved
        if not nodes or out not in {o for n in nodes for o in n.output}:  # an outer name
            nodes.append(helper.make_node("Identity", [out], [g.fresh(f"{hint}/{side}_out")]))
            out = nodes[-1].output[0]
        branches.append(helper.make_graph(nodes, g.fresh(f"{hint}/{side}"), [], [
            helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]))
    return g.op("If", [cond], hint, then_branch=branches[0], else_branch=branches[1])

"""DeBERTa-v2/v3's disentangled self-attention and post-norm layer in MLX (He et al. 2021,
"DeBERTa: Decoding-enhanced BERT with Disentangled Attention", §3.1; layout and arithmetic as
Hugging Face ``transformers``' ``modeling_deberta_v2.py``, eager path).

Scores of query i and key j, with relative position δ(i, j) = bucket(pos_i - pos_j) and a
relative embedding table P (2·S rows, layer-normed when ``norm_rel_ebd`` says so; S =
``position_buckets``, else ``max_relative_positions``)::

    (q_i · k_j  +  q_i · Pk[c(δ)]  +  k_j · Pq[c(-δ(j, i))]) / sqrt(d · (1 + #c2p + #p2c))

with c(δ) = clip(δ + S, 0, 2S - 1), the c2p term when ``"c2p"`` is in ``pos_att_type`` and the
p2c term when ``"p2c"`` is; Pk, Pq are P through the layer's own key / query projections
(``share_att_key``) or through ``pos_key`` / ``pos_query``. Buckets:
:func:`log_bucket_position` (``position_buckets`` > 0 and ``max_relative_positions`` > 0).

``pos_key`` / ``pos_query`` (unshared v2 projections) are :class:`PositionProjection`, not
``nn.Linear``: they only ever read the constant table P, so the families that compress the
encoder's token Linears (quant, low rank, W8A8) leave them at full precision.
"""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.arch.encoder import ACTIVATIONS, LayerNorm
from variants.runtime import fast_ops
from variants.runtime.derived import DerivedWeights
from variants.runtime.fused import FusedMLP


def log_bucket_position(relative_pos, bucket_size, max_position):
    """transformers' ``make_log_bucket_position`` on an int array: |δ| < bucket_size // 2 kept,
    larger distances on a log scale up to ``max_position`` (float32 log and ceil, so the
    buckets are the same integers). Returns int64, same shape."""
    rel = np.asarray(relative_pos, np.int64)
    mid = bucket_size // 2
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    log_pos = np.ceil(np.log(abs_pos.astype(np.float32) / np.float32(mid))
                      / np.log(np.float32((max_position - 1) / mid))
                      * np.float32(mid - 1)) + mid
    return np.where(abs_pos <= mid, rel, log_pos * np.sign(rel)).astype(np.int64)


class PositionProjection(nn.Module):
    """``x @ weight.T + bias`` for DeBERTa-v2's unshared ``pos_key_proj`` / ``pos_query_proj``
    (weight (out, in), bias (out,), names as ``nn.Linear``)."""

    def __init__(self, dim):
        super().__init__()
        self.weight = mx.zeros((dim, dim))
        self.bias = mx.zeros((dim,))

    def __call__(self, x):
        return mx.addmm(self.bias, x, self.weight.T)


class DisentangledAttention(nn.Module):
    """Multi-head disentangled self-attention: ``query``, ``key``, ``value`` and ``out``
    (``attention.output.dense``) biased Linears, plus ``pos_key`` / ``pos_query`` when the
    position projections are not shared. Called as ``attn(x (B, L, D), ctx,
    return_attention)`` with a :class:`variants.arch.deberta.DebertaContext`."""

    def __init__(self, args):
        super().__init__()
        D = args.hidden_size
        self.n_heads = args.num_attention_heads
        self.head_dim = D // self.n_heads
        self.query, self.key, self.value, self.out = (nn.Linear(D, D) for _ in range(4))
        self.c2p = "c2p" in args.pos_att_type
        self.p2c = "p2c" in args.pos_att_type
        self.relative = bool(args.relative_attention)
        self.shared = bool(args.share_att_key)
        if self.relative and not self.shared:
            if self.c2p:
                self.pos_key = PositionProjection(D)
            if self.p2c:
                self.pos_query = PositionProjection(D)
        # transformers: sqrt(head_dim · scale_factor), scale_factor counting c2p and p2c
        self.scale = 1.0 / math.sqrt(self.head_dim * (1 + self.c2p + self.p2c))

    def heads(self, t):
        """(..., n, D) -> (..., heads, n, head_dim)."""
        t = t.reshape(*t.shape[:-1], self.n_heads, self.head_dim)
        return mx.swapaxes(t, -2, -3)

    def __call__(self, x, ctx, return_attention=False):
        """-> (out (B, L, D) before the residual and norm, probs (B, heads, L, L) or None)."""
        B, L, D = x.shape
        # the token projections first: an activation recorder keeps the first input it sees
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        scores = (q @ mx.swapaxes(k, -1, -2)) * self.scale
        if self.relative and (self.c2p or self.p2c):
            rel = ctx.rel_rows  # (n, D): the table rows the context's positions reach
            idx = ctx.c2p_index  # (1 or B, 1, L, L) into those rows
            if self.c2p:
                pk = self.heads(self.key(rel) if self.shared else self.pos_key(rel))
                c2p = q @ mx.swapaxes(pk, -1, -2)  # (B, H, L, n)
                scores = scores + mx.take_along_axis(
                    c2p, mx.broadcast_to(idx, (B, self.n_heads, L, L)), axis=-1) * self.scale
            if self.p2c:
                pq = self.heads(self.query(rel) if self.shared else self.pos_query(rel))
                p2c = k @ mx.swapaxes(pq, -1, -2)  # (B, H, L keys, n)
                g = mx.take_along_axis(p2c, mx.broadcast_to(ctx.p2c_index, (B, self.n_heads, L, L)),
                                       axis=-1)
                scores = scores + mx.swapaxes(g, -1, -2) * self.scale
        probs = fast_ops.masked_softmax(scores, ctx.key_bias)
        out = mx.swapaxes(probs @ v, 1, 2).reshape(B, L, D)
        return self.out(out), (probs if return_attention else None)


class DebertaLayer(FusedMLP, nn.Module):
    """Post-norm layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)), BERT's parameter names
    (``attention.query`` ... ``output_norm``)."""

    def __init__(self, args):
        super().__init__()
        self.attention = DisentangledAttention(args)
        self.attention_norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.intermediate = nn.Linear(args.hidden_size, args.intermediate_size)
        self.output = nn.Linear(args.intermediate_size, args.hidden_size)
        self.output_norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.hidden_act = args.hidden_act
        self._mlp = DerivedWeights()

    def activation(self, x):
        """The layer's activation function (``ACTIVATIONS[hidden_act]``), elementwise."""
        return ACTIVATIONS[self.hidden_act](x)

    def __call__(self, x, ctx, return_attention=False):
        """``x`` (B, L, D) float32 -> (x', probs (B, heads, L, L) or None)."""
        a, probs = self.attention(x, ctx, return_attention)
        x = self.attention_norm(x + a)
        return self.output_norm(x + self.mlp(x)), probs

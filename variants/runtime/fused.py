"""Fused projections: the fast path of a BERT-style layer whose projections are plain biased
``nn.Linear`` (the reference; quantised or low-rank variants replace them and take the plain
path). Mixins for any architecture with the same projection names: :class:`FusedAttention`
(``query``, ``key``, ``value``, ``out``, ``scale``, ``head_dim``, ``heads``, ``core`` and a
:class:`variants.runtime.derived.DerivedWeights` ``_folded``) and :class:`FusedMLP` (``intermediate``,
``output``, ``activation`` and a ``_mlp`` cache); :mod:`variants.arch.encoder` uses both.
"""

import mlx.core as mx

from variants.runtime.derived import plain_linear, transposed


class FusedAttention:
    """Self-attention projections with weights folded once per weight set (exact algebra;
    float32 round-off aside):

    - one (3D, D) GEMM for q, k, v, with 1/sqrt(d) folded into the query weight and bias;
    - the key bias is dropped: it adds q_i·b_k to every score of row i, which softmax ignores;
    - the value bias moves into the output bias (b_o + W_o b_v): softmax rows sum to 1.
    """

    def folded(self):
        """``(w_qkv_t (D, 3D), b_q (D,), b_out (D,), w_out_t (D, D))`` for the fused path, or
        None when any projection is not a plain biased ``nn.Linear``. The weights are stored
        transposed (input features first, contiguous): OpenBLAS's sgemm runs ``x @ w_t`` up to
        ~15% faster than ``x @ w.T`` at the few rows of a short batch (alternated A/B, M = 16:
        0.81-0.89x the time; M = 64: 0.92-0.96x; M >= 1000: equal). Rebuilt when a weight is
        replaced by another array (assignment, ``update``, ``load_weights``, deep copies); an
        in-place edit of a weight array (``w[...] = v``, ``w *= 2``) keeps the same object and
        is not seen: assign a new array instead."""
        mods = (self.query, self.key, self.value, self.out)
        if not all(plain_linear(m) for m in mods):
            self._folded.clear()
            return None
        sources = tuple(a for m in mods for a in (m.weight, m.bias))
        return self._folded.get(sources, lambda: (
            transposed(mx.concatenate([self.query.weight * self.scale, self.key.weight,
                               self.value.weight])),
            self.query.bias * self.scale, self.out.bias + self.out.weight @ self.value.bias,
            transposed(self.out.weight)))

    def projections(self, x, kv=None, rows=None):
        """(q, k, v) before the head split: q (..., Lq, D) from ``x``, already scaled by
        1/sqrt(head_dim); k, v (..., L, D) from ``kv`` (default ``x``). Any leading shape,
        including the (N, D) rows of a packed batch; ``rows`` (int32) gathers those rows of the
        results (one gather of the fused q|k|v on the folded path)."""
        kv = x if kv is None else kv
        pick = (lambda t: t) if rows is None else (lambda t: mx.take(t, rows, axis=0))
        folded = self.folded()
        if folded is None:
            return pick(self.query(x) * self.scale), pick(self.key(kv)), pick(self.value(kv))
        w_t, b_q = folded[:2]
        D = x.shape[-1]
        if kv is x:
            qkv = pick(x @ w_t)
            return qkv[..., :D] + b_q, qkv[..., D:2 * D], qkv[..., 2 * D:]
        kvp = pick(kv @ w_t[:, D:])
        return pick(x @ w_t[:, :D]) + b_q, kvp[..., :D], kvp[..., D:]

    def packed_project(self, x, part):
        """(q, k, v) heads on a packed part's (B, part.L) layout (:mod:`variants.runtime.packing`) from
        its real-token rows ``x`` (n, D), gathered once from the fused q|k|v."""
        B = part.seqs[1] - part.seqs[0]
        return tuple(self.heads(t, B, part.L) for t in self.projections(x, rows=part.pad_index))

    def packed_core(self, q, k, v, part):
        """The attention core on a packed part's layout, back to its real-token rows (n, D)."""
        ctx, _ = self.core(q, k, v, part.bias)
        return mx.take(ctx.reshape(-1, ctx.shape[-1]), part.real_index, axis=0)

    def output(self, ctx):
        """The output projection (with the folded value bias on the fused path)."""
        folded = self.folded()
        if folded is None:
            return self.out(ctx)
        return mx.addmm(folded[2], ctx, folded[3])


class FusedMLP:
    """The MLP's Linears as cached transposed weights (``x @ w_t``, see
    :meth:`FusedAttention.folded`), or the Linears themselves when a variant replaced them."""

    def mlp_weights(self):
        """``(w_i_t (D, F), b_i (F,), w_u_t (F, D), b_u (D,))``, the MLP's weights transposed
        (as :meth:`Attention.folded`), or None when either Linear is not a plain biased
        ``nn.Linear`` (a variant replaced it)."""
        if not (plain_linear(self.intermediate) and plain_linear(self.output)):
            self._mlp.clear()
            return None
        i, u = self.intermediate, self.output
        return self._mlp.get((i.weight, i.bias, u.weight, u.bias),
                             lambda: (transposed(i.weight), i.bias, transposed(u.weight), u.bias))

    def mlp_in(self, x):
        """The intermediate Linear, (..., D) -> (..., F), before the activation."""
        w = self.mlp_weights()
        return self.intermediate(x) if w is None else mx.addmm(w[1], x, w[0])

    def mlp_out(self, g):
        """The output Linear, (..., F) -> (..., D)."""
        w = self.mlp_weights()
        return self.output(g) if w is None else mx.addmm(w[3], g, w[2])

    def mlp(self, x):
        """Output Linear of the activation of the intermediate Linear: (..., D) -> (..., D)."""
        return self.mlp_out(self.activation(self.mlp_in(x)))

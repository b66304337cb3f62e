"""Running a layer stack fast on a multi-core CPU: rows split over MLX streams, padded batches
packed (:mod:`variants.runtime.packing`), heads and MLP features sharded when a batch is too small to
split by rows. Mixins for any post-norm BERT-style architecture: :class:`StreamLayer` (a layer
with ``attention`` (:class:`variants.runtime.fused.FusedAttention`), ``attention_norm``,
``output_norm``, ``intermediate``, ``output``, ``mlp``, ``activation``, ``_forward`` and a
:class:`variants.runtime.derived.DerivedWeights` ``_shards``) and :class:`StreamEncoder` (a ``layers``
list of them); :mod:`variants.arch.encoder` uses both. Every row's arithmetic is unchanged.
"""

import mlx.core as mx
import numpy as np

from variants.runtime import fused_layer, packing, parallel


def _packed_step(layer, rows, part):
    return layer._forward_packed(rows, part)


class StreamLayer:
    """A layer called directly on a multi-core CPU splits its rows over
    :func:`variants.runtime.parallel.streams` (the batch when B >= 2, else the query positions, each
    half attending to all keys) and runs the halves at once on separate MLX streams;
    :class:`StreamEncoder` also uses :meth:`forward_sharded` (B = 1) and :meth:`_forward_packed`
    (packed batches)."""

    def shards(self, k):
        """Per-stream weight shards for :meth:`forward_sharded`, or None when a projection is
        not a plain biased ``nn.Linear`` or fewer than 2 parts are possible: a list of
        min(k, heads, intermediate size) tuples (w_qkv_t, b_q, w_o_t, w_i_t, b_i, w_u_t) — the
        heads and the intermediate features split in that many contiguous groups, each weight
        transposed (input features first, as :meth:`Attention.folded`). ``w_o_t`` and ``w_u_t``
        are row blocks of the folded / MLP caches (views, no copy); q|k|v and ``w_i_t`` are
        column blocks, copied once."""
        att = self.attention
        folded = att.folded()
        mlp = self.mlp_weights()
        if folded is not None and mlp is not None:
            k = min(k, att.n_heads, mlp[0].shape[1])  # no empty part
        if folded is None or mlp is None or k < 2:
            self._shards.clear()
            return None
        sources = (*(a for m in (att.query, att.key, att.value, att.out)
                     for a in (m.weight, m.bias)),
                   self.intermediate.weight, self.intermediate.bias, self.output.weight, k)

        def build():
            w_t, b_q, _, w_o_t = folded
            w_i_t, b_i, w_u_t, _ = mlp
            D, d = att.out.weight.shape[0], att.head_dim
            parts = []
            for (a, b), (fa, fb) in zip(parallel.bounds(att.n_heads, k),
                                        parallel.bounds(self.intermediate.weight.shape[0], k)):
                cols = slice(a * d, b * d)
                parts.append((
                    mx.concatenate([w_t[:, cols], w_t[:, D:][:, cols], w_t[:, 2 * D:][:, cols]],
                                   axis=1), b_q[cols],
                    w_o_t[cols], mx.contiguous(w_i_t[:, fa:fb]), b_i[fa:fb], w_u_t[fa:fb]))
            return parts
        return self._shards.get(sources, build)

    def forward_sharded(self, x, bias, shards):
        """The layer with its heads and MLP features split over the streams (tensor
        parallelism, Shoeybi et al. 2019, "Megatron-LM"): each stream projects q, k, v for its
        heads, runs their attention and its slice of the output projection, then its slice of
        the MLP; the partial outputs are summed before each layer norm. For a batch too small to
        split by rows (B = 1): no work is done twice. ``x`` (B, L, D) -> (B, L, D)."""
        att = self.attention
        ss = parallel.streams()
        B, L, _ = x.shape
        parts = []
        for s, (w_qkv, b_q, w_o, _, _, _) in zip(ss, shards):
            with mx.stream(s):
                n = b_q.shape[0]
                qkv = x @ w_qkv
                q, k, v = (att.heads(t, B, L) for t in
                           (qkv[..., :n] + b_q, qkv[..., n:2 * n], qkv[..., 2 * n:]))
                ctx, _ = att.core(q, k, v, bias)
                parts.append(ctx @ w_o)
        with mx.stream(ss[0]):
            x = self.attention_norm(x + (sum(parts[1:], parts[0]) + att.folded()[2]))
        parts = []
        for s, (_, _, _, w_i, b_i, w_u) in zip(ss, shards):
            with mx.stream(s):
                parts.append(self.activation(mx.addmm(b_i, x, w_i)) @ w_u)
        with mx.stream(ss[0]):
            return self.output_norm(x + (sum(parts[1:], parts[0]) + self.output.bias))

    def __call__(self, x, bias, return_attention=False):
        """``x`` (B, L, D) float32, ``bias`` (B or 1, 1, 1, L) additive key bias or None (no
        padding) -> (x', probs)."""
        ss = parallel.streams()
        B, L, _ = x.shape
        one = len(ss) == 1 or B * L < parallel.MIN_ROWS or (B == 1 and L < len(ss))
        if not return_attention and (one or B < len(ss)):  # one stream busy: all BLAS threads
            y = fused_layer.forward(self, x, bias,
                                    threads=fused_layer.one_stream_threads(B * L))
            if y is not None:
                return y, None
        if one:
            return self._forward(x, bias, return_attention)
        outs = []
        if B >= len(ss):  # split the batch: each half is a complete, independent sub-batch
            for s, (a, b) in zip(ss, parallel.bounds(B, len(ss))):
                with mx.stream(s):
                    outs.append(self._forward(x[a:b], bias if bias is None or bias.shape[0] == 1
                                              else bias[a:b],
                                              return_attention))
            axis, attn_axis = 0, 0
        else:  # split the queries: each part attends to every key
            for s, (a, b) in zip(ss, parallel.bounds(L, len(ss))):
                with mx.stream(s):
                    outs.append(self._forward(x[:, a:b], bias, return_attention, kv=x))
            axis, attn_axis = 1, 2
        y = mx.concatenate([o[0] for o in outs], axis=axis)
        attn = mx.concatenate([o[1] for o in outs], axis=attn_axis) if return_attention else None
        return y, attn

    def _forward_packed(self, x, part):
        """The layer on one part of a packed batch (:mod:`variants.runtime.packing`): ``x`` (n, D) the
        part's real tokens -> (n, D); the attention core runs on the part's (B, part.L) layout."""
        y = fused_layer.forward_packed(self, x, part)
        if y is not None:
            return y
        att = self.attention
        x = self.attention_norm(x + att.output(att.packed_core(*att.packed_project(x, part), part)))
        return self.output_norm(x + self.mlp(x))


class StreamEncoder:
    """A layer stack (``layers``) run over the streams: head-split, packed or split by
    sequences (:meth:`stream_forward`), and one layer at a time the same way
    (:meth:`run_layer`)."""

    @staticmethod
    def _row_parts(mask):
        """How many stream parts a batch with ``mask`` (B, L) NumPy splits into by sequences:
        one per stream when B and the real tokens allow it, else 1."""
        n = len(parallel.streams())
        return n if mask.shape[0] >= n and mask.sum() >= parallel.MIN_ROWS else 1

    def _head_split(self, mask):
        """Per-layer shards when a batch with ``mask`` (B, L) NumPy runs head-split
        (:meth:`TransformerLayer.forward_sharded`: fewer sequences than streams, enough tokens,
        plain Linears), else None."""
        ss = parallel.streams()
        if not (len(ss) > 1 and mask.shape[0] < len(ss) and mask.sum() >= parallel.MIN_ROWS):
            return None
        shards = [layer.shards(len(ss)) for layer in self.layers]
        return shards if all(sh is not None for sh in shards) else None

    def _packing_plan(self, mask, bias):
        """A :class:`variants.runtime.packing.Plan` for ``mask`` (B, L) NumPy, split by sequences over
        the streams, when the batch has padding (``bias`` not None) and enough of it, else None."""
        if bias is None or parallel.whole_batches():
            return None
        order = packing.longest_first(mask)
        return packing.plan(mask, bias, packing.balanced_bounds(mask.sum(axis=1)[order],
                                                                self._row_parts(mask)),
                            order=order)

    def stream_forward(self, x, mask, bias):
        """The whole stack on embeddings ``x`` (B, L, D) over the streams, or None when the
        batch runs best on one (the caller then runs the layers in turn). ``mask`` (B, L)
        NumPy 0/1; ``bias`` as :func:`variants.arch.encoder.attention_bias` gives, or None when no
        key is padding. Padded positions of a packed result are zeros."""
        B, L = mask.shape
        if B < len(parallel.streams()) and fused_layer.applies(self.layers):
            # one sequence: the compiled layer on one stream with every BLAS thread (measured
            # faster than the head split, bench/peers.py)
            for layer in self.layers:
                x = layer(x, bias)[0]
            return x
        shards = self._head_split(mask)
        if shards is not None:  # too few sequences to split: split heads
            for layer, sh in zip(self.layers, shards):
                x = layer.forward_sharded(x, bias, sh)
            return x
        p = self._packing_plan(mask, bias)
        if p is not None:
            return p.unpack(self._stacks(p.split(x), _packed_step))
        k = self._row_parts(mask)
        if k > 1:
            cuts = parallel.bounds(B, k)
            return self._stacks([(bias if bias is None else bias[a:b], x[a:b]) for a, b in cuts],
                                lambda layer, h, bb: layer._forward(h, bb)[0])
        return None

    def run_layer(self, layer, x, bias, attention_mask):
        """One layer (``x`` (B, L, D) -> (B, L, D)) the way :meth:`__call__` runs a batch:
        packed over the streams when enough of it is padding (padded positions of the result
        are then zeros), else ``layer(x, bias)``. For forwards that go layer by layer (token
        pruning, early exit), so they skip padding as the reference does. ``attention_mask``
        (B, L) 0/1, MLX or NumPy; ``bias`` as :func:`attention_bias` gives (or None). The
        packed path takes the mask as the truth about which keys are real: a bias must mask
        the same keys (a shared (1, 1, 1, L) bias from another mask is not supported)."""
        p = self._packing_plan(np.array(attention_mask), bias)
        if p is None:
            return layer(x, bias)[0]
        return p.unpack(self._stacks(p.split(x), _packed_step, [layer]))

    def _stacks(self, parts, step, layers=None):
        """Run every layer on each part, each part on its own stream (one whole layer stack per
        stream, joined once at the end: measured 6% faster than a join per layer at B=32,
        L=128, as the streams no longer wait for each other between layers). ``parts``: a list
        of (context, rows); ``step(layer, rows, context)`` -> rows; ``layers`` default all."""
        outs = []
        for s, (ctx, h) in zip(parallel.streams(), parts):
            with mx.stream(s):
                for layer in self.layers if layers is None else layers:
                    h = step(layer, h, ctx)
                outs.append(h)
        return mx.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]

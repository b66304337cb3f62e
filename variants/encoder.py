"""A BERT-family encoder in MLX (post-norm layers), with per-layer access for later variants."""

import inspect
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants import fast_ops, packing, parallel

ACTIVATIONS = {"gelu": fast_ops.gelu, "gelu_exact": nn.gelu, "gelu_new": nn.gelu_approx, "gelu_pytorch_tanh": nn.gelu_approx,
               "relu": nn.relu}

# Large finite negative bias for padded keys: a fully padded row stays finite (no NaN).
MASK_BIAS = -1e9


@dataclass
class ModelArgs:
    """Encoder configuration, read from a Hugging Face ``config.json``."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    model_type: str = "bert"

    @classmethod
    def from_dict(cls, params):
        """Build from a config dict, dropping keys this encoder does not use."""
        names = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in params.items() if k in names})

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; "
                             f"use one of {sorted(ACTIVATIONS)}")


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters and weight names) computed by
    :func:`variants.fast_ops.layer_norm`: MLX's fused layer norm has no CPU kernel."""

    def __call__(self, x):
        return fast_ops.layer_norm(x, getattr(self, "weight", None), getattr(self, "bias", None),
                                   self.eps)


class Embeddings(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids, token_type_ids, position_ids):
        x = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
             + self.token_type_embeddings(token_type_ids))
        return self.norm(x)


class _Folded:
    """Holds weights derived from a module's own (folded or sharded copies) and the arrays they
    were built from (a plain object, so nn.Module does not treat it as parameters)."""

    def __init__(self):
        self.sources, self.arrays = None, None

    def __deepcopy__(self, memo):
        # a deep-copied module starts empty and builds from its own weights on first use: a
        # variant made by deep-copying a warmed reference and replacing its Linears would
        # otherwise hold the reference's derived arrays (~85 MB for MiniLM) without using them
        return _Folded()

    def clear(self):
        """Drop the cached arrays (and the references to their sources)."""
        self.sources, self.arrays = None, None

    def get(self, sources, build):
        """The cached arrays while ``sources`` are the same array objects, else ``build()``."""
        if self.sources is None or len(sources) != len(self.sources) or any(
                a is not b for a, b in zip(sources, self.sources)):
            self.sources, self.arrays = sources, build()  # left lazy: the first forward computes
        return self.arrays


def _plain_linear(m):
    return type(m) is nn.Linear and "bias" in m


def _t(w):
    """``w`` (out, in) -> its transpose (in, out), contiguous (see :meth:`Attention.folded`)."""
    return mx.contiguous(w.T)


def _keys_first(bias):
    """An additive attention bias laid out for (…, L keys, Lq queries) scores: the last two axes
    swapped; a (L,) key bias becomes (L, 1); None and scalars pass through."""
    if bias is None or bias.ndim == 0:
        return bias
    return bias[:, None] if bias.ndim == 1 else mx.swapaxes(bias, -1, -2)


class Attention(nn.Module):
    """Multi-head self-attention (BERT), queries from ``x``, keys and values from ``kv``.

    When query, key, value and out are plain biased ``nn.Linear`` (the reference; quantised or
    low-rank variants replace them and take the unfused path), the forward uses weights folded
    once per weight set (exact algebra; float32 round-off aside):

    - one (3D, D) GEMM for q, k, v, with 1/sqrt(d) folded into the query weight and bias;
    - the key bias is dropped: it adds q_i·b_k to every score of row i, which softmax ignores;
    - the value bias moves into the output bias (b_o + W_o b_v): softmax rows sum to 1.

    The softmax is left unnormalised until after ``probs @ v`` (:func:`fast_ops.softmax_parts`).
    """

    def __init__(self, args):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.head_dim = args.hidden_size // args.num_attention_heads
        self.scale = self.head_dim ** -0.5
        dim = args.hidden_size
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self._folded = _Folded()

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
        if not all(_plain_linear(m) for m in mods):
            self._folded.clear()
            return None
        sources = tuple(a for m in mods for a in (m.weight, m.bias))
        return self._folded.get(sources, lambda: (
            _t(mx.concatenate([self.query.weight * self.scale, self.key.weight,
                               self.value.weight])),
            self.query.bias * self.scale, self.out.bias + self.out.weight @ self.value.bias,
            _t(self.out.weight)))

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
        """(q, k, v) heads on a packed part's (B, part.L) layout (:mod:`variants.packing`) from
        its real-token rows ``x`` (n, D), gathered once from the fused q|k|v."""
        B = part.seqs[1] - part.seqs[0]
        return tuple(self.heads(t, B, part.L) for t in self.projections(x, rows=part.pad_index))

    def packed_core(self, q, k, v, part):
        """The attention core on a packed part's layout, back to its real-token rows (n, D)."""
        ctx, _ = self.core(q, k, v, part.bias)
        return mx.take(ctx.reshape(-1, ctx.shape[-1]), part.real_index, axis=0)

    def heads(self, t, B, L):
        """(B·L, D') or (B, L, D') -> (B, D' / head_dim heads, L, head_dim)."""
        return t.reshape(B, L, -1, self.head_dim).transpose(0, 2, 1, 3)

    def project(self, x, kv=None):
        """(q, k, v), each (B, heads, L, head_dim); q already scaled by 1/sqrt(head_dim)."""
        q, k, v = self.projections(x, kv)
        L = x.shape[1] if kv is None else kv.shape[1]
        return self.heads(q, x.shape[0], x.shape[1]), self.heads(k, x.shape[0], L), \
            self.heads(v, x.shape[0], L)

    def core(self, q, k, v, bias, return_attention=False):
        """softmax(q kᵀ + bias) v -> (ctx (B, Lq, D), probs (B, heads, Lq, L) or None)."""
        B, h, Lq, d = q.shape
        # Explicit attention: on CPU, mx.fast.scaled_dot_product_attention spends most of its
        # time in element-wise exp; fast_ops' exp fuses (bench/encoder_steps.py).
        if return_attention:
            probs = fast_ops.masked_softmax(q @ k.transpose(0, 1, 3, 2), bias)
            ctx = probs @ v
        else:
            # Scores transposed, keys on axis -2: the row max becomes a column max, which MLX's
            # CPU reduces ~3x faster than short last-axis rows (5-11% off the whole core,
            # alternated A/B at B=16, L=29..128). eᵀ @ [v, 1]: the last column is the row sum
            # of e, so no separate reduction pass; BLAS takes eᵀ as a transposed operand.
            e = fast_ops.softmax_parts(k @ q.transpose(0, 1, 3, 2), _keys_first(bias),
                                       total=False, axis=-2)
            v1 = mx.concatenate([v, mx.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
            r = e.transpose(0, 1, 3, 2) @ v1
            ctx, probs = r[..., :d] / r[..., d:], None
        return ctx.transpose(0, 2, 1, 3).reshape(B, Lq, h * d), probs

    def output(self, ctx):
        """The output projection (with the folded value bias on the fused path)."""
        folded = self.folded()
        if folded is None:
            return self.out(ctx)
        return mx.addmm(folded[2], ctx, folded[3])

    def __call__(self, x, bias, return_attention=False, kv=None):
        """Queries from ``x`` (B, Lq, D); keys and values from ``kv`` (B, L, D), default ``x``;
        ``bias`` broadcasts against (B, heads, Lq, L), or None when no key is padding.
        Returns (out (B, Lq, D), probs or None)."""
        ctx, attn = self.core(*self.project(x, kv), bias, return_attention)
        return self.output(ctx), attn


class TransformerLayer(nn.Module):
    """Post-norm BERT layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    Called directly on a multi-core CPU, the layer's rows are split over
    :func:`variants.parallel.streams` (the batch when B >= 2, else the query positions, each
    half attending to all keys) and the halves run at once on separate MLX streams; every row's
    arithmetic is unchanged. :class:`BertEncoder` also uses :meth:`forward_sharded` (B = 1) and
    :meth:`_forward_packed` (packed batches).
    """

    def __init__(self, args):
        super().__init__()
        self.attention = Attention(args)
        self.attention_norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.intermediate = nn.Linear(args.hidden_size, args.intermediate_size)
        self.output = nn.Linear(args.intermediate_size, args.hidden_size)
        self.output_norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.hidden_act = args.hidden_act  # a name, so the module deep-copies
        self._shards = _Folded()
        self._mlp = _Folded()

    def mlp_weights(self):
        """``(w_i_t (D, F), b_i (F,), w_u_t (F, D), b_u (D,))``, the MLP's weights transposed
        (as :meth:`Attention.folded`), or None when either Linear is not a plain biased
        ``nn.Linear`` (a variant replaced it)."""
        if not (_plain_linear(self.intermediate) and _plain_linear(self.output)):
            self._mlp.clear()
            return None
        i, u = self.intermediate, self.output
        return self._mlp.get((i.weight, i.bias, u.weight, u.bias),
                             lambda: (_t(i.weight), i.bias, _t(u.weight), u.bias))

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
        return self.mlp_out(ACTIVATIONS[self.hidden_act](self.mlp_in(x)))

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
                parts.append(ACTIVATIONS[self.hidden_act](mx.addmm(b_i, x, w_i)) @ w_u)
        with mx.stream(ss[0]):
            return self.output_norm(x + (sum(parts[1:], parts[0]) + self.output.bias))

    def __call__(self, x, bias, return_attention=False):
        """``x`` (B, L, D) float32, ``bias`` (B or 1, 1, 1, L) additive key bias or None (no
        padding) -> (x', probs)."""
        ss = parallel.streams()
        B, L, _ = x.shape
        if len(ss) == 1 or B * L < parallel.MIN_ROWS or (B == 1 and L < len(ss)):
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
        """The layer on one part of a packed batch (:mod:`variants.packing`): ``x`` (n, D) the
        part's real tokens -> (n, D); the attention core runs on the part's (B, part.L) layout."""
        att = self.attention
        x = self.attention_norm(x + att.output(att.packed_core(*att.packed_project(x, part), part)))
        return self.output_norm(x + self.mlp(x))

    def _forward(self, x, bias, return_attention=False, kv=None):
        a, attn = self.attention(x, bias, return_attention, kv)
        x = self.attention_norm(x + a)
        x = self.output_norm(x + self.mlp(x))
        return x, attn


@dataclass
class EncoderOutput:
    """``last_hidden`` (B, L, D) float32; ``hidden_states``: embeddings + each layer (or None);
    ``attentions``: each layer's (B, heads, L, L) probabilities (or None).

    Padded positions of ``last_hidden`` hold zeros when the batch ran packed
    (:mod:`variants.packing`), else whatever the layers computed there: only real positions
    carry meaning either way."""

    last_hidden: mx.array
    hidden_states: list = None
    attentions: list = None


def attention_bias(attention_mask, dtype=mx.float32):
    """(B, L) 0/1 mask -> (B, 1, 1, L) additive bias: 0 for real keys, MASK_BIAS for padding
    (half the dtype's largest finite value when that is smaller: -1e9 is -inf in float16, and
    0 · -inf would be NaN for real keys)."""
    m = attention_mask.astype(dtype)
    big = min(-MASK_BIAS, float(mx.finfo(dtype).max) / 2)
    return ((1.0 - m) * -big)[:, None, None, :]


class BertEncoder(nn.Module):
    """BERT encoder (Devlin et al. 2019), layout as mlx-examples' bert/model.py.

    Call with ``input_ids`` (B, L) int32, ``attention_mask`` (B, L) 0/1, optional
    ``token_type_ids`` (B, L) int32; returns :class:`EncoderOutput`.
    ``layers`` is a plain list so variants can run, skip or replace layers one by one.
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.layers = [TransformerLayer(args) for _ in range(args.num_hidden_layers)]

    def embed(self, input_ids, token_type_ids=None):
        B, L = input_ids.shape
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        position_ids = mx.broadcast_to(mx.arange(L), (B, L))
        return self.embeddings(input_ids, token_type_ids, position_ids)

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
        """A :class:`variants.packing.Plan` for ``mask`` (B, L) NumPy, split by sequences over
        the streams, when the batch has padding (``bias`` not None) and enough of it, else None."""
        if bias is None or parallel.whole_batches():
            return None
        order = packing.longest_first(mask)
        return packing.plan(mask, bias, packing.balanced_bounds(mask.sum(axis=1)[order],
                                                                self._row_parts(mask)),
                            order=order)

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *,
                 output_hidden_states=False, output_attentions=False):
        x = self.embed(input_ids, token_type_ids)
        mask = np.array(attention_mask)
        bias = None if mask.all() else attention_bias(attention_mask, x.dtype)  # None: no padding
        if not (output_hidden_states or output_attentions or parallel.whole_batches()):
            B, L = mask.shape
            shards = self._head_split(mask)
            if shards is not None:  # too few sequences to split: split heads
                for layer, sh in zip(self.layers, shards):
                    x = layer.forward_sharded(x, bias, sh)
                return EncoderOutput(x)
            p = self._packing_plan(mask, bias)
            if p is not None:
                return EncoderOutput(p.unpack(
                    self._stacks(p.split(x), TransformerLayer._forward_packed)))
            k = self._row_parts(mask)
            if k > 1:
                cuts = parallel.bounds(B, k)
                return EncoderOutput(self._stacks(
                    [(bias if bias is None else bias[a:b], x[a:b]) for a, b in cuts],
                    lambda layer, h, bb: layer._forward(h, bb)[0]))
        hidden = [x] if output_hidden_states else None
        attns = [] if output_attentions else None
        for layer in self.layers:
            x, attn = layer(x, bias, output_attentions)
            if output_hidden_states:
                hidden.append(x)
            if output_attentions:
                attns.append(attn)
        return EncoderOutput(x, hidden, attns)

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
        return p.unpack(self._stacks(p.split(x), TransformerLayer._forward_packed, [layer]))

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


def mean_pool(hidden, attention_mask, normalize=True):
    """Mean of ``hidden`` (B, L, D) over real tokens of ``attention_mask`` (B, L), then L2-normalise
    (sentence-transformers' Pooling(mean) + Normalize). Returns (B, D) float32."""
    m = attention_mask.astype(hidden.dtype)[..., None]
    pooled = (hidden * m).sum(axis=1) / mx.maximum(m.sum(axis=1), 1e-9)
    if normalize:
        pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled


_RENAMES = (
    ("encoder.layer.", "layers."),
    ("attention.self.query", "attention.query"),
    ("attention.self.key", "attention.key"),
    ("attention.self.value", "attention.value"),
    ("attention.output.dense", "attention.out"),
    ("attention.output.LayerNorm", "attention_norm"),
    ("intermediate.dense", "intermediate"),
    ("output.dense", "output"),
    ("output.LayerNorm", "output_norm"),
    ("embeddings.LayerNorm", "embeddings.norm"),
)


def sanitize(weights):
    """Rename Hugging Face BERT weight names to this module's names (pure, no I/O).

    Drops ``embeddings.position_ids`` (a buffer) and the unused ``pooler.*``; strips a leading
    ``bert.`` prefix.
    """
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("bert.")
        if name.startswith("pooler.") or name.endswith("position_ids"):
            continue
        for old, new in _RENAMES:
            name = name.replace(old, new)
        out[name] = w
    return out

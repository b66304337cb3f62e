"""The MPNet encoder in MLX (Song et al. 2020, "MPNet: Masked and Permuted Pre-training for
Language Understanding"; Hugging Face ``MPNetModel``, eager attention): BERT's post-norm layers
(:class:`variants.arch.encoder.Attention` projections, layer norms, MLP) with a T5-style relative
position bias added to every layer's attention scores, one bias table shared by all layers
(``relative_attention_bias``, (buckets, heads)), and RoBERTa-style absolute positions counted
from ``padding_idx + 1`` with ``padding_idx`` = 1 (transformers hard-codes it) over the ids that
are not 1.

Per-layer interface (as :class:`variants.arch.encoder.BertEncoder`): :meth:`MPNetEncoder.embed`,
``layers``, :meth:`MPNetEncoder.context`, :meth:`MPNetEncoder.apply_layer`,
:meth:`MPNetEncoder.finish`; the context's relative positions follow each token's original
position (:meth:`MPNetContext.take_tokens`: a pruned batch keeps its tokens' distances). The
layers run on the MLX path, split by sequences over the streams
(:mod:`variants.arch.row_streams`); the BERT fast paths (compiled layer, packing) carry only a
key padding bias and are not used.
"""

import inspect
import math
from dataclasses import dataclass
from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.arch import row_streams
from variants.arch.encoder import (ACTIVATIONS, Attention, EncoderOutput, LayerNorm, _keys_first,
                                   attention_bias, check_ids, check_mask)
from variants.runtime import fast_ops
from variants.runtime.derived import DerivedWeights
from variants.runtime.fused import FusedMLP

#: transformers' MPNet: ``padding_idx`` of the embeddings (fixed, whatever config.json says)
PADDING_IDX = 1
#: ``MPNetEncoder.compute_position_bias``'s bucketing (its defaults; the config's
#: ``relative_attention_num_buckets`` only sizes the table)
NUM_BUCKETS, MAX_DISTANCE = 32, 128


@dataclass
class MPNetArgs:
    """MPNet configuration, read from a Hugging Face ``config.json`` (defaults as
    ``MPNetConfig``)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    relative_attention_num_buckets: int = 32
    pad_token_id: int = 1
    model_type: str = "mpnet"

    @classmethod
    def from_dict(cls, params):
        """Build from a config dict, dropping keys this encoder does not use."""
        names = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in params.items() if k in names})

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; "
                             f"use one of {sorted(ACTIVATIONS)}")
        if self.relative_attention_num_buckets < NUM_BUCKETS:
            raise ValueError(f"relative_attention_num_buckets {self.relative_attention_num_buckets}"
                             f" is below the {NUM_BUCKETS} buckets MPNet's bias indexes; use a "
                             f"checkpoint saved with at least {NUM_BUCKETS}")

    @property
    def position_cap(self):
        """The longest input the position table allows: positions run from
        ``PADDING_IDX + 1``, so ``max_position_embeddings - 2``."""
        return self.max_position_embeddings - PADDING_IDX - 1


def relative_position_bucket(relative_position):
    """T5's bucket of each ``relative_position`` (key - query, int array, any shape) as
    transformers' ``MPNetEncoder.relative_position_bucket`` computes it (32 buckets, max
    distance 128; the log in float32 and truncated, so the buckets are the same integers):
    half the buckets for keys before the query, 8 exact distances, then logarithmic up to 128.
    Returns int64, same shape."""
    n = -np.asarray(relative_position, np.int64)
    half = NUM_BUCKETS // 2
    ret = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    exact = half // 2
    with np.errstate(divide="ignore", invalid="ignore"):  # n = 0: log 0, never picked
        large = exact + (np.log(n.astype(np.float32) / np.float32(exact))
                         / np.float32(math.log(MAX_DISTANCE / exact))
                         * np.float32(half - exact)).astype(np.int64)
    return ret + np.where(n < exact, n, np.minimum(large, half - 1))


@lru_cache(maxsize=16)
def bucket_table(span):
    """(2 * span + 1,) int32: the bucket of each relative position -span..span (index
    ``d + span``)."""
    return mx.array(relative_position_bucket(np.arange(-span, span + 1)).astype(np.int32))


class Embeddings(nn.Module):
    """Word + absolute position embeddings (no token types) -> LayerNorm."""

    def __init__(self, args):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids, position_ids):
        return self.norm(self.word_embeddings(input_ids)
                         + self.position_embeddings(position_ids))


class MPNetContext(row_streams.RowParts):
    """What an MPNet layer needs besides ``x``: ``mask`` (B, L) int32 0/1, ``key_bias``
    (B, 1, 1, L) additive padding bias (None when no key is padding) and ``position_bias``
    (1 or B, heads, L, L) float32: ``table(bucket(pos_k - pos_q))`` for the tokens' positions
    ``positions`` (B, L) int (None: slots 0..L-1, as transformers; the bias is then one
    (1, heads, L, L) for the batch). ``table``: the encoder's ``relative_attention_bias``."""

    def __init__(self, table, attention_mask, positions=None):
        self.table = table
        self.mask = mx.array(attention_mask).astype(mx.int32)
        self.key_bias = None if np.array(self.mask).all() else attention_bias(self.mask)
        self.positions = None if positions is None else mx.array(positions).astype(mx.int32)
        L = self.mask.shape[1]
        if self.positions is None:
            p = mx.arange(L, dtype=mx.int32)
            rel = p[None, :] - p[:, None]  # (L, L): key - query
            span = L
        else:
            p = self.positions
            rel = p[:, None, :] - p[:, :, None]  # (B, L, L)
            span = max(int(mx.abs(p).max().item()), 1)
        buckets = mx.take(bucket_table(span), rel + span)
        bias = mx.moveaxis(table(buckets), -1, -3)  # (..., L, L, heads) -> (..., heads, L, L)
        self.position_bias = bias if bias.ndim == 4 else bias[None]

    @property
    def position_bias_t(self):
        """``position_bias`` with its last two axes swapped, contiguous (keys first, the
        layout :class:`MPNetAttention` adds it in), built once."""
        if "_bias_t" not in self.__dict__:
            self._bias_t = mx.contiguous(mx.swapaxes(self.position_bias, -1, -2))
        return self._bias_t

    def take_rows(self, idx):
        """The context of rows ``idx`` (int array) of the batch."""
        idx = mx.array(idx)
        return MPNetContext(self.table, self.mask[idx],
                            None if self.positions is None else self.positions[idx])

    def take_tokens(self, index, new_mask):
        """The context after keeping token slots ``index`` (B, L') int of each row, with
        ``new_mask`` (B, L') 0/1: the relative positions follow the kept tokens."""
        index = mx.array(index).astype(mx.int32)
        pos = (mx.broadcast_to(mx.arange(self.mask.shape[1], dtype=mx.int32), self.mask.shape)
               if self.positions is None else self.positions)
        return MPNetContext(self.table, new_mask, mx.take_along_axis(pos, index, axis=1))


class MPNetAttention(Attention):
    """BERT's self-attention (:class:`variants.arch.encoder.Attention`: q, k, v, o projections,
    the fused weights when they are plain Linears; folding the key bias away stays exact, it
    shifts a query's scores by one constant) whose scores also get the relative position bias:
    called as ``attn(x, ctx, return_attention)`` with an :class:`MPNetContext`."""

    def core(self, q, k, v, ctx, return_attention=False):
        """softmax(q kᵀ + position_bias + key_bias) v -> (ctx (B, Lq, D), probs or None)."""
        B, h, Lq, d = q.shape
        if return_attention:
            probs = fast_ops.masked_softmax(q @ k.transpose(0, 1, 3, 2) + ctx.position_bias,
                                            ctx.key_bias)
            return (probs @ v).transpose(0, 2, 1, 3).reshape(B, Lq, h * d), probs
        # BERT's layout (Attention.core): scores transposed, keys on axis -2, the row sums from
        # e^T @ [v, 1]; the bias transposed once per context (contiguous: ~2x faster adds)
        e = fast_ops.softmax_parts(k @ q.transpose(0, 1, 3, 2) + ctx.position_bias_t,
                                   _keys_first(ctx.key_bias), total=False, axis=-2)
        v1 = mx.concatenate([v, mx.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
        r = e.transpose(0, 1, 3, 2) @ v1
        out = r[..., :d] / r[..., d:]
        return out.transpose(0, 2, 1, 3).reshape(B, Lq, h * d), None


class MPNetLayer(FusedMLP, nn.Module):
    """Post-norm layer: x = LN(x + Attn(x, position bias)); x = LN(x + FFN(x)), with BERT's
    parameter names (``attention.query`` ... ``output_norm``)."""

    def __init__(self, args):
        super().__init__()
        self.attention = MPNetAttention(args)
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
        """``x`` (B, L, D) float32, ``ctx`` an :class:`MPNetContext` -> (x', probs (B, heads,
        L, L) or None)."""
        a, probs = self.attention(x, ctx, return_attention)
        x = self.attention_norm(x + a)
        return self.output_norm(x + self.mlp(x)), probs


class MPNetEncoder(nn.Module):
    """MPNet encoder. Call with ``input_ids`` (B, L) int32, ``attention_mask`` (B, L) 0/1
    (``token_type_ids`` is accepted and ignored: MPNet has none); returns
    :class:`variants.arch.encoder.EncoderOutput` (``hidden_states``: the embeddings and each
    layer's output, as transformers)."""

    def __init__(self, args: MPNetArgs):
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.layers = [MPNetLayer(args) for _ in range(args.num_hidden_layers)]
        self.relative_attention_bias = nn.Embedding(args.relative_attention_num_buckets,
                                                    args.num_attention_heads)

    def embed(self, input_ids, token_type_ids=None):
        """``input_ids`` (B, L) int32 -> (B, L, D). Position ids: cumsum(real) * real + 1 with
        real = ids != 1 (transformers' ``create_position_ids_from_input_ids`` with
        ``padding_idx`` 1). Raises ValueError for an id outside the table or L above
        :attr:`MPNetArgs.position_cap`."""
        check_ids(input_ids, self.args.vocab_size, self.args.position_cap)
        real = (input_ids != PADDING_IDX).astype(mx.int32)
        return self.embeddings(input_ids, mx.cumsum(real, axis=1) * real + PADDING_IDX)

    def context(self, attention_mask, positions=None):
        """An :class:`MPNetContext` for ``attention_mask`` (B, L) 0/1 and the tokens'
        ``positions`` (B, L) int (default: slots 0..L-1)."""
        return MPNetContext(self.relative_attention_bias, attention_mask, positions)

    def apply_layer(self, i, x, ctx, return_attention=False):
        """Layer ``i`` on ``x`` (B, L, D) -> (x (B, L, D), probs (B, heads, L, L) or None);
        without probabilities split by sequences over the streams."""
        if return_attention:
            return self.layers[i](x, ctx, True)
        return row_streams.run([self.layers[i]], x, ctx), None

    def finish(self, x):
        """MPNet has no final norm (identity)."""
        return x

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *,
                 output_hidden_states=False, output_attentions=False):
        x = self.embed(input_ids)
        check_mask(input_ids, attention_mask)
        ctx = self.context(attention_mask)
        if not (output_hidden_states or output_attentions):
            return EncoderOutput(row_streams.run(self.layers, x, ctx))
        hidden = [x] if output_hidden_states else None
        attns = [] if output_attentions else None
        for layer in self.layers:
            x, probs = layer(x, ctx, output_attentions)
            if output_hidden_states:
                hidden.append(x)
            if output_attentions:
                attns.append(probs)
        return EncoderOutput(x, hidden, attns)


#: transformers' MPNet names -> this module's (after the ``mpnet.`` prefix is stripped)
RENAMES = (
    ("encoder.layer.", "layers."),
    ("encoder.relative_attention_bias.", "relative_attention_bias."),
    ("attention.attn.q.", "attention.query."),
    ("attention.attn.k.", "attention.key."),
    ("attention.attn.v.", "attention.value."),
    ("attention.attn.o.", "attention.out."),
    ("attention.LayerNorm.", "attention_norm."),
    ("intermediate.dense.", "intermediate."),
    ("output.dense.", "output."),
    ("output.LayerNorm.", "output_norm."),
    ("embeddings.LayerNorm.", "embeddings.norm."),
)


def sanitize(weights):
    """transformers' MPNet weight names -> this module's (pure, no I/O): strips ``mpnet.``,
    drops ``embeddings.position_ids`` (a buffer), the pooler and the heads (``pooler.*``,
    ``classifier.*``, ``lm_head.*``; :mod:`variants.checkpoints.hf_mpnet` reads the classifier)."""
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("mpnet.")
        if name.startswith(("pooler.", "classifier.", "lm_head.")) or name.endswith("position_ids"):
            continue
        for old, new in RENAMES:
            name = name.replace(old, new)
        out[name] = w
    return out

"""The DeBERTa-v2 / v3 encoder in MLX (He et al. 2021, "DeBERTa"; He et al. 2023, "DeBERTaV3";
Hugging Face ``DebertaV2Model``, model_type ``deberta-v2``, which mDeBERTa-v3 shares; eager
path): embeddings (word, optional absolute positions, optional token types, optional
``embed_proj``) -> LayerNorm -> post-norm layers with disentangled attention
(:mod:`variants.arch.deberta_attention`) over one relative-embedding table shared by all layers
(``rel_embeddings``, layer-normed when ``norm_rel_ebd`` has ``layer_norm``), and DeBERTa-v2's
convolution after the first layer when ``conv_kernel_size`` > 0.

Per-layer interface (as :class:`variants.arch.encoder.BertEncoder`): :meth:`DebertaEncoder.embed`,
``layers``, :meth:`DebertaEncoder.context`, :meth:`DebertaEncoder.apply_layer` (layer 0 includes
the convolution), :meth:`DebertaEncoder.finish`; the context's relative positions follow each
token's original position (:meth:`DebertaContext.take_tokens`). Layers run on the MLX path, split
by sequences over the streams (:mod:`variants.arch.row_streams`).
"""

import inspect
from dataclasses import dataclass, field
from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.arch import row_streams
from variants.arch.deberta_attention import DebertaLayer, log_bucket_position
from variants.arch.encoder import (ACTIVATIONS, EncoderOutput, LayerNorm, attention_bias,
                                   check_ids, check_mask)

#: activations a DeBERTa pooler or convolution may name (transformers' ACT2FN keys)
HEAD_ACTIVATIONS = dict(ACTIVATIONS, tanh=mx.tanh)


@dataclass
class DebertaArgs:
    """DeBERTa-v2 configuration, read from a Hugging Face ``config.json`` (defaults as
    ``DebertaV2Config`` and the ``getattr`` defaults of ``modeling_deberta_v2.py``).
    ``pos_att_type`` may be a list or a ``"p2c|c2p"`` string (as transformers reads it)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    hidden_act: str = "gelu"
    relative_attention: bool = False
    max_relative_positions: int = -1
    position_buckets: int = -1
    pos_att_type: list = field(default_factory=list)
    position_biased_input: bool = True
    norm_rel_ebd: str = "none"
    share_att_key: bool = False
    embedding_size: int = None
    attention_head_size: int = None
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    pooler_hidden_act: str = "gelu"
    pad_token_id: int = 0
    model_type: str = "deberta-v2"

    @classmethod
    def from_dict(cls, params):
        """Build from a config dict, dropping keys this encoder does not use."""
        names = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in params.items() if k in names and v is not None})

    def __post_init__(self):
        if isinstance(self.pos_att_type, str):
            self.pos_att_type = [x.strip() for x in self.pos_att_type.lower().split("|")]
        self.pos_att_type = list(self.pos_att_type or [])
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.attention_head_size not in (None, self.hidden_size // self.num_attention_heads):
            raise ValueError(f"attention_head_size {self.attention_head_size} x "
                             f"{self.num_attention_heads} heads is not hidden_size "
                             f"{self.hidden_size}; only heads that fill hidden_size are supported")
        for key, table in (("hidden_act", ACTIVATIONS), ("pooler_hidden_act", HEAD_ACTIVATIONS),
                           ("conv_act", HEAD_ACTIVATIONS)):
            if getattr(self, key) not in table:
                raise ValueError(f"{key} {getattr(self, key)!r} is not supported; use one of "
                                 f"{sorted(table)}")
        if self.conv_kernel_size > 0 and self.conv_kernel_size % 2 == 0:
            raise ValueError(f"conv_kernel_size {self.conv_kernel_size} is even; DeBERTa's "
                             "convolution keeps the length only for odd kernels")

    @property
    def max_relative(self):
        """``max_relative_positions``, or ``max_position_embeddings`` when below 1."""
        return self.max_relative_positions if self.max_relative_positions >= 1 \
            else self.max_position_embeddings

    @property
    def att_span(self):
        """S: ``position_buckets`` when > 0, else :attr:`max_relative`; the table has 2S rows."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative

    @property
    def rel_layer_norm(self):
        """Whether ``norm_rel_ebd`` asks for a LayerNorm on the relative table."""
        return "layer_norm" in [x.strip() for x in str(self.norm_rel_ebd).lower().split("|")]


@lru_cache(maxsize=32)
def relative_table(span, buckets, max_relative):
    """(2 * span + 1,) int64 NumPy: the (bucketed) relative position of each distance
    -span..span (index ``d + span``); raw distances when ``buckets`` <= 0."""
    d = np.arange(-span, span + 1)
    if buckets > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            d = log_bucket_position(d, buckets, max_relative)
    return d


class DebertaContext(row_streams.RowParts):
    """What a DeBERTa layer needs besides ``x``, for ``mask`` (B, L) 0/1 and the tokens'
    ``positions`` (B, L) int (None: slots 0..L-1, as transformers):

    - ``key_bias`` (B, 1, 1, L): MASK_BIAS on padded keys (None when none is padded);
    - ``rel_rows`` (n, D): the rows lo..hi of the (normed) relative table that the positions
      reach, ``c2p_index`` / ``p2c_index`` (1 or B, 1, L, L) int32 into them:
      clip(±δ + S, 0, 2S - 1) - lo with δ[i, j] = bucket(pos_i - pos_j) (None without
      relative attention).
    """

    def __init__(self, encoder, attention_mask, positions=None):
        self.encoder = encoder
        a = encoder.args
        self.mask = mx.array(attention_mask).astype(mx.int32)
        self.key_bias = None if np.array(self.mask).all() else attention_bias(self.mask)
        self.positions = None if positions is None else mx.array(positions).astype(mx.int32)
        self.rel_rows = self.c2p_index = self.p2c_index = None
        if not a.relative_attention:
            return
        L = self.mask.shape[1]
        if self.positions is None:
            p = mx.arange(L, dtype=mx.int32)
            d, span = p[:, None] - p[None, :], L  # (L, L) query - key
        else:
            p = self.positions
            d, span = p[:, :, None] - p[:, None, :], max(int(mx.abs(p).max().item()), 1)
        table = relative_table(span, a.position_buckets, a.max_relative)
        S, reach = a.att_span, int(np.abs(table).max())
        lo, hi = max(S - reach, 0), min(S + reach, 2 * S - 1)
        rel = mx.take(mx.array(table.astype(np.int32)), d + span)
        c2p = mx.clip(rel + S, 0, 2 * S - 1) - lo
        p2c = mx.clip(-rel + S, 0, 2 * S - 1) - lo
        self.c2p_index, self.p2c_index = ((t if t.ndim == 3 else t[None])[:, None]
                                          for t in (c2p, p2c))
        rows = encoder.rel_embeddings(mx.arange(lo, hi + 1))
        self.rel_rows = encoder.rel_norm(rows) if a.rel_layer_norm else rows

    def take_rows(self, idx):
        """The context of rows ``idx`` (int array) of the batch."""
        idx = mx.array(idx)
        return DebertaContext(self.encoder, self.mask[idx],
                              None if self.positions is None else self.positions[idx])

    def take_tokens(self, index, new_mask):
        """The context after keeping token slots ``index`` (B, L') int of each row, with
        ``new_mask`` (B, L') 0/1: the relative positions follow the kept tokens."""
        index = mx.array(index).astype(mx.int32)
        pos = (mx.broadcast_to(mx.arange(self.mask.shape[1], dtype=mx.int32), self.mask.shape)
               if self.positions is None else self.positions)
        return DebertaContext(self.encoder, new_mask, mx.take_along_axis(pos, index, axis=1))


class Embeddings(nn.Module):
    """Word (+ absolute position when ``position_biased_input``) (+ token type when
    ``type_vocab_size`` > 0) embeddings of width ``embedding_size`` -> ``embed_proj`` (no bias)
    when that is not ``hidden_size`` -> LayerNorm."""

    def __init__(self, args):
        super().__init__()
        E = args.embedding_size
        self.word_embeddings = nn.Embedding(args.vocab_size, E)
        if args.position_biased_input:
            self.position_embeddings = nn.Embedding(args.max_position_embeddings, E)
        if args.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(args.type_vocab_size, E)
        if E != args.hidden_size:
            self.embed_proj = nn.Linear(E, args.hidden_size, bias=False)
        self.norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids, token_type_ids):
        x = self.word_embeddings(input_ids)
        if "position_embeddings" in self:
            x = x + self.position_embeddings(mx.arange(input_ids.shape[1]))
        if "token_type_embeddings" in self:
            x = x + self.token_type_embeddings(token_type_ids)
        if "embed_proj" in self:
            x = self.embed_proj(x)
        return self.norm(x)


class Convolution(nn.Module):
    """DeBERTa-v2's ``ConvLayer`` after the first layer: LN(layer output + act(conv1d(layer
    input))) on real tokens, padded ones zeroed. ``weight`` in PyTorch's (D, D / groups, k)
    layout (the checkpoint's), ``bias`` (D,)."""

    def __init__(self, args):
        super().__init__()
        D, k = args.hidden_size, args.conv_kernel_size
        self.conv = nn.Module()
        self.conv.weight = mx.zeros((D, D // args.conv_groups, k))
        self.conv.bias = mx.zeros((D,))
        self.norm = LayerNorm(D, eps=args.layer_norm_eps)
        self.groups, self.act = args.conv_groups, args.conv_act

    def __call__(self, layer_input, layer_output, mask):
        m = mask.astype(layer_output.dtype)[..., None]
        w = mx.swapaxes(self.conv.weight, 1, 2)  # (D, k, D / groups): MLX's layout
        out = mx.conv1d(layer_input * m, w, padding=(w.shape[1] - 1) // 2, groups=self.groups)
        out = HEAD_ACTIVATIONS[self.act]((out + self.conv.bias) * m)
        return self.norm(layer_output + out) * m


class _FirstWithConv:
    """Layer 0 followed by the convolution, called as a layer: ``(x, ctx) -> (x', probs)``."""

    def __init__(self, layer, conv):
        self.layer, self.conv = layer, conv

    def __call__(self, x, ctx, return_attention=False):
        y, probs = self.layer(x, ctx, return_attention)
        return self.conv(x, y, ctx.mask), probs


class DebertaEncoder(nn.Module):
    """DeBERTa-v2 / v3 encoder. Call with ``input_ids`` (B, L) int32, ``attention_mask`` (B, L)
    0/1, optional ``token_type_ids`` (B, L); returns :class:`variants.arch.encoder.EncoderOutput`
    (``hidden_states``: the embeddings and each layer's output, as transformers; padded
    positions of the embeddings are not zeroed here, only real positions carry meaning)."""

    def __init__(self, args: DebertaArgs):
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.layers = [DebertaLayer(args) for _ in range(args.num_hidden_layers)]
        if args.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * args.att_span, args.hidden_size)
        if args.rel_layer_norm:
            self.rel_norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        if args.conv_kernel_size > 0:
            self.conv = Convolution(args)

    def _layer(self, i):
        if i == 0 and "conv" in self:
            return _FirstWithConv(self.layers[0], self.conv)
        return self.layers[i]

    def embed(self, input_ids, token_type_ids=None):
        """``input_ids`` (B, L) int32 -> (B, L, D). Raises ValueError for an id outside the
        table or, with absolute positions, L above ``max_position_embeddings``."""
        a = self.args
        check_ids(input_ids, a.vocab_size,
                  a.max_position_embeddings if a.position_biased_input else None)
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        return self.embeddings(input_ids, token_type_ids)

    def context(self, attention_mask, positions=None):
        """A :class:`DebertaContext` for ``attention_mask`` (B, L) 0/1 and the tokens'
        ``positions`` (B, L) int (default: slots 0..L-1)."""
        return DebertaContext(self, attention_mask, positions)

    def apply_layer(self, i, x, ctx, return_attention=False):
        """Layer ``i`` (with the convolution after layer 0) on ``x`` (B, L, D) -> (x, probs
        (B, heads, L, L) or None); without probabilities split by sequences over the streams."""
        if return_attention:
            return self._layer(i)(x, ctx, True)
        return row_streams.run([self._layer(i)], x, ctx), None

    def finish(self, x):
        """DeBERTa has no final norm (identity)."""
        return x

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *,
                 output_hidden_states=False, output_attentions=False):
        x = self.embed(input_ids, token_type_ids)
        check_mask(input_ids, attention_mask)
        ctx = self.context(attention_mask)
        if not (output_hidden_states or output_attentions):
            stack = [self._layer(i) for i in range(len(self.layers))]
            return EncoderOutput(row_streams.run(stack, x, ctx))
        hidden = [x] if output_hidden_states else None
        attns = [] if output_attentions else None
        for i in range(len(self.layers)):
            x, probs = self._layer(i)(x, ctx, output_attentions)
            if output_hidden_states:
                hidden.append(x)
            if output_attentions:
                attns.append(probs)
        return EncoderOutput(x, hidden, attns)

    def load_weights(self, weights, strict=True):
        """``nn.Module.load_weights``, ignoring ``embeddings.position_embeddings`` when the
        config has no absolute positions (``position_biased_input`` false), as transformers
        does (``_keys_to_ignore_on_load_unexpected``)."""
        if isinstance(weights, list) and not self.args.position_biased_input:
            weights = [(k, v) for k, v in weights
                       if not k.startswith("embeddings.position_embeddings.")]
        return super().load_weights(weights, strict=strict)


#: transformers' DeBERTa-v2 names -> this module's (after the ``deberta.`` prefix is stripped)
RENAMES = (
    ("encoder.layer.", "layers."),
    ("encoder.rel_embeddings.", "rel_embeddings."),
    ("encoder.LayerNorm.", "rel_norm."),
    ("encoder.conv.LayerNorm.", "conv.norm."),
    ("encoder.conv.conv.", "conv.conv."),
    ("attention.self.query_proj.", "attention.query."),
    ("attention.self.key_proj.", "attention.key."),
    ("attention.self.value_proj.", "attention.value."),
    ("attention.self.pos_key_proj.", "attention.pos_key."),
    ("attention.self.pos_query_proj.", "attention.pos_query."),
    ("attention.output.dense.", "attention.out."),
    ("attention.output.LayerNorm.", "attention_norm."),
    ("intermediate.dense.", "intermediate."),
    ("output.dense.", "output."),
    ("output.LayerNorm.", "output_norm."),
    ("embeddings.LayerNorm.", "embeddings.norm."),
)

_HEADS = ("pooler.", "classifier.", "lm_predictions.", "mask_predictions.", "cls.", "lm_head.")


def sanitize(weights):
    """transformers' DeBERTa-v2 weight names -> this module's (pure, no I/O): strips
    ``deberta.``, drops ``position_ids`` buffers and the heads (``pooler.*``, ``classifier.*``,
    the MLM / RTD heads; :mod:`variants.checkpoints.hf_deberta` reads the classifier)."""
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("deberta.")
        if name.startswith(_HEADS) or name.endswith("position_ids"):
            continue
        for old, new in RENAMES:
            name = name.replace(old, new)
        out[name] = w
    return out

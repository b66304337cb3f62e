"""A BERT-family encoder in MLX (post-norm layers), with per-layer access for later variants."""

import inspect
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.runtime import fast_ops, fused_layer, parallel
from variants.runtime.derived import DerivedWeights, plain_linear, transposed
from variants.runtime.fused import FusedAttention, FusedMLP
from variants.runtime.streams import StreamEncoder, StreamLayer

#: the names bench/ scripts and older code use for the derived-weight cache and its helpers
_Folded, _plain_linear, _t = DerivedWeights, plain_linear, transposed

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
    pad_token_id: int = 0

    @property
    def roberta_positions(self):
        """True for RoBERTa / XLM-R: position ids count real tokens from ``pad_token_id + 1``
        (Hugging Face ``create_position_ids_from_input_ids``)."""
        return self.model_type in ("roberta", "xlm-roberta")

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
    :func:`variants.runtime.fast_ops.layer_norm`: MLX's fused layer norm has no CPU kernel."""

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


def check_ids(input_ids, vocab_size, max_positions=None):
    """Refuse token ids the embedding table does not have, before any gather: MLX's
    ``nn.Embedding`` does not check its indices (an id far past the table ends the process with
    SIGSEGV; one just past it reads another array's memory). ``input_ids`` (B, L) int;
    ``max_positions``: the longest L a learned position table allows (None: no table).

    Raises ValueError naming the bad id (or length) and the limit, e.g. a tokenizer with added
    tokens that the checkpoint's ``config.json`` ``vocab_size`` does not count."""
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (B, L) with L >= 1, got shape "
                         f"{tuple(input_ids.shape)}; every text has at least one token "
                         "([CLS]/[SEP] included)")
    if input_ids.size:
        lo, hi = (int(v) for v in mx.stack([input_ids.min(), input_ids.max()]).tolist())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the embedding table (vocab_size "
                             f"{vocab_size}: ids 0..{vocab_size - 1}); the tokenizer and the "
                             "checkpoint's config.json disagree, use the checkpoint's own "
                             "tokenizer")
    if max_positions is not None and input_ids.shape[-1] > max_positions:
        raise ValueError(f"sequence length {input_ids.shape[-1]} exceeds the model's "
                         f"{max_positions} positions (max_position_embeddings); truncate the "
                         "texts (the tokenizer's max_length)")


def check_mask(input_ids, attention_mask):
    """Refuse an ``attention_mask`` whose shape is not ``input_ids``' (B, L): the fast paths
    would otherwise read it laid over the wrong rows (ModernBERT's compiled op ran on a (3, 4)
    mask for (2, 6) ids). Raises ValueError naming both shapes."""
    got, want = tuple(np.shape(attention_mask)), tuple(input_ids.shape)
    if got != want:
        raise ValueError(f"attention_mask must have input_ids' shape (B, L) = {want}, got "
                         f"{got}; pass the mask the tokenizer made for the same batch")


def _keys_first(bias):
    """An additive attention bias laid out for (…, L keys, Lq queries) scores: the last two axes
    swapped; a (L,) key bias becomes (L, 1); None and scalars pass through."""
    if bias is None or bias.ndim == 0:
        return bias
    return bias[:, None] if bias.ndim == 1 else mx.swapaxes(bias, -1, -2)


class Attention(FusedAttention, nn.Module):
    """Multi-head self-attention (BERT), queries from ``x``, keys and values from ``kv``.

    When query, key, value and out are plain biased ``nn.Linear`` (the reference; quantised or
    low-rank variants replace them and take the unfused path), the forward uses weights folded
    once per weight set (:class:`variants.runtime.fused.FusedAttention`). The softmax is left unnormalised until after ``probs @ v`` (:func:`fast_ops.softmax_parts`).
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
        self._folded = DerivedWeights()

    def heads(self, t, B, L):
        """(B·L, D') or (B, L, D') -> (B, D' / head_dim heads, L, head_dim)."""
        return t.reshape(B, L, t.shape[-1] // self.head_dim, self.head_dim).transpose(0, 2, 1, 3)

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

    def __call__(self, x, bias, return_attention=False, kv=None):
        """Queries from ``x`` (B, Lq, D); keys and values from ``kv`` (B, L, D), default ``x``;
        ``bias`` broadcasts against (B, heads, Lq, L), or None when no key is padding.
        Returns (out (B, Lq, D), probs or None)."""
        ctx, attn = self.core(*self.project(x, kv), bias, return_attention)
        return self.output(ctx), attn


class TransformerLayer(StreamLayer, FusedMLP, nn.Module):
    """Post-norm BERT layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    Called directly on a multi-core CPU, the layer's rows are split over the streams
    (:class:`variants.runtime.streams.StreamLayer`, which also gives :meth:`forward_sharded` and
    :meth:`_forward_packed`); the MLP runs on cached transposed weights
    (:class:`variants.runtime.fused.FusedMLP`). Every row's arithmetic is unchanged.
    """

    def __init__(self, args):
        super().__init__()
        self.attention = Attention(args)
        self.attention_norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.intermediate = nn.Linear(args.hidden_size, args.intermediate_size)
        self.output = nn.Linear(args.intermediate_size, args.hidden_size)
        self.output_norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.hidden_act = args.hidden_act  # a name, so the module deep-copies
        self._shards = DerivedWeights()
        self._mlp = DerivedWeights()

    def activation(self, x):
        """The layer's activation function (``ACTIVATIONS[hidden_act]``), elementwise."""
        return ACTIVATIONS[self.hidden_act](x)

    def _forward(self, x, bias, return_attention=False, kv=None):
        if not return_attention and kv is None:
            y = fused_layer.forward(self, x, bias)  # one compiled op when it applies
            if y is not None:
                return y, None
        a, attn = self.attention(x, bias, return_attention, kv)
        x = self.attention_norm(x + a)
        x = self.output_norm(x + self.mlp(x))
        return x, attn


@dataclass
class EncoderOutput:
    """``last_hidden`` (B, L, D) float32; ``hidden_states``: embeddings + each layer (or None);
    ``attentions``: each layer's (B, heads, L, L) probabilities (or None).

    Padded positions of ``last_hidden`` hold zeros when the batch ran packed
    (:mod:`variants.runtime.packing`), else whatever the layers computed there: only real positions
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


class BertEncoder(StreamEncoder, nn.Module):
    """BERT encoder (Devlin et al. 2019), layout as mlx-examples' bert/model.py.

    Call with ``input_ids`` (B, L) int32, ``attention_mask`` (B, L) 0/1, optional
    ``token_type_ids`` (B, L) int32; returns :class:`EncoderOutput`.
    ``layers`` is a plain list so variants can run, skip or replace layers one by one. On a
    multi-core CPU the stack runs over the streams (:class:`variants.runtime.streams.StreamEncoder`).
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.layers = [TransformerLayer(args) for _ in range(args.num_hidden_layers)]

    def embed(self, input_ids, token_type_ids=None):
        """``input_ids`` (B, L) int32 -> embeddings (B, L, D). Position ids are 0..L-1 (BERT), or
        for RoBERTa / XLM-R cumsum(real) * real + pad_token_id with real = ids != pad (Hugging
        Face ``create_position_ids_from_input_ids``)."""
        B, L = input_ids.shape
        # RoBERTa / XLM-R positions start after pad_token_id
        offset = self.args.pad_token_id + 1 if self.args.roberta_positions else 0
        check_ids(input_ids, self.args.vocab_size, self.args.max_position_embeddings - offset)
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        if self.args.roberta_positions:
            real = (input_ids != self.args.pad_token_id).astype(mx.int32)
            position_ids = mx.cumsum(real, axis=1) * real + self.args.pad_token_id
        else:
            position_ids = mx.broadcast_to(mx.arange(L), (B, L))
        return self.embeddings(input_ids, token_type_ids, position_ids)

    # -- the per-layer interface shared with variants.arch.modernbert (context / apply_layer / finish)
    def context(self, attention_mask, positions=None):
        """What a layer needs besides ``x``: a :class:`BertContext` for ``attention_mask`` (B, L)
        0/1. ``positions`` is accepted for the common interface and unused: BERT's positions
        enter once, in :meth:`embed`."""
        return BertContext(attention_mask)

    def apply_layer(self, i, x, ctx, return_attention=False):
        """Layer ``i`` on ``x`` (B, L, D) with ``ctx`` (:meth:`context`) -> (x (B, L, D), probs
        (B, heads, L, L) or None). Without probabilities it runs as :meth:`run_layer` (packed
        over the streams when the batch has enough padding; padded rows are then zeros)."""
        layer = self.layers[i]
        if return_attention:
            return layer(x, ctx.bias, True)
        return self.run_layer(layer, x, ctx.bias, ctx.mask), None

    def finish(self, x):
        """The stack's output after the last layer: BERT has no final norm (identity)."""
        return x

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *,
                 output_hidden_states=False, output_attentions=False):
        x = self.embed(input_ids, token_type_ids)
        check_mask(input_ids, attention_mask)
        mask = np.array(attention_mask)
        bias = None if mask.all() else attention_bias(attention_mask, x.dtype)  # None: no padding
        if not (output_hidden_states or output_attentions or parallel.whole_batches()):
            y = self.stream_forward(x, mask, bias)
            if y is not None:
                return EncoderOutput(y)
        hidden = [x] if output_hidden_states else None
        attns = [] if output_attentions else None
        for layer in self.layers:
            x, attn = layer(x, bias, output_attentions)
            if output_hidden_states:
                hidden.append(x)
            if output_attentions:
                attns.append(attn)
        return EncoderOutput(x, hidden, attns)



class BertContext:
    """A BERT layer's context: ``mask`` (B, L) int32 0/1 and ``bias`` (:func:`attention_bias`,
    or None when no key is padding)."""

    def __init__(self, attention_mask):
        self.mask = mx.array(attention_mask).astype(mx.int32)
        self.bias = None if np.array(self.mask).all() else attention_bias(self.mask)

    def take_rows(self, idx):
        """The context of rows ``idx`` (int array) of the batch."""
        return BertContext(self.mask[mx.array(idx)])

    def take_tokens(self, index, new_mask):
        """The context after keeping token slots ``index`` (B, L') of each row, ``new_mask``
        (B, L') marking the real ones (positions are irrelevant after :meth:`BertEncoder.embed`)."""
        return BertContext(new_mask)


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

    Drops ``embeddings.position_ids`` (a buffer), the unused ``pooler.*`` and a classification
    head's ``classifier.*`` / ``lm_head.*`` / ``cls.*`` (:mod:`variants.checkpoints.hf_heads` reads the
    head); strips a leading ``bert.`` / ``roberta.`` prefix (RoBERTa / XLM-R use BERT's names).
    """
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("bert.").removeprefix("roberta.")
        if (name.startswith(("pooler.", "classifier.", "lm_head.", "cls."))
                or name.endswith("position_ids")):
            continue
        for old, new in _RENAMES:
            name = name.replace(old, new)
        out[name] = w
    return out


def compiled_paths(module):
    """``"fused-layer-cpp"`` and/or ``"fused-qlayer-cpp"`` (comma-joined) when any BERT layer
    (:class:`TransformerLayer`) of ``module`` (an ``nn.Module``) runs compiled
    (:mod:`variants.runtime.fused_layer`), else None: for timing records."""
    layers = [m for _, m in module.named_modules() if isinstance(m, TransformerLayer)]
    return fused_layer.used_by(layers)

"""The ModernBERT encoder's fast CPU path (:class:`variants.arch.modernbert.ModernBertEncoder`'s
``__call__`` without hidden states or probabilities): the MiniLM reference's speed steps
(:mod:`variants.runtime.fused`, :mod:`variants.runtime.streams`, :mod:`variants.runtime.fast_ops`) carried over to
ModernBERT's pre-norm layers with rotary positions and GeGLU. Every row's arithmetic is the plain
path's (:mod:`variants.arch.modernbert_layers`) up to float32 round-off:

- weights derived once per weight set (:class:`variants.runtime.derived.DerivedWeights`), stored
  transposed (``x @ w_t``): ``Wqkv`` with 1/sqrt(head_dim) folded into the query columns (rotary
  is linear, so rope(s·q) = s·rope(q)); ``Wi`` cut into its input and gate halves, each
  contiguous, so GeGLU's element-wise kernels read contiguous arrays;
- explicit attention with the scores transposed (keys on axis -2) and the compiled exp of
  :func:`variants.runtime.fast_ops.softmax_parts`, as :meth:`variants.arch.encoder.Attention.core`; the
  local layers' sliding window through its (B, 1, L, L) bias, or, when every key is inside the
  window (L - 1 <= local_attention // 2), with no window at all; the windowed path
  (:mod:`variants.arch.modernbert_window`) where the plain path takes it;
- rotary tables for positions 0..L-1 computed once per (L, θ) and kept;
- the work split over :func:`variants.runtime.parallel.streams` (one OpenBLAS thread each, MLX's buffer
  cache raised): B >= 2 by sequences, one whole layer stack per stream; B = 1 by heads and MLP
  features (tensor parallelism, partial outputs summed before each residual add) from
  :data:`SPLIT_ROWS_B1` real tokens.

Where the compiled extension is built, each layer instead runs as one compiled op
(:mod:`variants.arch.modernbert_fused`, same algebra and weights; ``VARIANTS_FUSED_LAYER=off`` keeps
the MLX ops described here).

Quantized or low-rank variants replace a Linear (not a plain ``nn.Linear``): the stack then takes
the plain path (:func:`layer_weights` is None), as it does on a GPU (``--device gpu``), except
quantized layers on the compiled ``dequant-cpp+gemm`` kernel, which run as one compiled op each
(:mod:`variants.arch.modernbert_fused_q`).
Memory: the derived weights are a second copy of each layer's weights (+ the B = 1 shards' q|k|v
and MLP-input columns), kept while the weights stay the same arrays.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.runtime import device, fast_ops, parallel
from variants.arch import modernbert_window as window
from variants.runtime.derived import DerivedWeights, transposed
from variants.arch.encoder import ACTIVATIONS, MASK_BIAS
from variants.arch.modernbert_layers import apply_rope, rope_tables

_ROPE = {}  # (L, theta, head_dim) -> (cos, sin·[-1, 1]) (L, 2, head_dim / 2), evaluated once
#: False: rotary by :func:`variants.arch.modernbert_layers.apply_rope` on each head (before the
#: compiled kernel; bench/modernbert_steps.py's A/B)
COMPILED_ROPE = True
#: False: the local layers' windowed blocks by :func:`variants.arch.modernbert_window.windowed_attention`
#: (bench/modernbert_steps.py's A/B) instead of :func:`windowed_core`
FAST_WINDOW = True


def rope_for_length(L, theta, head_dim):
    """Rotary tables for positions 0..L-1, kept per (L, θ, head_dim)
    (:func:`variants.arch.modernbert_layers.rope_tables`): ``(cos, sin)`` each (1, 1, L, head_dim),
    and ``(cos, signed_sin)`` each (L, 2, head_dim / 2) for :func:`rope_qk` (sin negated on the
    first half: rotate_half(x) · sin = swap_halves(x) · signed_sin)."""
    key = (int(L), float(theta), int(head_dim))
    tabs = _ROPE.get(key)
    if tabs is None:  # a local: another thread may clear the cache meanwhile
        if len(_ROPE) > 256:
            _ROPE.clear()
        cos, sin = rope_tables(mx.arange(L)[None], theta, head_dim)
        h = head_dim // 2
        tabs = (cos, sin, cos[0, 0].reshape(L, 2, h),
                sin[0, 0].reshape(L, 2, h) * mx.array([-1.0, 1.0]).reshape(1, 2, 1))
        mx.eval(*tabs)
        _ROPE[key] = tabs
    return tabs


@mx.compile
def _rotate(x, swapped, cos, signed_sin):
    return x * cos + swapped * signed_sin


def rope_qk(qkv, n_heads, head_dim, tables):
    """Rotary q and k straight from the fused projection ``qkv`` (B, L, 3·n_heads·head_dim):
    one compiled kernel reading q|k in place (each head's halves swapped by a reversed view)
    and writing (2, B, n_heads, L, head_dim) contiguous, the heads layout attention reads.
    Same arithmetic as :func:`variants.arch.modernbert_layers.apply_rope` (x·cos + rotate_half(x)·sin,
    bit-identical here); 2.8-3.7x its time for q and k (B=1 L=24 / 512, B=8 L=128)."""
    B, L, _ = qkv.shape
    h = head_dim // 2
    x = qkv[..., :2 * n_heads * head_dim].reshape(B, L, 2, n_heads, 2, h)
    x = x.transpose(2, 0, 3, 1, 4, 5)
    return _rotate(x, x[..., ::-1, :], tables[2], tables[3]).reshape(2, B, n_heads, L, head_dim)


def _plain(m):
    """A plain ``nn.Linear`` (with or without bias): the only kind weights are derived from."""
    return type(m) is nn.Linear


def _bias(m):
    return m.bias if "bias" in m else None


def layer_weights(layer):
    """The fast path's weights of a :class:`variants.arch.modernbert_layers.ModernBertLayer`, or None
    when a Linear is not a plain ``nn.Linear``: ``(w_qkv_t (D, 3D), b_qkv (3D,) or None, w_o_t
    (D, D), b_o, w_in_t (D, F), b_in, w_gate_t (D, F), b_gate, w_out_t (F, D), b_out)``, the
    query columns and bias scaled by 1/sqrt(head_dim). Rebuilt when a weight array is replaced
    (as :meth:`variants.runtime.fused.FusedAttention.folded`)."""
    att, mlp = layer.attn, layer.mlp
    mods = (att.Wqkv, att.Wo, mlp.Wi, mlp.Wo)
    cache = layer.__dict__.setdefault("_fast_weights", DerivedWeights())
    if not all(_plain(m) for m in mods):
        for name in ("_fast_weights", "_fast_shards", "_mbert_panels"):  # every derived copy
            if name in layer.__dict__:
                layer.__dict__[name].clear()
        return None
    sources = tuple(a for m in mods for a in (m.weight, _bias(m)))

    def build():
        D = att.Wo.weight.shape[0]
        F = mlp.Wo.weight.shape[1]
        s = att.scale
        w, b = att.Wqkv.weight, _bias(att.Wqkv)
        w_qkv = transposed(mx.concatenate([w[:D] * s, w[D:]]))
        b_qkv = None if b is None else mx.concatenate([b[:D] * s, b[D:]])
        wi, bi = mlp.Wi.weight, _bias(mlp.Wi)
        return (w_qkv, b_qkv, transposed(att.Wo.weight), _bias(att.Wo),
                transposed(wi[:F]), None if bi is None else bi[:F],
                transposed(wi[F:]), None if bi is None else bi[F:],
                transposed(mlp.Wo.weight), _bias(mlp.Wo))
    return cache.get(sources, build)


def _linear(x, w_t, b):
    return x @ w_t if b is None else mx.addmm(b, x, w_t)


def head_shards(layer, k):
    """``layer``'s fast weights cut into ``k`` parts by heads and by MLP features (B = 1 tensor
    parallelism): a list of (w_qkv_t, b_qkv, w_o_t, w_in_t, b_in, w_gate_t, b_gate, w_out_t),
    or None (plain path, or fewer than 2 parts)."""
    w = layer_weights(layer)
    if w is None:
        return None
    att = layer.attn
    F = w[8].shape[0]
    k = min(k, att.n_heads, F)
    if k < 2:
        return None
    cache = layer.__dict__.setdefault("_fast_shards", DerivedWeights())

    def build():
        w_qkv, b_qkv, w_o, _, w_in, b_in, w_g, b_g, w_out, _ = w
        D, d = w_o.shape[0], att.head_dim
        parts = []
        for (a, b), (fa, fb) in zip(parallel.bounds(att.n_heads, k), parallel.bounds(F, k)):
            cols = [slice(j * D + a * d, j * D + b * d) for j in range(3)]
            parts.append((
                mx.concatenate([w_qkv[:, c] for c in cols], axis=1),
                None if b_qkv is None else mx.concatenate([b_qkv[c] for c in cols]),
                w_o[a * d:b * d],
                mx.contiguous(w_in[:, fa:fb]), None if b_in is None else b_in[fa:fb],
                mx.contiguous(w_g[:, fa:fb]), None if b_g is None else b_g[fa:fb],
                w_out[fa:fb]))
        return parts
    return cache.get(tuple(a for a in w if a is not None) + (k,), build)


class FastContext:
    """What the fast layers need for a batch with ``mask`` (B, L) 0/1 (NumPy) at positions
    0..L-1: rotary tables per θ, the attention biases laid out keys first (``bias_t``: (B, 1, L,
    1) padding bias or None; ``local_t``: the local layers' (B or 1, 1, L, L) bias with the
    window, or ``bias_t`` when the window covers every key) and the local layers'
    :class:`variants.arch.modernbert_window.WindowPlan` (``plan``, its bias transposed in
    ``plan_bias_t``; one row when no key is padding) when they take the windowed path.
    ``mode``: auto / windowed / masked (:func:`variants.arch.modernbert_window.resolve_mode`)."""

    def __init__(self, args, mask, mode):
        self.args = args
        B, L = mask.shape
        half = args.local_attention // 2
        head_dim = args.hidden_size // args.num_attention_heads
        self.rope = {True: rope_for_length(L, args.global_rope_theta, head_dim),
                     False: rope_for_length(L, args.local_rope_theta, head_dim)}
        mx_mask = mx.array(mask.astype(np.int32))
        self.padded = not mask.all()
        key = (1 - mx_mask.astype(mx.float32)) * MASK_BIAS
        self.bias_t = key[:, None, :, None] if self.padded else None
        self.plan = None
        self.local_t = self.bias_t
        if window.use_window(mode, L, args.local_attention, True):
            rows = B if self.padded else 1  # without padding the window is the same per row
            self.plan = window.make_plan(mx_mask[:rows], mx.broadcast_to(mx.arange(L), (rows, L)),
                                         half)
            self.plan_bias_t = mx.contiguous(self.plan.bias.swapaxes(-1, -2))
        elif L - 1 > half:
            p = mx.arange(L)
            far = (mx.abs(p[:, None] - p[None, :]) > half)[None, None]
            self.local_t = mx.where(far, MASK_BIAS, 0.0 if self.bias_t is None else self.bias_t)

    def bias(self, is_global):
        return self.bias_t if is_global else self.local_t


def attention_core(q, k, v, bias_t):
    """softmax(q kᵀ + bias) v with the scores transposed (keys on axis -2; ``bias_t`` laid out
    the same, or None): ``q`` (already scaled), ``k``, ``v`` (B, H, L, d) -> (B, H, L, d). As
    :meth:`variants.arch.encoder.Attention.core`: eᵀ @ [v, 1] gives the row sums in its last
    column."""
    d = v.shape[-1]
    e = fast_ops.softmax_parts(k @ q.swapaxes(-1, -2), bias_t, total=False, axis=-2)
    r = e.swapaxes(-1, -2) @ mx.concatenate([v, mx.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
    return r[..., :d] / r[..., d:]


def windowed_core(q, k, v, plan, bias_t):
    """:func:`variants.arch.modernbert_window.windowed_attention` (same blocks, same window) with the
    scores of each block transposed (keys on axis -2) and the compiled exp, as
    :func:`attention_core`: ``q`` (already scaled), ``k``, ``v`` (B, H, L, d); ``bias_t``
    (B or 1, 1, n_blocks, span, block), the plan's bias transposed -> (B, H, L, d)."""
    B, H, L, d = q.shape
    nb, w, h = plan.n_blocks, plan.block, plan.half
    tail = nb * w - L
    if tail:
        q = mx.pad(q, [(0, 0), (0, 0), (0, tail), (0, 0)])
    qb = q.reshape(B, H, nb, w, d)
    pad = [(0, 0), (0, 0), (h, tail + h), (0, 0)]
    v1 = mx.concatenate([v, mx.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
    kb = window._key_blocks(mx.pad(k, pad), nb, w, w + 2 * h)
    vb = window._key_blocks(mx.pad(v1, pad), nb, w, w + 2 * h)
    e = fast_ops.softmax_parts(kb @ qb.swapaxes(-1, -2), bias_t, total=False, axis=-2)
    r = (e.swapaxes(-1, -2) @ vb).reshape(B, H, nb * w, d + 1)
    out = r[..., :d] / r[..., d:]
    return out[:, :, :L] if tail else out


def _attend(layer, h, w_qkv, b_qkv, ctx):
    """Attention of ``h`` (B, L, D) normed input through ``w_qkv`` (D, 3·n) for its n / head_dim
    heads -> (B, L, n) context before the output projection."""
    att = layer.attn
    B, L, _ = h.shape
    n = w_qkv.shape[1] // 3
    heads = n // att.head_dim
    qkv = _linear(h, w_qkv, b_qkv)
    tables = ctx.rope[layer.is_global]
    v = qkv[..., 2 * n:].reshape(B, L, heads, att.head_dim).transpose(0, 2, 1, 3)
    if COMPILED_ROPE:
        q, k = rope_qk(qkv, heads, att.head_dim, tables)
    else:
        qk = qkv[..., :2 * n].reshape(B, L, 2, heads, att.head_dim).transpose(2, 0, 3, 1, 4)
        q, k = (apply_rope(t, tables[0], tables[1]) for t in (qk[0], qk[1]))
    if not layer.is_global and ctx.plan is not None:
        out = (windowed_core(q, k, v, ctx.plan, ctx.plan_bias_t) if FAST_WINDOW else
               window.windowed_attention(q, k, v, 1.0, ctx.plan))
    else:
        out = attention_core(q, k, v, ctx.bias(layer.is_global))
    return out.transpose(0, 2, 1, 3).reshape(B, L, n)


def _geglu(layer, h, w_in, b_in, w_g, b_g):
    return ACTIVATIONS[layer.mlp.hidden_activation](_linear(h, w_in, b_in)) * _linear(h, w_g, b_g)


def layer_forward(layer, x, ctx, w):
    """One pre-norm layer on ``x`` (B, L, D) with its :func:`layer_weights` ``w`` and a
    :class:`FastContext` -> (B, L, D)."""
    w_qkv, b_qkv, w_o, b_o, w_in, b_in, w_g, b_g, w_out, b_out = w
    x = x + _linear(_attend(layer, layer.attn_norm(x), w_qkv, b_qkv, ctx), w_o, b_o)
    return x + _linear(_geglu(layer, layer.mlp_norm(x), w_in, b_in, w_g, b_g), w_out, b_out)


def layer_forward_sharded(layer, x, ctx, w, shards):
    """As :func:`layer_forward`, each stream computing its heads and MLP features (shards of
    :func:`head_shards`); the partial outputs are summed before each residual add."""
    ss = parallel.streams()
    h = layer.attn_norm(x)
    parts = []
    for s, (w_qkv, b_qkv, w_o, *_) in zip(ss, shards):
        with mx.stream(s):
            parts.append(_attend(layer, h, w_qkv, b_qkv, ctx) @ w_o)
    with mx.stream(ss[0]):
        a = sum(parts[1:], parts[0])
        x = x + (a if w[3] is None else a + w[3])
        h = layer.mlp_norm(x)
    parts = []
    for s, (*_, w_in, b_in, w_g, b_g, w_out) in zip(ss, shards):
        with mx.stream(s):
            parts.append(_geglu(layer, h, w_in, b_in, w_g, b_g) @ w_out)
    with mx.stream(ss[0]):
        m = sum(parts[1:], parts[0])
        return x + (m if w[9] is None else m + w[9])


#: B = 1 splits heads and MLP features over the streams from this many real tokens. ModernBERT's
#: projections are 768 wide, so even 24 rows pay for the split on an idle second core: MLX/ORT
#: fp32 at B=1 L=24 (bench/peers.py, 7-9 alternated rounds, quiet 2-core machine) 0.61-0.65
#: split against 0.49-0.51 on one stream. Under heavy load the split measured 0.89x (the other
#: core busy elsewhere).
SPLIT_ROWS_B1 = 8


def forward(encoder, x, mask, mode):
    """The layer stack on embeddings ``x`` (B, L, D) with ``mask`` (B, L) NumPy 0/1 and
    positions 0..L-1, before ``final_norm``; None when a layer is not plain or MLX's default
    device is not the CPU (the caller then runs the plain path)."""
    if not device.is_cpu():
        return None
    weights = [layer_weights(layer) for layer in encoder.layers]
    if any(w is None for w in weights):
        return None
    ss = parallel.streams()
    B, L = mask.shape
    if len(ss) > 1 and B >= len(ss) and B * L >= parallel.MIN_ROWS:
        outs = []
        for s, (a, b) in zip(ss, parallel.bounds(B, len(ss))):
            with mx.stream(s):
                ctx = FastContext(encoder.args, mask[a:b], mode)
                h = x[a:b]
                for layer, w in zip(encoder.layers, weights):
                    h = layer_forward(layer, h, ctx, w)
                outs.append(h)
        return mx.concatenate(outs, axis=0)
    ctx = FastContext(encoder.args, mask, mode)
    shards = None
    if len(ss) > 1 and mask.sum() >= SPLIT_ROWS_B1:
        shards = [head_shards(layer, len(ss)) for layer in encoder.layers]
    for i, (layer, w) in enumerate(zip(encoder.layers, weights)):
        if shards is not None and shards[i] is not None:
            x = layer_forward_sharded(layer, x, ctx, w, shards[i])
        else:
            x = layer_forward(layer, x, ctx, w)
    return x

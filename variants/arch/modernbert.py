"""The ModernBERT encoder in MLX (Warner et al. 2024; Hugging Face ``ModernBertModel``, eager
attention): embeddings -> pre-norm layers with rotary positions, global attention on every
``global_attn_every_n_layers``-th layer and sliding-window attention (|q - k| <=
``local_attention // 2``) on the others -> ``final_norm``. Blocks in
:mod:`variants.arch.modernbert_layers`; the local layers compute only the keys inside each window
(:mod:`variants.arch.modernbert_window`) from L >= 2 · local_attention, else the dense scores masked.

Per-layer interface (shared with :class:`variants.arch.encoder.BertEncoder`): :meth:`embed`,
``layers``, :meth:`context`, :meth:`apply_layer`, :meth:`finish`; :meth:`__call__` is exactly
embed -> apply_layer over all -> finish.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.arch import modernbert_fast, modernbert_fused, modernbert_fused_q
from variants.runtime import parallel
from variants.arch import modernbert_window as window
from variants.arch.encoder import MASK_BIAS, EncoderOutput, LayerNorm, check_ids, check_mask
from variants.arch.modernbert_layers import Embeddings, ModernBertArgs, ModernBertLayer, rope_tables

__all__ = ["ModernBertArgs", "ModernBertContext", "ModernBertEncoder", "sanitize"]


class ModernBertContext:
    """What a ModernBERT layer needs besides ``x``, built from ``mask`` (B, L) 0/1 and
    ``positions`` (B, L) int (the tokens' original positions: windows and rotary angles follow
    them, so a batch whose token slots were pruned keeps each token's distances).

    ``bias(is_global)``: (B, 1, 1, L) key bias (global) or (B, 1, L, L) key bias plus the
    window (|pos_q - pos_k| > local_attention // 2 masked), both MASK_BIAS where masked;
    ``rope(is_global)``: (cos, sin) (B, 1, L, head_dim) at ``global_rope_theta`` or
    ``local_rope_theta``; ``window()``: the :class:`variants.arch.modernbert_window.WindowPlan` the
    local layers compute their window with (only the keys inside it), or None for the dense
    masked path. ``mode`` (auto / windowed / masked, see
    :func:`variants.arch.modernbert_window.resolve_mode`) decides; the windowed path needs each row's
    positions to strictly increase (``increasing``; None checks them), else the masked path.
    """

    def __init__(self, args, mask, positions, mode="auto", increasing=None):
        self.args = args
        self.mask = mx.array(mask).astype(mx.int32)
        self.positions = mx.array(positions).astype(mx.int32)
        self.mode = mode
        key = (1 - self.mask.astype(mx.float32)) * MASK_BIAS
        self._global = key[:, None, None, :]
        self._local = None
        self._plan = None
        # the positions are checked (one sync) only when the window would otherwise be taken
        self.windowed = window.use_window(mode, self.mask.shape[1], args.local_attention, True)
        if self.windowed and increasing is None:
            increasing = window.positions_increase(self.positions)
        self.windowed = self.windowed and bool(increasing)
        self.increasing = increasing
        head_dim = args.hidden_size // args.num_attention_heads
        p = self.positions
        self._rope = {True: rope_tables(p, args.global_rope_theta, head_dim),
                      False: rope_tables(p, args.local_rope_theta, head_dim)}

    def bias(self, is_global):
        if is_global:
            return self._global
        if self._local is None:  # built on first use: the windowed path never needs it
            p = self.positions
            far = mx.abs(p[:, :, None] - p[:, None, :]) > self.args.local_attention // 2
            self._local = mx.where(far[:, None], MASK_BIAS, self._global)
        return self._local

    def window(self):
        if not self.windowed:
            return None
        if self._plan is None:
            self._plan = window.make_plan(self.mask, self.positions,
                                          self.args.local_attention // 2)
        return self._plan

    def rope(self, is_global):
        return self._rope[bool(is_global)]

    def take_rows(self, idx):
        """The context of rows ``idx`` (int array) of the batch."""
        idx = mx.array(idx)
        return ModernBertContext(self.args, self.mask[idx], self.positions[idx], self.mode,
                                 self.increasing)

    def take_tokens(self, index, new_mask):
        """The context after keeping token slots ``index`` (B, L') int of each row, with
        ``new_mask`` (B, L') 0/1: positions follow the kept tokens."""
        pos = mx.take_along_axis(self.positions, mx.array(index).astype(mx.int32), axis=1)
        return ModernBertContext(self.args, new_mask, pos, self.mode)


class ModernBertEncoder(nn.Module):
    """ModernBERT encoder. Call with ``input_ids`` (B, L) int32, ``attention_mask`` (B, L) 0/1
    (``token_type_ids`` is accepted and ignored: ModernBERT has none); returns
    :class:`variants.arch.encoder.EncoderOutput` whose ``last_hidden`` is after ``final_norm`` and
    whose ``hidden_states`` are the embeddings and each layer's output before it (as HF).

    ``local_attention_impl``: ``auto`` / ``windowed`` / ``masked`` for the local layers (see
    :mod:`variants.arch.modernbert_window`); None (default) reads ``VARIANTS_MODERNBERT_ATTENTION``.

    ``fast`` (default True): without hidden states or probabilities, and outside
    :func:`variants.runtime.parallel.single_stream`, the stack runs on :mod:`variants.arch.modernbert_fast`
    (same outputs to float32 round-off); False keeps the plain layer-by-layer path."""

    local_attention_impl = None
    fast = True

    def __init__(self, args: ModernBertArgs):
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.layers = [ModernBertLayer(args, i) for i in range(args.num_hidden_layers)]
        self.final_norm = LayerNorm(args.hidden_size, eps=args.norm_eps, bias=args.norm_bias)

    def embed(self, input_ids, token_type_ids=None):
        """``input_ids`` (B, L) int32 -> (B, L, D) float32 (normed token embeddings). Raises
        ValueError for an id outside the embedding table (:func:`variants.arch.encoder.check_ids`)."""
        check_ids(input_ids, self.args.vocab_size)
        return self.embeddings(input_ids)

    def context(self, attention_mask, positions=None):
        """A :class:`ModernBertContext`; ``positions`` (B, L) int default 0..L-1 per row."""
        mask = mx.array(attention_mask)
        mode = window.resolve_mode(self.local_attention_impl)
        if positions is None:
            positions = mx.broadcast_to(mx.arange(mask.shape[1]), mask.shape)
            return ModernBertContext(self.args, mask, positions, mode, increasing=True)
        return ModernBertContext(self.args, mask, positions, mode)

    def apply_layer(self, i, x, ctx, return_attention=False):
        """Layer ``i`` on ``x`` (B, L, D) -> (x (B, L, D), probs (B, heads, L, L) or None)."""
        return self.layers[i](x, ctx, return_attention)

    def finish(self, x):
        """``final_norm``."""
        return self.final_norm(x)

    def layers_from(self, start, x, attention_mask):
        """Layers ``start``..N-1 on ``x`` (B, L, D) float32, the input of layer ``start``, with
        ``attention_mask`` (B, L) 0/1 and positions 0..L-1 -> (B, L, D) before ``final_norm``:
        on the fast path where :meth:`__call__` takes it (:func:`fast_forward` on those layers),
        else layer by layer. ``start`` = 0 is :meth:`__call__`'s stack."""
        if self.fast and not parallel.whole_batches():
            tail = _Tail(self.args, self.layers[start:])
            y = fast_forward(tail, x, np.array(attention_mask),
                             window.resolve_mode(self.local_attention_impl))
            if y is not None:
                return y
        ctx = self.context(attention_mask)
        for i in range(start, len(self.layers)):
            x = self.apply_layer(i, x, ctx)[0]
        return x

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *,
                 output_hidden_states=False, output_attentions=False):
        x = self.embed(input_ids)
        check_mask(input_ids, attention_mask)
        if not (output_hidden_states or output_attentions):
            return EncoderOutput(self.finish(self.layers_from(0, x, attention_mask)))
        ctx = self.context(attention_mask)
        hidden = [x] if output_hidden_states else None
        attns = [] if output_attentions else None
        for i in range(len(self.layers)):
            x, probs = self.apply_layer(i, x, ctx, output_attentions)
            if output_hidden_states:
                hidden.append(x)
            if output_attentions:
                attns.append(probs)
        return EncoderOutput(self.finish(x), hidden, attns)


class _Tail:
    """Layers ``layers`` (a slice of the stack, each keeping its own global / local kind) with
    the encoder's ``args``: what :func:`fast_forward` reads of an encoder."""

    def __init__(self, args, layers):
        self.args = args
        self.layers = layers


_HEAD_PREFIXES = ("head.", "classifier.", "decoder.", "drop.")


def sanitize(weights):
    """Hugging Face ModernBERT weight names -> this module's: strips ``model.``, drops the
    classification / MLM head (``head.*``, ``classifier.*``, ``decoder.*``; see
    :mod:`variants.checkpoints.hf_heads`). Pure, no I/O."""
    out = {}
    for name, w in weights.items():
        if name.startswith(_HEAD_PREFIXES):
            continue
        out[name.removeprefix("model.")] = w
    return out


def fast_forward(encoder, x, mask, mode):
    """The layer stack of ``encoder`` on embeddings ``x`` (B, L, D) with ``mask`` (B, L) NumPy
    0/1, before ``final_norm``, on the fastest path that applies: quantized and W8A8 layers as
    one compiled op each (:mod:`variants.arch.modernbert_fused_q`,
    :mod:`variants.arch.modernbert_fused_i8`), fp32 layers as one compiled op each
    (:mod:`variants.arch.modernbert_fused`), else the MLX fast path
    (:func:`variants.arch.modernbert_fast.forward`). None when none applies (a layer that is not
    plain, or MLX's default device is not the CPU): the caller then runs the plain path."""
    if not modernbert_fast.device.is_cpu():
        return None
    if any(modernbert_fast.layer_weights(layer) is None for layer in encoder.layers):
        return modernbert_fused_q.forward(encoder, x, mask, mode)
    y = modernbert_fused.forward(encoder, x, mask, mode)
    return y if y is not None else modernbert_fast.forward(encoder, x, mask, mode)


def compiled_paths(module):
    """``"fused-mbert-layer-cpp"`` / ``"fused-mbert-qlayer-cpp"`` / ``"fused-mbert-int8layer-cpp"``
    (comma-joined when mixed) when
    a ModernBERT encoder inside ``module`` (an ``nn.Module``) runs its layers as compiled ops
    (:mod:`variants.arch.modernbert_fused`, :mod:`variants.arch.modernbert_fused_q`), else None: for
    timing records."""
    for _, m in module.named_modules():
        if (isinstance(m, ModernBertEncoder) and m.fast
                and window.resolve_mode(m.local_attention_impl) != "masked"):
            name = modernbert_fused.used_by(m) or modernbert_fused_q.used_by(m)
            if name:
                return name
    return None

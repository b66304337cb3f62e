"""Output selection: the last encoder layer runs only at the positions the output reads.

A CLS-pooled classifier (BERT pooler, RoBERTa head: token 0) or a ``marker`` decision model
(the hidden state at each option's marker) reads P ≪ L positions of the last layer. Every layer
but the last runs as usual; the last layer's queries, attention output, residual + norm and MLP
run on the P read positions only, its keys and values still from all L tokens (the attention's
``kv`` argument, :class:`variants.arch.encoder.Attention`). Exact up to float round-off (the same
arithmetic per read position, in smaller matrix products). Saved work: the last layer's query
and output projections, attention rows and MLP for L − P positions, ≈ (1 − P/L)·(1 − 2/12)/N of
the encoder's per-token Linear work for a BERT layer (keys and values stay: 2 of its 12 D²
units).

Not for mean-pooled models (minilm-sentiment, minilm-choice, a ModernBERT ``mean`` head): their
output reads every position, so there is nothing to skip (:func:`reads_of` says so).
"""

import mlx.core as mx
import mlx.nn as nn

from variants.runtime import fused_layer
from variants.arch.encoder import BertEncoder


def reads_of(module):
    """``"cls"`` or ``"marker"``: which positions ``module``'s output reads.

    Raises
    ------
    ValueError
        One line naming why output selection does not apply: a mean-pooled readout (every
        position is read), an encoder other than BERT/RoBERTa (ModernBERT's fused Wqkv layer
        has no query-subset call here), or an unknown readout.
    """
    name = type(module).__name__
    enc = getattr(module, "encoder", None)
    head = getattr(module, "classifier", None)
    if hasattr(module, "scorer") and hasattr(module, "states"):
        reads = "marker"
    elif head is not None and type(head).__name__ in ("BertClassifier", "RobertaClassifier"):
        reads = "cls"
    elif head is not None and getattr(head, "pooling", None) == "cls":
        reads = "cls"
    elif name in ("SentimentNet", "EmbeddingNet") or getattr(head, "pooling", None) == "mean":
        raise ValueError(f"--exact-kinds outsel does not apply to {name}: its output is a mean "
                         "over every token (mean pooling), so every last-layer position is read "
                         "and none can be skipped; use --exact-kinds dedup cache")
    else:
        raise ValueError(f"--exact-kinds outsel does not know which positions {name}'s output "
                         "reads (CLS classifier heads and marker models only); use "
                         "--exact-kinds dedup cache")
    if not isinstance(enc, BertEncoder):
        raise ValueError(f"--exact-kinds outsel runs BERT/RoBERTa encoders only, not "
                         f"{type(enc).__name__}; use --exact-kinds dedup cache")
    return reads


class OutputSelectNet(nn.Module):
    """Wraps a CLS classifier net or a marker net; called like it: ``(ids, mask, types)`` or
    ``(ids, mask, types, marker_pos)`` (B, L) / (B, K) int32 -> logits (B, n_labels) / (B, K)."""

    def __init__(self, base, reads):
        super().__init__()
        self.base = base
        self._reads = reads

    def hidden_at(self, input_ids, attention_mask, token_type_ids, positions):
        """(B, P, D) last hidden states at ``positions`` (B, P) int32; the last layer's queries
        at those positions only, its keys and values from every token."""
        enc = self.base.encoder
        x = enc.embed(input_ids, token_type_ids)
        ctx = enc.context(attention_mask)
        for i in range(len(enc.layers) - 1):
            x, _ = enc.apply_layer(i, x, ctx)
        if fused_layer.applies(enc.layers[-1:]):
            # the reference runs this layer as one compiled op (variants.runtime.fused_layer): all its
            # queries, so the selected rows equal the reference's bit for bit
            x, _ = enc.apply_layer(len(enc.layers) - 1, x, ctx)
            return enc.finish(mx.take_along_axis(x, positions[:, :, None], axis=1))
        xs = mx.take_along_axis(x, positions[:, :, None], axis=1)
        y, _ = enc.layers[-1]._forward(xs, ctx.bias, False, kv=x)
        return enc.finish(y)

    def __call__(self, input_ids, attention_mask, token_type_ids, marker_pos=None):
        if self._reads == "marker":
            states = self.hidden_at(input_ids, attention_mask, token_type_ids, marker_pos)
            return self.base.scorer(states)[..., 0]
        pos = mx.zeros((input_ids.shape[0], 1), mx.int32)
        h = self.hidden_at(input_ids, attention_mask, token_type_ids, pos)
        return self.base.readout(h, attention_mask[:, :1])

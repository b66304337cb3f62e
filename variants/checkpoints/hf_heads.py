"""The sequence-classification heads of Hugging Face checkpoints, in MLX: each is called as
``head(last_hidden (B, L, D) float32, attention_mask (B, L) 0/1) -> logits (B, n_labels)`` and
does its own pooling, as ``transformers``' ``*ForSequenceClassification`` (dropout off):

- :class:`BertClassifier`: ``BertForSequenceClassification``: pooler tanh(dense(h[:, 0])) ->
  ``classifier``;
- :class:`RobertaClassifier`: ``RobertaClassificationHead`` (RoBERTa, XLM-R): dense -> tanh ->
  ``out_proj`` on token 0 (``<s>``);
- :class:`ModernBertClassifier`: ``ModernBertForSequenceClassification``: ``classifier_pooling``
  (``cls``: token 0; ``mean``: mean over real tokens) -> ``head.dense`` -> act
  (``classifier_activation``) -> ``head.norm`` -> ``classifier``.

:func:`load_head` picks the head's weights out of a checkpoint's (un-renamed) weight dict.
"""

import mlx.core as mx
import mlx.nn as nn

from variants.arch.encoder import ACTIVATIONS, LayerNorm


def _linear(weights, prefix):
    """An ``nn.Linear`` holding ``prefix.weight`` (out, in) and ``prefix.bias`` when present."""
    w = weights[prefix + ".weight"]
    b = weights.get(prefix + ".bias")
    m = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    m.weight = w
    if b is not None:
        m.bias = b
    return m


class BertClassifier(nn.Module):
    """BERT's pooler (tanh(dense(CLS))) and classifier."""

    def __init__(self, pooler, classifier):
        super().__init__()
        self.pooler, self.classifier = pooler, classifier

    def __call__(self, last_hidden, attention_mask=None):
        return self.classifier(mx.tanh(self.pooler(last_hidden[:, 0])))


class RobertaClassifier(nn.Module):
    """RoBERTa's classification head: out_proj(tanh(dense(h[:, 0])))."""

    def __init__(self, dense, out_proj):
        super().__init__()
        self.dense, self.out_proj = dense, out_proj

    def __call__(self, last_hidden, attention_mask=None):
        return self.out_proj(mx.tanh(self.dense(last_hidden[:, 0])))


class ModernBertClassifier(nn.Module):
    """ModernBERT's pooling (``cls`` or ``mean``) -> dense -> act -> norm -> classifier."""

    def __init__(self, dense, norm, classifier, pooling, activation):
        super().__init__()
        if pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling {pooling!r} is not supported; use cls or mean")
        if activation not in ACTIVATIONS:
            raise ValueError(f"classifier_activation {activation!r} is not supported; "
                             f"use one of {sorted(ACTIVATIONS)}")
        self.dense, self.norm, self.classifier = dense, norm, classifier
        self.pooling, self.activation = pooling, activation

    def __call__(self, last_hidden, attention_mask=None):
        if self.pooling == "cls":
            pooled = last_hidden[:, 0]
        else:
            m = attention_mask.astype(last_hidden.dtype)[..., None]
            pooled = (last_hidden * m).sum(axis=1) / m.sum(axis=1)
        return self.classifier(self.norm(ACTIVATIONS[self.activation](self.dense(pooled))))


def load_head(model_type, weights, args):
    """The classification head in ``weights`` (Hugging Face names, as in the safetensors file),
    or None when the file has none.

    Parameters
    ----------
    model_type : str
        ``bert``, ``roberta``, ``xlm-roberta`` or ``modernbert``.
    weights : dict of str to mx.array
    args : the architecture's config dataclass (ModernBERT: ``classifier_pooling``,
        ``classifier_activation``, ``norm_eps``, ``norm_bias``).

    Raises
    ------
    KeyError
        A head is partly present (e.g. ``classifier.weight`` without the pooler).
    ValueError
        An unsupported pooling or activation.
    """
    if model_type == "bert":
        if "classifier.weight" not in weights:
            return None
        return BertClassifier(_linear(weights, "bert.pooler.dense"),
                              _linear(weights, "classifier"))
    if model_type in ("roberta", "xlm-roberta"):
        if "classifier.out_proj.weight" not in weights:
            return None
        return RobertaClassifier(_linear(weights, "classifier.dense"),
                                 _linear(weights, "classifier.out_proj"))
    if "classifier.weight" not in weights:
        return None
    norm = LayerNorm(args.hidden_size, eps=args.norm_eps, bias=args.norm_bias)
    norm.weight = weights["head.norm.weight"]
    if args.norm_bias:
        norm.bias = weights["head.norm.bias"]
    return ModernBertClassifier(_linear(weights, "head.dense"), norm,
                                _linear(weights, "classifier"), args.classifier_pooling,
                                args.classifier_activation)

"""Loader of DeBERTa-v2 / v3 / mDeBERTa-v3 checkpoints (model_type ``deberta-v2``,
:mod:`variants.checkpoints.architectures`): :class:`variants.arch.deberta.DebertaEncoder` and
``DebertaV2ForSequenceClassification``'s head (:class:`DebertaClassifier`). DeBERTa v1
(model_type ``deberta``) is not registered and is refused at load."""

import mlx.nn as nn

from variants.arch.deberta import HEAD_ACTIVATIONS, DebertaArgs, DebertaEncoder, sanitize  # noqa: F401
from variants.checkpoints.hf_heads import _linear


class DebertaClassifier(nn.Module):
    """``ContextPooler`` + classifier: classifier(act(dense(h[:, 0]))), act =
    ``pooler_hidden_act`` (dropout off). Called as ``head(last_hidden (B, L, D), mask)`` ->
    logits (B, n_labels). ``pooling`` says which position it reads (as
    :class:`variants.checkpoints.hf_heads.ModernBertClassifier`'s)."""

    pooling = "cls"

    def __init__(self, dense, classifier, activation):
        super().__init__()
        self.dense, self.classifier, self.activation = dense, classifier, activation

    def __call__(self, last_hidden, attention_mask=None):
        return self.classifier(HEAD_ACTIVATIONS[self.activation](self.dense(last_hidden[:, 0])))


def build(model_type, config):
    """(DebertaArgs, DebertaEncoder) for ``config`` (a config.json dict)."""
    args = DebertaArgs.from_dict(config)
    return args, DebertaEncoder(args)


def load_head(model_type, weights, args):
    """The ``pooler.dense`` / ``classifier`` head in ``weights`` (transformers' names), or None
    when the file has none. Raises KeyError when the head is partly present."""
    if "classifier.weight" not in weights:
        return None
    return DebertaClassifier(_linear(weights, "pooler.dense"), _linear(weights, "classifier"),
                             args.pooler_hidden_act)


def position_cap(model_type, config):
    """``max_position_embeddings`` (the length the model was trained to; without absolute
    positions, ``position_biased_input`` false, the relative buckets would reach further)."""
    return int(config.get("max_position_embeddings", 512))

"""Loader of DistilBERT checkpoints (:mod:`variants.checkpoints.architectures`):
:class:`variants.arch.distilbert.DistilBertEncoder` and :class:`DistilBertClassifier`."""

import mlx.nn as nn

from variants.arch.distilbert import DistilBertArgs, DistilBertEncoder, sanitize  # noqa: F401
from variants.checkpoints.hf_heads import _linear


class DistilBertClassifier(nn.Module):
    """``DistilBertForSequenceClassification``'s head (dropout off):
    ``classifier(relu(pre_classifier(h[:, 0])))``, (B, L, D) -> (B, n_labels)."""

    pooling = "cls"  # reads token 0 only (output selection may skip the others)

    def __init__(self, pre_classifier, classifier):
        super().__init__()
        self.pre_classifier, self.classifier = pre_classifier, classifier

    def __call__(self, last_hidden, attention_mask=None):
        return self.classifier(nn.relu(self.pre_classifier(last_hidden[:, 0])))


def build(model_type, config):
    """(DistilBertArgs, DistilBertEncoder) for ``config`` (a config.json dict)."""
    args = DistilBertArgs.from_config(config)
    return args, DistilBertEncoder(args)


def load_head(model_type, weights, args):
    """:class:`DistilBertClassifier` from ``pre_classifier.*`` and ``classifier.*``, or None
    when the file has no ``classifier.weight``; KeyError when the head is partly there."""
    if "classifier.weight" not in weights:
        return None
    return DistilBertClassifier(_linear(weights, "pre_classifier"), _linear(weights, "classifier"))

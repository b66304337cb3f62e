"""Loader of ALBERT checkpoints (:mod:`variants.checkpoints.architectures`):
:class:`variants.arch.albert.AlbertEncoder` (shared layer groups placed per layer) and BERT's
head (:class:`variants.checkpoints.hf_heads.BertClassifier`: ``AlbertForSequenceClassification``
is tanh(``albert.pooler``(h[:, 0])) -> ``classifier``)."""

from variants.arch.albert import AlbertArgs, AlbertEncoder, sanitize  # noqa: F401
from variants.checkpoints.hf_heads import BertClassifier, _linear


def build(model_type, config):
    """(AlbertArgs, AlbertEncoder) for ``config`` (a config.json dict)."""
    args = AlbertArgs.from_dict(dict(config, model_type=model_type))
    return args, AlbertEncoder(args)


def load_head(model_type, weights, args):
    """BERT's pooler + classifier from ``albert.pooler.*`` and ``classifier.*``, or None when
    the file has no ``classifier.weight``."""
    if "classifier.weight" not in weights:
        return None
    return BertClassifier(_linear(weights, "albert.pooler"), _linear(weights, "classifier"))

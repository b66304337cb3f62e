"""Loader of MPNet checkpoints (:mod:`variants.checkpoints.architectures`):
:class:`variants.arch.mpnet.MPNetEncoder` and ``MPNetForSequenceClassification``'s head
(``MPNetClassificationHead``: out_proj(tanh(dense(h[:, 0]))), the same math as RoBERTa's,
:class:`variants.checkpoints.hf_heads.RobertaClassifier`)."""

from variants.arch.mpnet import MPNetArgs, MPNetEncoder, sanitize  # noqa: F401  (the interface)
from variants.checkpoints.hf_heads import RobertaClassifier, _linear


def build(model_type, config):
    """(MPNetArgs, MPNetEncoder) for ``config`` (a config.json dict)."""
    args = MPNetArgs.from_dict(config)
    return args, MPNetEncoder(args)


def load_head(model_type, weights, args):
    """The ``classifier.dense`` / ``classifier.out_proj`` head in ``weights`` (transformers'
    names), or None when the file has none (a bare ``MPNetModel``, e.g. a sentence encoder).
    Raises KeyError when the head is partly present."""
    if "classifier.out_proj.weight" not in weights:
        return None
    return RobertaClassifier(_linear(weights, "classifier.dense"),
                             _linear(weights, "classifier.out_proj"))


def position_cap(model_type, config):
    """``max_position_embeddings - 2``: MPNet's positions start after ``padding_idx`` 1."""
    return int(config.get("max_position_embeddings", 512)) - 2

"""Loader of ELECTRA discriminator checkpoints (:mod:`variants.checkpoints.architectures`):
:class:`variants.arch.electra.ElectraEncoder` and :class:`ElectraClassifier`."""

import mlx.nn as nn

from variants.arch.electra import ElectraArgs, ElectraEncoder, sanitize  # noqa: F401
from variants.checkpoints.hf_heads import _linear


class ElectraClassifier(nn.Module):
    """``ElectraClassificationHead`` (dropout off): ``out_proj(gelu(dense(h[:, 0])))`` with the
    exact (erf) GELU, transformers' ``get_activation("gelu")`` (not BERT's tanh pooler),
    (B, L, D) -> (B, n_labels)."""

    pooling = "cls"  # reads token 0 only (output selection may skip the others)

    def __init__(self, dense, out_proj):
        super().__init__()
        self.dense, self.out_proj = dense, out_proj

    def __call__(self, last_hidden, attention_mask=None):
        return self.out_proj(nn.gelu(self.dense(last_hidden[:, 0])))


def build(model_type, config):
    """(ElectraArgs, ElectraEncoder) for ``config`` (a config.json dict)."""
    args = ElectraArgs.from_dict(dict(config, model_type=model_type))
    return args, ElectraEncoder(args)


def load_head(model_type, weights, args):
    """:class:`ElectraClassifier` from ``classifier.dense.*`` and ``classifier.out_proj.*``, or
    None when the file has no ``classifier.out_proj.weight``."""
    if "classifier.out_proj.weight" not in weights:
        return None
    return ElectraClassifier(_linear(weights, "classifier.dense"),
                             _linear(weights, "classifier.out_proj"))

"""Loader of ModernBERT checkpoints (:mod:`variants.checkpoints.architectures`):
:class:`variants.arch.modernbert.ModernBertEncoder` and
:class:`variants.checkpoints.hf_heads.ModernBertClassifier`."""

from variants.arch.modernbert import ModernBertArgs, ModernBertEncoder, sanitize  # noqa: F401
from variants.checkpoints import hf_heads


def build(model_type, config):
    """(ModernBertArgs, ModernBertEncoder) for ``config`` (a config.json dict)."""
    args = ModernBertArgs.from_dict(config)
    return args, ModernBertEncoder(args)


def load_head(model_type, weights, args):
    """:func:`variants.checkpoints.hf_heads.load_head`."""
    return hf_heads.load_head(model_type, weights, args)

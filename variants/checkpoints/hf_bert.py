"""Loader of BERT, RoBERTa and XLM-R checkpoints (:mod:`variants.checkpoints.architectures`):
:class:`variants.arch.encoder.BertEncoder` and the heads of
:mod:`variants.checkpoints.hf_heads`."""

from variants.arch.encoder import BertEncoder, ModelArgs, sanitize  # noqa: F401  (the interface)
from variants.checkpoints import hf_heads


def build(model_type, config):
    """(ModelArgs, BertEncoder) for ``config`` (a config.json dict)."""
    args = ModelArgs.from_dict(dict(config, model_type=model_type))
    return args, BertEncoder(args)


def load_head(model_type, weights, args):
    """:func:`variants.checkpoints.hf_heads.load_head`."""
    return hf_heads.load_head(model_type, weights, args)


def position_cap(model_type, config):
    """``max_position_embeddings``, less ``pad_token_id + 1`` for RoBERTa / XLM-R (their
    positions start after the pad id)."""
    cap = int(config.get("max_position_embeddings", 512))
    if model_type in ("roberta", "xlm-roberta"):
        cap -= int(config.get("pad_token_id", 1)) + 1
    return cap

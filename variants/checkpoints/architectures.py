"""Which module loads which Hugging Face ``model_type``: one registry line per architecture.

A loader module provides

- ``build(model_type, config) -> (args, encoder)``: the config dataclass and an unfilled
  encoder (``embed`` / ``context`` / ``apply_layer`` / ``finish`` / ``layers``, as
  :class:`variants.arch.encoder.BertEncoder`); raises KeyError / TypeError for a missing config
  key and ValueError (one line, naming the key and the fix) for a value it cannot compute;
- ``sanitize(weights) -> dict``: the checkpoint's (transformers') parameter names -> the
  encoder's, dropping the head and buffers (names the encoder's own ``load_weights`` places:
  ALBERT's shared ``groups.G.J.*`` go to every layer that runs them);
- ``load_head(model_type, weights, args) -> nn.Module | None``: the sequence-classification
  head from the un-renamed weights, called as ``head(last_hidden (B, L, D), mask (B, L))``;
- optionally ``position_cap(model_type, config) -> int``: the longest input its positions allow
  (default ``max_position_embeddings``).
"""

import importlib

#: model_type -> (loader module, class-name prefix of ``architectures[0]`` in config.json)
REGISTRY = {
    "bert": ("variants.checkpoints.hf_bert", "Bert"),
    "roberta": ("variants.checkpoints.hf_bert", "Roberta"),
    "xlm-roberta": ("variants.checkpoints.hf_bert", "XLMRoberta"),
    "modernbert": ("variants.checkpoints.hf_modernbert", "ModernBert"),
    "distilbert": ("variants.checkpoints.hf_distilbert", "DistilBert"),
    "electra": ("variants.checkpoints.hf_electra", "Electra"),
    "albert": ("variants.checkpoints.hf_albert", "Albert"),
    "mpnet": ("variants.checkpoints.hf_mpnet", "MPNet"),
    "deberta-v2": ("variants.checkpoints.hf_deberta", "DebertaV2"),
}


def supported():
    """The model_type names a checkpoint may have, in registry order."""
    return tuple(REGISTRY)


def from_architectures(archs):
    """The model_type of ``architectures[0]`` (e.g. ``XLMRobertaForSequenceClassification``) by
    its longest registered class-name prefix, or None."""
    if not archs:
        return None
    name = str(archs[0])
    hits = [(len(p), mt) for mt, (_, p) in REGISTRY.items() if name.startswith(p)]
    return max(hits)[1] if hits else None


def loader(model_type):
    """The loader module of a registered ``model_type`` (KeyError otherwise)."""
    return importlib.import_module(REGISTRY[model_type][0])


def position_cap(model_type, config):
    """The longest input (tokens) ``config``'s position table allows for ``model_type``."""
    mod = loader(model_type)
    if hasattr(mod, "position_cap"):
        return int(mod.position_cap(model_type, config))
    return int(config.get("max_position_embeddings", 512))

"""The shipped decision models: a registered name -> its model TOML next to this file, and the
parsed TOML (:mod:`variants.models.model_config`). Read by :mod:`variants.models` (the registry's face)
and by :mod:`variants.models.configured` (a bare factory asks minilm-sentiment's question)."""

from pathlib import Path

MODELS = {
    "minilm-sentiment": "minilm-sentiment.toml",
    "minilm-choice": "minilm-choice.toml",
}


def shipped_config(name):
    """The parsed shipped TOML of registered model ``name`` (a ModelConfig)."""
    from variants.models.model_config import load_model_config

    return load_model_config(Path(__file__).with_name(MODELS[name]))

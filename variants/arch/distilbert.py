"""DistilBERT (Sanh et al. 2019) in MLX: BERT's post-norm layers
(:class:`variants.arch.encoder.TransformerLayer`, same math: softmax(q kᵀ / √d) v, LN(x + attn),
LN(x + FFN)) under word + position embeddings with no token-type table, as ``transformers``'
``DistilBertModel`` (positions 0..L-1, every LayerNorm eps 1e-12, ``activation`` gelu (erf) or
relu). The per-layer interface (``embed`` / ``context`` / ``apply_layer`` / ``finish`` /
``layers``) is :class:`variants.arch.encoder.BertEncoder`'s, so every family acts on it as on
BERT."""

import re
from dataclasses import dataclass

import mlx.nn as nn

from variants.arch.encoder import BertEncoder, LayerNorm, ModelArgs, TransformerLayer

#: DistilBERT's config.json key -> :class:`ModelArgs`' (transformers' ``attribute_map``)
CONFIG_KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers",
               "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size",
               "activation": "hidden_act"}


@dataclass
class DistilBertArgs(ModelArgs):
    """:class:`ModelArgs` read from a DistilBERT config.json (``dim``, ``n_layers``,
    ``n_heads``, ``hidden_dim``, ``activation``; transformers' attribute names are accepted
    too). No token-type table; LayerNorm eps is 1e-12 (fixed in transformers)."""

    type_vocab_size: int = 0
    model_type: str = "distilbert"

    @classmethod
    def from_config(cls, config):
        """From a config.json dict. Raises KeyError naming a missing DistilBERT key (``dim``,
        ``n_layers``, ``n_heads``, ``hidden_dim``, ``vocab_size``), ValueError for an
        activation this encoder does not compute."""
        params = {"model_type": "distilbert", "layer_norm_eps": 1e-12, "type_vocab_size": 0,
                  "hidden_act": config.get("activation", config.get("hidden_act", "gelu"))}
        for theirs, ours in CONFIG_KEYS.items():
            if theirs == "activation":
                continue
            if theirs not in config and ours not in config:
                raise KeyError(theirs)
            params[ours] = config[theirs] if theirs in config else config[ours]
        for key in ("vocab_size", "max_position_embeddings", "pad_token_id"):
            if key in config:
                params[key] = config[key]
        if "vocab_size" not in params:
            raise KeyError("vocab_size")
        return cls(**params)


class DistilBertEmbeddings(nn.Module):
    """LayerNorm(word + position) (B, L) -> (B, L, D); token types are ignored (DistilBERT has
    no table for them)."""

    def __init__(self, args):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.norm = LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, input_ids, token_type_ids, position_ids):
        return self.norm(self.word_embeddings(input_ids) + self.position_embeddings(position_ids))


class DistilBertEncoder(BertEncoder):
    """:class:`BertEncoder` with :class:`DistilBertEmbeddings`: called with ``input_ids``
    (B, L) int32 and ``attention_mask`` (B, L) 0/1 (``token_type_ids`` accepted and ignored);
    returns :class:`variants.arch.encoder.EncoderOutput`."""

    def __init__(self, args: DistilBertArgs):
        super(BertEncoder, self).__init__()
        self.args = args
        self.embeddings = DistilBertEmbeddings(args)
        self.layers = [TransformerLayer(args) for _ in range(args.num_hidden_layers)]


#: transformers' DistilBERT names (after the ``distilbert.`` prefix) -> this module's
_RENAMES = (
    (r"^transformer\.layer\.(\d+)\.", r"layers.\1."),
    (r"\.attention\.q_lin\.", ".attention.query."),
    (r"\.attention\.k_lin\.", ".attention.key."),
    (r"\.attention\.v_lin\.", ".attention.value."),
    (r"\.attention\.out_lin\.", ".attention.out."),
    (r"\.sa_layer_norm\.", ".attention_norm."),
    (r"\.ffn\.lin1\.", ".intermediate."),
    (r"\.ffn\.lin2\.", ".output."),
    (r"\.output_layer_norm\.", ".output_norm."),
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
)


def sanitize(weights):
    """transformers' DistilBERT parameter names -> this module's (pure): strips ``distilbert.``,
    drops the heads (``pre_classifier`` / ``classifier`` / ``vocab_*`` / ``qa_outputs``) and the
    ``position_ids`` buffer."""
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("distilbert.")
        if (name.startswith(("pre_classifier.", "classifier.", "vocab_", "qa_outputs."))
                or name.endswith("position_ids")):
            continue
        for old, new in _RENAMES:
            name = re.sub(old, new, name)
        out[name] = w
    return out

"""ELECTRA's discriminator (Clark et al. 2020) in MLX: BERT's embeddings at width
``embedding_size`` (E), then ``embeddings_project`` (a Linear E -> hidden_size) when E differs
from hidden_size, then BERT's post-norm layers (:class:`variants.arch.encoder.TransformerLayer`),
as ``transformers``' ``ElectraModel`` (positions 0..L-1, token types, LayerNorm eps
``layer_norm_eps``). The per-layer interface is :class:`variants.arch.encoder.BertEncoder`'s.

:class:`FactorisedEmbeddings` (tables of width E, LayerNorm, projection to hidden_size) is
also ALBERT's (:mod:`variants.arch.albert`)."""

import re
from dataclasses import dataclass

import mlx.nn as nn

from variants.arch.encoder import BertEncoder, LayerNorm, ModelArgs, TransformerLayer


def check_absolute_positions(kind):
    """ValueError (one line) unless ``position_embedding_type`` ``kind`` is ``absolute`` (what
    transformers 4.x wrote; 5.x dropped the relative kinds): relative attention scores are not
    computed here, and ignoring the key would give wrong outputs silently."""
    if kind not in (None, "absolute"):
        raise ValueError(f"position_embedding_type {kind!r} is not supported (absolute position "
                         "tables only; relative attention scores are not computed here); use a "
                         "checkpoint trained with absolute positions")


@dataclass
class ElectraArgs(ModelArgs):
    """:class:`ModelArgs` plus ``embedding_size`` (E, transformers' default 128) and
    ``position_embedding_type`` (``absolute`` only, else ValueError)."""

    embedding_size: int = 128
    model_type: str = "electra"
    position_embedding_type: str = "absolute"

    def __post_init__(self):
        super().__post_init__()
        check_absolute_positions(self.position_embedding_type)


class FactorisedEmbeddings(nn.Module):
    """Word + position + token-type tables of width ``embedding_size`` E, a LayerNorm over E,
    then ``project`` (Linear E -> hidden_size D) when ``project`` is set: (B, L) ids ->
    (B, L, D) float32. ELECTRA (projection only when E != D) and ALBERT (always)."""

    def __init__(self, args, project):
        super().__init__()
        E = args.embedding_size
        self.word_embeddings = nn.Embedding(args.vocab_size, E)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, E)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, E)
        self.norm = LayerNorm(E, eps=args.layer_norm_eps)
        if project:
            self.project = nn.Linear(E, args.hidden_size)

    def __call__(self, input_ids, token_type_ids, position_ids):
        x = self.norm(self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
                      + self.position_embeddings(position_ids))
        return self.project(x) if "project" in self else x


class ElectraEncoder(BertEncoder):
    """:class:`BertEncoder` with :class:`FactorisedEmbeddings` (projected when
    ``embedding_size != hidden_size``): called with ``input_ids`` (B, L) int32,
    ``attention_mask`` (B, L) 0/1, optional ``token_type_ids``; returns
    :class:`variants.arch.encoder.EncoderOutput`; ``embed`` gives the projected (B, L, D)."""

    def __init__(self, args: ElectraArgs):
        super(BertEncoder, self).__init__()
        self.args = args
        self.embeddings = FactorisedEmbeddings(args, args.embedding_size != args.hidden_size)
        self.layers = [TransformerLayer(args) for _ in range(args.num_hidden_layers)]


#: transformers' BERT-layer names -> this module's (ELECTRA's layers are BERT's)
BERT_LAYER_RENAMES = (
    (r"\.attention\.self\.(query|key|value)\.", r".attention.\1."),
    (r"\.attention\.output\.dense\.", ".attention.out."),
    (r"\.attention\.output\.LayerNorm\.", ".attention_norm."),
    (r"\.intermediate\.dense\.", ".intermediate."),
    (r"\.output\.dense\.", ".output."),
    (r"\.output\.LayerNorm\.", ".output_norm."),
)
_RENAMES = ((r"^encoder\.layer\.(\d+)\.", r"layers.\1."), *BERT_LAYER_RENAMES,
            (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
            (r"^embeddings_project\.", "embeddings.project."))


def sanitize(weights):
    """transformers' ELECTRA parameter names -> this module's (pure): strips ``electra.``,
    drops the heads (``classifier.*``, ``discriminator_predictions.*``,
    ``generator_*``) and buffers (``position_ids``, ``token_type_ids``)."""
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("electra.")
        if (name.startswith(("classifier.", "discriminator_predictions.", "generator_",
                             "qa_outputs.", "sequence_summary."))
                or name.endswith(("position_ids", "embeddings.token_type_ids"))):
            continue
        for old, new in _RENAMES:
            name = re.sub(old, new, name)
        out[name] = w
    return out

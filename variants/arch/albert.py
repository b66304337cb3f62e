"""ALBERT (Lan et al. 2020) in MLX: factorised embeddings (tables of width ``embedding_size``,
LayerNorm, then ``encoder.embedding_hidden_mapping_in``, a Linear to hidden_size) and
cross-layer parameter sharing, as ``transformers``' ``AlbertModel``: ``num_hidden_layers``
passes, pass i running layer group ``int(i / (num_hidden_layers / num_hidden_groups))``, each
group ``inner_group_num`` post-norm layers of BERT's shape (activation ``hidden_act``, default
``gelu_new``, the tanh form).

Each applied layer is its own :class:`variants.arch.encoder.TransformerLayer`
(``num_hidden_layers * inner_group_num`` of them, in the order they run), so every family acts
per layer (pruning after layer i, an exit after layer i, a per-layer bit width) exactly as on
BERT; ``hidden_states`` then has one entry per applied layer (transformers' has one per pass,
which is the same when ``inner_group_num`` is 1, the only value of the released checkpoints).
:meth:`AlbertEncoder.load_weights` places each shared group's weights on every layer that runs
it: the same ``mx.array`` objects, so the reference stores them once and
:func:`variants.runtime.memory.model_bytes` (unique arrays) counts them once. A family that
rewrites the layers (quantization, low rank, ...) writes one copy per layer, and its size is
then the size of those copies: an 8-bit ALBERT with 12 passes over one group is reported (and
exported) as 12 quantized layers, which can be larger than the shared fp32 reference.

The fast paths' derived weights (folded q|k|v, transposed MLP, per-stream shards:
:class:`variants.runtime.derived.DerivedWeights`) are likewise kept once per group
(:class:`GroupCache`), in the reference and in its deep copies (a pruned or early-exit variant):
per-layer caches would hold ``num_hidden_layers / num_hidden_groups`` copies of them, 12 x 28 MB
for ALBERT-base, 12 x 0.8 GB for ALBERT-xxlarge."""

import copy
import re
from dataclasses import dataclass

from variants.arch.electra import FactorisedEmbeddings, check_absolute_positions
from variants.arch.encoder import BertEncoder, ModelArgs, TransformerLayer
from variants.runtime.derived import DerivedWeights

_GROUP = re.compile(r"^groups\.(\d+)\.(\d+)\.(.*)$")


@dataclass
class AlbertArgs(ModelArgs):
    """:class:`ModelArgs` plus ``embedding_size`` (E), ``num_hidden_groups``,
    ``inner_group_num`` and ``position_embedding_type`` (``absolute`` only); defaults are
    transformers' ``AlbertConfig``'s (``hidden_act`` gelu_new, E 128, one group of one layer)."""

    hidden_act: str = "gelu_new"
    model_type: str = "albert"
    embedding_size: int = 128
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    position_embedding_type: str = "absolute"

    def __post_init__(self):
        super().__post_init__()
        check_absolute_positions(self.position_embedding_type)
        for key in ("num_hidden_layers", "num_hidden_groups", "inner_group_num"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{key} {getattr(self, key)} must be at least 1; use the "
                                 "config.json saved with these weights")
        if self.num_hidden_groups > self.num_hidden_layers:
            raise ValueError(f"num_hidden_groups ({self.num_hidden_groups}) exceeds "
                             f"num_hidden_layers ({self.num_hidden_layers}): some groups would "
                             "never run; use the config.json saved with these weights")

    def group_of(self, i):
        """The layer group that pass ``i`` (0..num_hidden_layers-1) runs (transformers' own
        float arithmetic)."""
        return int(i / (self.num_hidden_layers / self.num_hidden_groups))

    def shared(self, group, inner):
        """Indices into ``AlbertEncoder.layers`` that hold group ``group``'s layer ``inner``."""
        n = self.inner_group_num
        return [i * n + inner for i in range(self.num_hidden_layers) if self.group_of(i) == group]


class GroupStore:
    """Derived weights of the layers that run one ALBERT group, by the identity of the arrays
    they were built from (at most ``limit`` entries, oldest dropped first). A deep copy starts
    empty; the copies of one group's layers share it (``copy.deepcopy``'s memo)."""

    def __init__(self, limit):
        self.entries, self.limit = {}, limit

    def __deepcopy__(self, memo):
        return GroupStore(self.limit)

    def get(self, sources, build):
        """The arrays built from ``sources`` (arrays, or ints such as a shard count), built by
        ``build()`` on first use."""
        key = tuple(s if isinstance(s, (int, float, str)) else id(s) for s in sources)
        hit = self.entries.get(key)
        if hit is None:
            if len(self.entries) >= self.limit:
                self.entries.pop(next(iter(self.entries)))
            hit = self.entries[key] = (tuple(sources), build())  # sources kept: ids stay theirs
        return hit[1]


class GroupCache(DerivedWeights):
    """A layer's :class:`variants.runtime.derived.DerivedWeights` that looks in its group's
    :class:`GroupStore`: layers whose weights are the same arrays get the same derived arrays;
    a layer whose weights were replaced gets its own entry (the others keep theirs, no
    rebuilding back and forth). ``clear`` drops nothing (an entry is only ever returned for its
    own sources)."""

    def __init__(self, store):
        self.store = store

    def __deepcopy__(self, memo):
        return GroupCache(copy.deepcopy(self.store, memo))

    def clear(self):
        pass

    def get(self, sources, build):
        return self.store.get(sources, build)


class AlbertEncoder(BertEncoder):
    """:class:`BertEncoder` with :class:`variants.arch.electra.FactorisedEmbeddings` (always
    projected) and ``num_hidden_layers * inner_group_num`` layers holding the shared groups'
    weights: called with ``input_ids`` (B, L) int32, ``attention_mask`` (B, L) 0/1, optional
    ``token_type_ids``; returns :class:`variants.arch.encoder.EncoderOutput`."""

    def __init__(self, args: AlbertArgs):
        super(BertEncoder, self).__init__()
        self.args = args
        self.embeddings = FactorisedEmbeddings(args, True)
        self.layers = [TransformerLayer(args)
                       for _ in range(args.num_hidden_layers * args.inner_group_num)]
        for g in range(args.num_hidden_groups):
            for j in range(args.inner_group_num):
                sharers = args.shared(g, j)
                store = GroupStore(3 * len(sharers))  # folded, MLP and shards per layer
                for i in sharers:
                    layer = self.layers[i]
                    layer.attention._folded = GroupCache(store)
                    layer._mlp, layer._shards = GroupCache(store), GroupCache(store)

    def load_weights(self, file_or_weights, strict=True):
        """``nn.Module.load_weights`` that also reads :func:`sanitize`'s shared names
        (``groups.G.J.<param>``: group G's layer J), placing each array on every layer that
        runs it (:meth:`AlbertArgs.shared`); per-layer names (``layers.N.<param>``, as an
        exported variant stores them) load as they are. Raises ValueError for a group or
        inner layer the config does not have."""
        weights = file_or_weights
        if isinstance(weights, str):
            import mlx.core as mx
            weights = list(mx.load(weights).items())
        out = []
        for name, w in weights:
            m = _GROUP.match(name)
            if m is None:
                out.append((name, w))
                continue
            g, j, rest = int(m.group(1)), int(m.group(2)), m.group(3)
            if g >= self.args.num_hidden_groups or j >= self.args.inner_group_num:
                raise ValueError(f"{name} is outside the config's {self.args.num_hidden_groups} "
                                 f"group(s) of {self.args.inner_group_num} layer(s)")
            out += [(f"layers.{i}.{rest}", w) for i in self.args.shared(g, j)]
        return super().load_weights(out, strict=strict)


_RENAMES = ((r"^encoder\.albert_layer_groups\.(\d+)\.albert_layers\.(\d+)\.",
             r"groups.\1.\2."),
            (r"\.attention\.dense\.", ".attention.out."),
            (r"\.attention\.LayerNorm\.", ".attention_norm."),
            (r"\.ffn\.", ".intermediate."),
            (r"\.ffn_output\.", ".output."),
            (r"\.full_layer_layer_norm\.", ".output_norm."),
            (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
            (r"^encoder\.embedding_hidden_mapping_in\.", "embeddings.project."))


def sanitize(weights):
    """transformers' ALBERT parameter names -> this module's (pure): strips ``albert.``, names
    group G's layer J ``groups.G.J.*`` (:meth:`AlbertEncoder.load_weights` places them), drops
    the heads (``pooler``, ``classifier``, ``predictions``, ``sop_classifier``) and buffers."""
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("albert.")
        if (name.startswith(("pooler.", "classifier.", "predictions.", "sop_classifier.",
                             "qa_outputs."))
                or name.endswith(("position_ids", "embeddings.token_type_ids"))):
            continue
        for old, new in _RENAMES:
            name = re.sub(old, new, name)
        out[name] = w
    return out

"""The search's units: every tensor of a decision model that the quant family may store at its own
width, whatever the model kind (``classifier``, ``linear-head``, ``cosine``, ``marker``, a
factory's network).

In forward order: the embedding tables (``nn.Embedding``, stored as ``nn.QuantizedEmbedding``:
word, position and token-type tables are one unit each; with ``unseen_rows`` the word table's
rows unseen in the fit texts are one more, ``<table>@unseen``: :mod:`variants.search.format_sens`), the encoder's Linears
(:func:`variants.arch.activations.target_linears`), any other Linear outside the head (as the quant
builder quantizes it), then the decision head's Linears when the user allows it
(``--quantize-head``; the head by role, :func:`variants.models.heads.head_paths`). A tensor whose input
size the group size does not divide stays as it is and is listed with the reason. Each unit is one key of a
candidate's map and one ``^path$`` entry of the ``--bits-map`` that re-runs it as a sweep variant.
"""

from dataclasses import dataclass, field


@dataclass
class Units:
    """``paths``: the units, forward order; ``heads``: the head's module paths; ``head_why``:
    why they are the head; ``kept``: ``[(path, reason)]`` of tensors left as they are."""

    paths: list
    heads: tuple
    head_why: str
    kept: list = field(default_factory=list)

    def embeddings(self, module):
        """The units that are embedding tables."""
        import mlx.nn as nn

        mods = dict(module.named_modules())
        return [p for p in self.paths if isinstance(mods[p], nn.Embedding)]


def search_units(module, model=None, *, group_size=64, embeddings=True, quantize_head=False,
                 unseen_rows=False):
    """The :class:`Units` of ``module`` (the reference's network; ``model`` its DecisionModel,
    for a declared head).

    Raises
    ------
    ValueError
        No unit is left (every tensor's input size indivisible by ``group_size``: names
        ``--group-size`` and a size that works).
    """
    import mlx.nn as nn

    from variants.arch.activations import target_linears
    from variants.models.heads import head_paths, in_head

    heads, why = head_paths(module, model)
    mods = module.named_modules()
    emb = [p for p, m in mods if isinstance(m, nn.Embedding) and not in_head(p, heads)]
    enc = target_linears(module)
    head = [p for p, m in mods if isinstance(m, nn.Linear) and in_head(p, heads)]
    kept = []
    if not embeddings:
        kept += [(p, "embeddings kept full precision (--no-quantize-embeddings)") for p in emb]
        emb = []
    if not quantize_head:
        kept += [(p, why) for p in head]
        head = []
    others = [p for p, m in mods if type(m) is nn.Linear and p not in enc and
              not in_head(p, heads)]
    mods = dict(mods)
    paths = []
    for p in [*sorted(emb), *enc, *sorted(others), *sorted(head)]:
        if mods[p].weight.shape[1] % group_size:
            kept.append((p, f"input size {mods[p].weight.shape[1]} not divisible by group size "
                            f"{group_size}"))
        else:
            paths.append(p)
    if not paths:
        raise ValueError(f"--group-size {group_size} divides the input size of no tensor of this "
                         "model; pass --group-size 32")
    if unseen_rows:  # the word table's rows unseen in the fit texts: a unit of their own
        from variants.families.quant.build import word_tables
        from variants.layer_maps.bits_map import UNSEEN

        for t in word_tables(module):
            if t in paths:
                paths.insert(paths.index(t) + 1, t + UNSEEN)
    return Units(paths, heads, why, kept)

"""The decision head by role, not by name: which modules of a decision model's network turn the
encoder's states into option logits.

A model may declare its head (``head_modules``: a tuple of module paths, as a class attribute of
its :class:`~variants.models.decision.DecisionModel` or of its ``nn.Module``); otherwise the head is
every top-level submodule of the network other than ``encoder`` (the encoder's own layers and
embeddings are the body): ``head`` (``linear-head``), ``classifier`` (``classifier``: BERT's
pooler + classifier, RoBERTa's ``dense`` + ``out_proj``, ModernBERT's head), ``scorer``
(``marker``), a factory network's own layers (``proto`` in ``examples/own_model.py``); the
``cosine`` kind has none, nor has a network without an ``encoder`` child (nothing to be outside
of). Every family keeps the head full precision unless the user asks
(``--quantize-head``), because the head is where a small weight error becomes a changed answer
directly (no later layer averages it out), and it is a negligible share of the bytes.
"""

#: the reason recorded (build.json ``skipped``) for each way a head is found
DECLARED = "decision head (declared by the model's head_modules) kept full precision"
DEFAULT = "decision head (outside the encoder) kept full precision"


def head_paths(module, model=None):
    """``(paths, reason)``: the head's module paths (tuple of str, sorted) and the sentence
    that says why they are the head (:data:`DECLARED` or :data:`DEFAULT`).

    Parameters
    ----------
    module : mlx.nn.Module
        The decision model's network (``DecisionModel.module``).
    model : variants.models.decision.DecisionModel, optional
        Its ``head_modules`` (when set) wins over the module's.

    Raises
    ------
    ValueError
        A declared path that names no submodule of ``module`` (names the attribute and the fix).
    """
    declared = getattr(model, "head_modules", None) if model is not None else None
    if declared is None:
        declared = getattr(module, "head_modules", None)
    if declared is not None:
        names = {p for p, _ in module.named_modules()}
        bad = [p for p in declared if p not in names]
        if bad:
            raise ValueError(f"head_modules names {bad[0]!r}, which is not a submodule of the "
                             f"model's network; list module paths such as "
                             f"{sorted(n for n in names if n and '.' not in n)}")
        return tuple(sorted(declared)), DECLARED
    children = module.children()
    if "encoder" not in children:  # no encoder to be outside of: no head by default
        return (), DEFAULT
    paths = sorted(name for name, child in children.items()
                   if name != "encoder" and _has_params(child))
    return tuple(paths), DEFAULT


def _has_params(x):
    import mlx.nn as nn

    if isinstance(x, nn.Module):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_params(v) for v in x)
    if isinstance(x, dict):
        return any(_has_params(v) for v in x.values())
    return False


def in_head(path, heads):
    """Whether module ``path`` is one of ``heads`` or inside one."""
    return any(path == h or path.startswith(h + ".") for h in heads)

"""A variant whose decision module is wrapped by a run-time rule (token pruning,
:class:`variants.families.prune.build.PrunedNet`; early exit,
:class:`variants.families.exit.net.ExitNet`) in a weights folder
(:mod:`variants.families.artifact`): the wrapper's settings as the ``mlx_variants.wrapper``
block of ``config.json`` (:func:`wrapper_block`) and the wrapper put back around the loaded
module (:func:`place_wrapper`).

The wrapped (inner) module is written as any plain variant is (packed quantized, factored or
int8 Linears under transformers' names). The block is one of

- ``{"kind": "prune", "points": [[layer, keep ratio], ...], "score": "received" | "cls",
  "protected_ids": [token id, ...]}`` (PoWER-BERT token pruning, Goyal et al. 2020);
- ``{"kind": "exit", "layers": [1-based layer, ...], "rule", "threshold": float,
  "head_kind": "linear" | "cosine", "temperatures": {"K": T}, "heads": [{"in", "out",
  "bias"}, ...], "prune": None | {"points", "score", "protected_ids"}}`` (early exit; DeeBERT /
  PABEE rules). The exit heads are fp32 ``nn.Linear`` (D -> K, or D -> D for cosine heads),
  stored by the wrapper's own module paths ``exit_heads.<i>.weight`` / ``.bias`` in
  ``decision_head.safetensors`` (no transformers name; :data:`PREFIX`).

A module the code does not know how to write (another wrapper, a wrapper around a wrapper, a
head that is not a plain Linear) raises ValueError in one line. Only this package's loader
(:func:`variants.families.artifact.load_variant`) runs the rule; plain MLX reads the encoder.
"""

#: the wrapper kinds the block holds
KINDS = ("prune", "exit")
#: the stored names of the wrapper's own tensors start with this (ExitNet's module paths)
PREFIX = "exit_heads."


def _prune_block(points, score, protected_ids):
    return {"points": [[int(a), float(r)] for a, r in points], "score": str(score),
            "protected_ids": [int(i) for i in protected_ids]}


def wrapper_block(module):
    """``(inner, block, tensors)`` of a decision ``module``: the plain module a wrapper wraps
    (``module`` itself when it is not wrapped), the JSON-able block describing the wrapper
    (module docstring; None when not wrapped) and ``{stored name: mx.array}`` of the wrapper's
    own tensors (the exit heads, float32; empty for pruning).

    Raises
    ------
    ValueError
        A wrapper of another type, a wrapper whose ``base`` is itself wrapped, an exit head
        that is not a plain ``nn.Linear``.
    """
    import mlx.nn as nn

    from variants.families.exit.net import ExitNet
    from variants.families.prune.build import PrunedNet

    if isinstance(module, PrunedNet):
        block = dict(kind="prune", **_prune_block(module._points, module._score,
                                                  module._protected_ids))
        tensors = {}
    elif isinstance(module, ExitNet):
        heads, tensors = [], {}
        for i, h in enumerate(module.exit_heads):
            if type(h) is not nn.Linear:
                raise ValueError(f"exit head {i} is a {type(h).__name__}, not a plain Linear; "
                                 "a weights folder stores fp32 exit heads only")
            o, n = h.weight.shape
            heads.append({"in": int(n), "out": int(o), "bias": "bias" in h})
            tensors.update({f"{PREFIX}{i}.{k}": h[k] for k in ("weight", "bias") if k in h})
        prune = getattr(module, "_prune", None)
        block = {"kind": "exit", "layers": [int(a) for a in module._layers],
                 "rule": module._rule, "threshold": float(module._threshold),
                 "head_kind": module._kind,
                 "temperatures": {str(k): float(v) for k, v in module._temperatures.items()},
                 "heads": heads,
                 "prune": None if prune is None else _prune_block(
                     prune["points"], prune["score"], prune["protected_ids"])}
    elif hasattr(module, "base") and isinstance(getattr(module, "base"), nn.Module):
        raise ValueError(f"the decision module is a {type(module).__name__} wrapping a model; "
                         "a weights folder stores token pruning (PrunedNet) and early exit "
                         "(ExitNet) wrappers only")
    else:
        return module, None, {}
    if isinstance(module.base, (PrunedNet, ExitNet)):
        raise ValueError(f"a {type(module).__name__} wraps a {type(module.base).__name__}; a "
                         "weights folder stores one wrapper around a plain module")
    return module.base, block, tensors


def check_block(value):
    """``value`` (a folder's ``mlx_variants.wrapper``; None = not wrapped) checked. Raises
    ValueError (naming what is wrong) unless it is a block :func:`wrapper_block` writes."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("kind") not in KINDS:
        raise ValueError(f"wrapper is not a {{kind: {' | '.join(KINDS)}, ...}} block")
    need = (("points", "score", "protected_ids") if value["kind"] == "prune" else
            ("layers", "rule", "threshold", "head_kind", "temperatures", "heads"))
    missing = [k for k in need if k not in value]
    if missing:
        raise ValueError(f"wrapper block of kind {value['kind']} has no {', '.join(missing)}")
    if value["kind"] == "exit" and len(value["heads"]) != len(value["layers"]):
        raise ValueError(f"wrapper block has {len(value['heads'])} exit heads for "
                         f"{len(value['layers'])} exit layers")
    if value["kind"] == "prune":
        _check_prune(value, "wrapper")
    else:
        from variants.families.exit.rules import RULES

        if value["rule"] not in RULES or value["head_kind"] not in ("linear", "cosine"):
            raise ValueError(f"wrapper's exit rule {value['rule']!r} / head kind "
                             f"{value['head_kind']!r} is not one of {RULES} / linear, cosine")
        if value.get("prune") is not None:
            _check_prune(value["prune"], "wrapper's prune")
    return value


def _check_prune(p, what):
    """Raise ValueError unless ``p`` is a ``{points, score, protected_ids}`` block."""
    from variants.families.prune.config import SCORES

    ok = (isinstance(p, dict) and isinstance(p.get("points"), list) and p["points"]
          and all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], int)
                  and isinstance(x[1], (int, float)) and 0 < x[1] <= 1 for x in p["points"])
          and p.get("score") in SCORES and isinstance(p.get("protected_ids"), list)
          and all(isinstance(i, int) for i in p["protected_ids"]))
    if not ok:
        raise ValueError(f"{what} is not a {{points: [[layer, keep ratio in (0, 1]]], score: "
                         f"{' | '.join(SCORES)}, protected_ids: [int]}} block")


def check_layers_in(block, n_layers):
    """Raise ValueError when a pruning layer of ``block`` lies outside [1, ``n_layers``)."""
    p = block if block["kind"] == "prune" else block.get("prune")
    for a, _ in (p or {}).get("points", []):
        if not 1 <= a < n_layers:
            raise ValueError(f"wrapper prunes after layer {a}, outside [1, {n_layers}) for this "
                             f"{n_layers}-layer encoder")


def split_tensors(weights):
    """``(inner, own)``: the loaded ``{path: array}`` of a folder split into the inner module's
    and the wrapper's own (:data:`PREFIX`)."""
    own = {k: v for k, v in weights.items() if k.startswith(PREFIX)}
    return {k: v for k, v in weights.items() if k not in own}, own


def place_wrapper(module, block, tensors):
    """The wrapper ``block`` (:func:`wrapper_block`'s) around the loaded plain ``module``, its
    exit heads filled strictly from ``tensors`` (``{"exit_heads.<i>.weight": array, ...}``);
    ``module`` itself when ``block`` is None.

    Raises
    ------
    ValueError
        A head tensor missing, of another shape, or left over.
    """
    import mlx.nn as nn

    from variants.families.exit.net import ExitNet
    from variants.families.prune.build import PrunedNet

    if block is None:
        if tensors:
            raise ValueError(f"{sorted(tensors)[0]} is stored but config.json has no wrapper")
        return module
    check_layers_in(block, len(module.encoder.layers))
    if block["kind"] == "prune":
        if tensors:
            raise ValueError(f"{sorted(tensors)[0]} is stored but token pruning has no tensors")
        return PrunedNet(module, [tuple(p) for p in block["points"]], score=block["score"],
                         protected_ids=block["protected_ids"])
    heads, used = [], set()
    for i, e in enumerate(block["heads"]):
        h = nn.Linear(int(e["in"]), int(e["out"]), bias=bool(e["bias"]))
        mine = [(k, f"{PREFIX}{i}.{k}") for k in (("weight", "bias") if e["bias"]
                                                  else ("weight",))]
        gone = [name for _, name in mine if name not in tensors]
        if gone:
            raise ValueError(f"{gone[0]} is missing (config.json lists exit head {i})")
        for k, name in mine:
            if tuple(tensors[name].shape) != tuple(h[k].shape):
                raise ValueError(f"{name} has shape {tuple(tensors[name].shape)}, exit head {i} "
                                 f"is {tuple(h[k].shape)}")
        h.load_weights([(k, tensors[name]) for k, name in mine], strict=True)
        used.update(name for _, name in mine)
        heads.append(h)
    extra = sorted(set(tensors) - used)
    if extra:
        raise ValueError(f"{extra[0]} is stored but config.json lists no such exit head")
    kw = {}
    if block.get("prune") is not None:  # token pruning inside the exit loop (composed variants)
        p = block["prune"]
        kw["prune"] = {"points": [list(x) for x in p["points"]], "score": p["score"],
                       "protected_ids": list(p["protected_ids"])}
    return ExitNet(module, heads, block["layers"], block["rule"], block["threshold"],
                   kind=block["head_kind"], temperatures=block["temperatures"], **kw)

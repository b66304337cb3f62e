"""One composed variant: the pieces of a recipe (:mod:`variants.families.composed.recipe`)
applied in one fixed order, each by its own family's builder on the previous step's model.

The order, and why:

1. **Linears** — what each encoder Linear runs as: ``lowrank`` (factored; with ``q`` its ranks
   round to whole quant groups and the factors and every other Linear are quantized by the
   low-rank builder itself), else ``q`` (weight-only, :func:`variants.families.quant.build`),
   else ``w8a8`` (W8A8 on integer GEMMs, :func:`variants.families.w8a8.build.build`, always in
   the sweep's speed mode: the model that runs is judged). Weights change first so that every
   later piece (exit thresholds, pruning's attention scores) sees the weights that run.
2. **Embeddings** (``emb``) — the embedding tables quantized (``mx.quantize``, group
   ``group_size``; the decision head never), a lookup, independent of the Linears.
3. **Token pruning** (``prune``) — :class:`variants.families.prune.build.PrunedNet` around the
   module from 1-2, scoring tokens with that module's own attention.
4. **Early exit** (``exit``) — heads distilled from, and the threshold fitted to agree with,
   the module from 1-2 (the previous step is the exit family's "reference"; the contract still
   judges against the true reference). With ``prune`` too the exit net prunes inside its own
   layer loop (:class:`variants.families.exit.net.ExitNet`'s ``prune``): its heads were
   distilled on unpruned states and its threshold fitted without pruning, and the contract
   judges the pruned-and-exiting model that runs.

5. **Exact savings** (``exact``) — the exact family's de-duplication (and result cache) around
   everything above: rows equal in a call (or seen before) are computed once, so its outputs are
   the composed model's; its worth is priced by the traffic's repeat rate (the sweep's
   workload streams, :mod:`variants.families.exact.workload`).

Every step is the family's own builder, so a composed variant is judged and timed like any
variant: the contract's clauses see only its outputs.
"""

import copy

from variants.families.composed.recipe import ORDER, check


def _quantize_embeddings(model, bits, group_size, mode):
    """``model`` with its embedding tables (not the head's) quantized; (variant, info)."""
    import mlx.core as mx
    import mlx.nn as nn

    from variants.models import heads as heads_mod
    from variants.runtime import qlinear

    module = copy.deepcopy(model.module)
    heads, _ = heads_mod.head_paths(module, model)
    chosen = [p for p, m in module.named_modules()
              if isinstance(m, nn.Embedding) and not heads_mod.in_head(p, heads)
              and m.weight.shape[1] % group_size == 0]
    if not chosen:
        raise ValueError(f"--compose emb:{bits}: no embedding table's width is divisible by "
                         f"group size {group_size}; drop emb or pass another --group-size")
    from mlx.utils import tree_flatten

    total = sum(v.nbytes for _, v in tree_flatten(module.parameters()))
    before = sum(dict(module.named_modules())[p].weight.nbytes for p in chosen)
    if mode == "native":
        nn.quantize(module, group_size=group_size, bits=bits,
                    class_predicate=lambda p, m: p in chosen)
        qlinear.use_cpu_path(module)
        mods = dict(module.named_modules())
        after = sum(mods[p].weight.nbytes + mods[p].scales.nbytes + mods[p].biases.nbytes
                    for p in chosen)
    else:
        mods, after = dict(module.named_modules()), 0
        for p in chosen:
            w = mods[p].weight
            q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
            mods[p].weight = mx.dequantize(q, s, b, group_size=group_size, bits=bits)
            after += q.nbytes + s.nbytes + b.nbytes
    mx.eval(module.parameters())
    return model.replace_module(module), {"tables": chosen, "bits": bits,
                                          "group_size": group_size,
                                          "saved_bytes": int(before - after),
                                          "module_bytes_before": int(total)}


def steps(config, group_size=64):
    """``[(family name, family config)]`` of ``config``'s Linear, prune and exit steps in build
    order (``emb`` is not a family: :func:`build` applies it between). Raises ValueError."""
    from variants.families.exit.family import ExitConfig
    from variants.families.lowrank.family import LowRankConfig
    from variants.families.prune.family import PruneConfig
    from variants.families.quant.family import QuantConfig
    from variants.families.w8a8.family import W8A8Config

    bad = [k for k in config if k not in ORDER]  # ("exact" is applied by build, not a step)
    if bad or not config:
        raise ValueError(f"composed config pieces {bad or '(none)'} unknown; use {ORDER}")
    check(config)
    bits = config.get("quant", {}).get("bits")
    out = []
    if "lowrank" in config:
        lr = config["lowrank"]
        kw = dict(method=lr.get("method", "whitened"), rule="params", ratio=float(lr["ratio"]))
        if bits is not None:  # the low-rank builder quantizes factors and the other Linears
            kw.update(bits=int(bits), group_size=group_size)
        out.append(("lowrank", LowRankConfig(**kw)))
    elif bits is not None:
        out.append(("quant", QuantConfig(bits=int(bits), group_size=group_size)))
    elif "w8a8" in config:
        out.append(("w8a8", W8A8Config(smooth=bool(config["w8a8"].get("smooth", False)))))
    if "prune" in config and "exit" not in config:
        p = config["prune"]
        out.append(("prune", PruneConfig(after_layer=int(p["after_layer"]),
                                         keep_ratio=float(p["keep_ratio"]))))
    if "exit" in config:
        e = config["exit"]
        out.append(("exit", ExitConfig(rule=e.get("rule", "entropy"), target=e.get("target"),
                                       threshold=e.get("threshold"))))
    return out


def build(reference, config, inputs, mode="simulated", group_size=64, int8_mode="native"):
    """The composed variant of ``config`` (a :func:`variants.families.composed.recipe.parse`
    dict) built on ``reference``.

    Parameters
    ----------
    reference : DecisionModel
        The fitted reference.
    config : dict
    inputs : variants.families.family.BuildInputs
        calibration (low-rank statistics, exit threshold, pruning's realised work), fit (exit
        heads, SmoothQuant statistics), cache_dir.
    mode : {'simulated', 'native'}
        Weight-only quantization's and the embeddings' mode.
    group_size : int
    int8_mode : {'native', 'simulated'}
        W8A8's mode: the sweep's speed mode (the model that runs is judged).

    Returns
    -------
    variant : DecisionModel
    infos : list of (step name, info dict) in build order (``"embeddings"`` for ``emb``)

    Raises
    ------
    ValueError
        A bad config, incompatible pieces, or a family builder's own refusal.
    """
    from variants.families import get_family

    model, infos = reference, []
    prune = config.get("prune")
    for name, cfg in steps(config, group_size):
        if name in ("prune", "exit") and "embeddings" in config and \
                not any(n == "embeddings" for n, _ in infos):
            model, info = _quantize_embeddings(model, int(config["embeddings"]["bits"]),
                                               config["embeddings"].get("group_size", group_size),
                                               mode)
            infos.append(("embeddings", info))
        fam = get_family(name)
        m = int8_mode if name == "w8a8" else mode
        model, info = fam.build(model, cfg, inputs.only(fam.inputs), m)
        if name == "exit" and prune is not None:
            model, pinfo = _prune_inside_exit(model, prune)
            info = dict(info, prune=pinfo)
        infos.append((name, info))
    if "embeddings" in config and not any(n == "embeddings" for n, _ in infos):
        model, info = _quantize_embeddings(model, int(config["embeddings"]["bits"]),
                                           config["embeddings"].get("group_size", group_size),
                                           mode)
        infos.append(("embeddings", info))
    if "exact" in config:  # outermost: equal rows answered once, from what the rest computes
        from variants.families.exact.build import exact_model

        model = exact_model(model, config["exact"].get("cache_size"))
        from variants.runtime.memory import model_bytes

        infos.append(("exact", dict(config["exact"], model_bytes=int(model_bytes(model)))))
    return model, infos


def _prune_inside_exit(model, prune):
    """The exit variant ``model`` pruning tokens inside its layer loop; (model, prune info)."""
    from variants.families.prune.build import check_model, protected_ids, work_ratio
    from variants.families.prune.family import PruneConfig

    net = model.module
    cfg = PruneConfig(after_layer=int(prune["after_layer"]), keep_ratio=float(prune["keep_ratio"]))
    check_model(net.base, [cfg])
    ids = protected_ids(model.tokenizer)
    net.set_prune({"points": [list(p) for p in cfg.points], "score": cfg.score,
                   "protected_ids": list(ids)})
    n = len(net.base.encoder.layers)
    w = work_ratio(cfg.points, n)
    return model, {"schedule": [list(p) for p in cfg.points], "score": cfg.score,
                   "protected_ids": list(ids), "work_ratio": w, "ideal_speedup": 1.0 / w}


def summary(infos):
    """The cost-relevant numbers of the build infos (small, plain: what a search worker
    returns): ``model_bytes`` (as stored natively), ``linear_flop_ratio``,
    ``prune_work_ratio``, ``exit_expected_cost`` (1.0 where the piece is absent),
    ``int8_share`` (of the encoder Linears' weights on integer GEMMs; 0 without w8a8)."""
    d = dict(infos)
    infos = [(n, i) for n, i in infos if n != "exact"] or infos  # exact stores nothing more
    first = infos[0][1]  # the Linear step's native bytes, else the module's before emb/prune
    base = first["module_bytes_before"] if infos[0][0] == "embeddings" else first["model_bytes"]
    if infos[0][0] in ("prune", "exit") and "exit_head_bytes" in first:
        base -= first["exit_head_bytes"]  # added back below
    out = {"model_bytes": int(base), "linear_flop_ratio": 1.0,
           "prune_work_ratio": 1.0, "exit_expected_cost": 1.0,
           "int8_share": float(d.get("w8a8", {}).get("int8_share", 0.0))}
    if "lowrank" in d:
        out["linear_flop_ratio"] = float(d["lowrank"]["cost"]["linear_flop_ratio"])
    out["embeddings_saved_bytes"] = int(d.get("embeddings", {}).get("saved_bytes", 0))
    out["model_bytes"] -= out["embeddings_saved_bytes"]
    out["model_bytes"] += int(d.get("exit", {}).get("exit_head_bytes", 0))
    if "prune" in d:
        p = d["prune"]
        out["prune_work_ratio"] = float(p.get("calibration_work_ratio", p["work_ratio"]))
    if "exit" in d:
        out["exit_expected_cost"] = float(d["exit"]["expected_cost"])
        if "prune" in d["exit"]:
            out["prune_work_ratio"] = float(d["exit"]["prune"]["work_ratio"])
    return out

"""Composed candidates: one configuration across the families (quant x lowrank x prune x
exit), built by chaining the families' own builders, and what it costs.

A composed config is a plain dict (JSON-able, what the store keeps), any non-empty subset of::

    {"quant": {"bits": 4},                                   # uniform width, group --group-size
     "lowrank": {"ratio": 0.5, "method": "whitened"},        # rank rule params
     "prune": {"keep_ratio": 0.5, "after_layer": 2},
     "exit": {"target": 0.99, "rule": "entropy"}}            # or {"threshold": 0.3, ...}

Build order (:func:`build`): ``lowrank`` first (it replaces Linears inside the encoder), then
``prune`` or ``exit`` on the low-rank variant (both wrap the encoder's layer loop), with the quant
width handed to the first family's own ``bits`` field, i.e. that family's own composition with
quantization: lowrank rounds its ranks to whole quant groups and quantizes the factors and every
other Linear (without ``bits`` its ranks, e.g. 172, leave the up factors unquantizable at group
64, so quantizing after it would store them fp32); prune and exit (without lowrank) quantize the
encoder before wrapping it, exit fitting its threshold on the quantized encoder. Quant alone is
the quant builder. The quantization is thus applied to the encoder's Linears as the last
transformation of their weights, before any wrapper.
Chaining means the next family's "reference" is the previous variant: exit heads are distilled
from, and the exit target agreement is measured against, the low-rank model (the contract still
judges against the true reference). ``prune`` and ``exit`` do not compose (each drives the
layers itself: PrunedNet and ExitNet both need the bare encoder): asking for both raises
ValueError.

Costs (:func:`costs`) come from the build infos: ``bytes`` the native stored form (quantized
packed weights + scales + biases, fp32 factors, exit heads): lowrank's ``model_bytes`` (+ exit's
``exit_head_bytes``) when lowrank is in, else the last builder's ``model_bytes``;
``bits`` = 8 x (bytes - the parameters no family changes) / the encoder Linears' weights
(for quant alone exactly :meth:`CostTable.bits_per_weight`); ``flops`` = the dense encoder
Linear FLOPs per token x lowrank's ``linear_flop_ratio`` x prune's realised work ratio on the
calibration texts x exit's mean fraction of layers run on calibration. Latency is a quant-only
cost model: refused for the other families.
"""

import hashlib
import json

ORDER = ("lowrank", "quant", "prune", "exit")
FAMILIES = ("quant", "lowrank", "prune", "exit")
INCOMPATIBLE = (("prune", "exit"),)


def check_families(families):
    """Raise ValueError (one line naming ``--families``) for a pair that cannot compose."""
    for a, b in INCOMPATIBLE:
        if a in families and b in families:
            raise ValueError(f"--families {' '.join(families)}: {a} and {b} cannot compose (both "
                             "wrap the encoder's layer loop: PrunedNet and ExitNet each need the "
                             f"bare encoder); search them separately, e.g. --families quant "
                             f"lowrank {a}")


def composed_id(config):
    """12 hex digits over the canonical JSON of ``config`` (the same config, the same id)."""
    text = json.dumps(config, sort_keys=True)
    return hashlib.sha1(("composed" + text).encode()).hexdigest()[:12]


def name_of(config):
    """Readable name: the families' parts in build order, e.g.
    ``lr-whitened-p0.5+prune-a2-r0.5+q4``."""
    parts = []
    if "lowrank" in config:
        lr = config["lowrank"]
        parts.append(f"lr-{lr.get('method', 'whitened')}-p{lr['ratio']:g}")
    if "prune" in config:
        p = config["prune"]
        parts.append(f"prune-a{p['after_layer']}-r{p['keep_ratio']:g}")
    if "exit" in config:
        e = config["exit"]
        parts.append(f"exit-{e.get('rule', 'entropy')}-" + (
            f"ag{e['target']:g}" if e.get("target") is not None else f"t{e['threshold']:g}"))
    if "quant" in config:
        parts.append(f"q{config['quant']['bits']}")
    return "+".join(parts) or "reference"


def family_configs(config, group_size=64):
    """The families' config dataclasses of ``config`` in build order, as ``[(name, cfg)]``; the
    quant width goes to the last family's ``bits`` (module docstring). Raises ValueError for an
    unknown family, a bad value or an incompatible pair."""
    from variants.families.exit.family import ExitConfig
    from variants.families.lowrank.family import LowRankConfig
    from variants.families.prune.family import PruneConfig
    from variants.families.quant.family import QuantConfig

    bad = [k for k in config if k not in FAMILIES]
    if bad or not config:
        raise ValueError(f"composed config families {bad or '(none)'} unknown; use {FAMILIES}")
    check_families(list(config))
    bits = config.get("quant", {}).get("bits")
    chain = []
    if "lowrank" in config:
        lr = config["lowrank"]
        chain.append(["lowrank", dict(method=lr.get("method", "whitened"), rule="params",
                                      ratio=float(lr["ratio"]))])
    if "prune" in config:
        p = config["prune"]
        chain.append(["prune", dict(after_layer=int(p["after_layer"]),
                                    keep_ratio=float(p["keep_ratio"]))])
    if "exit" in config:
        e = config["exit"]
        chain.append(["exit", dict(rule=e.get("rule", "entropy"), target=e.get("target"),
                                   threshold=e.get("threshold"))])
    if bits is not None:
        if chain:  # lowrank first: with bits it rounds its ranks to whole quant groups
            chain[0][1].update(bits=int(bits), group_size=group_size)
        else:
            chain.append(["quant", dict(bits=int(bits), group_size=group_size)])
    types = {"lowrank": LowRankConfig, "prune": PruneConfig, "exit": ExitConfig,
             "quant": QuantConfig}
    return [(name, types[name](**kw)) for name, kw in chain]


def build(reference, config, inputs, mode="simulated", group_size=64):
    """The composed variant: each family's ``Family.build`` on the previous variant.

    Parameters
    ----------
    reference : DecisionModel
        The fitted reference.
    config : dict
        A composed config (module docstring).
    inputs : variants.families.family.BuildInputs
        calibration (lowrank activation statistics, exit threshold, prune's realised work),
        fit (exit heads), cache_dir.
    mode : {'simulated', 'native'}

    Returns
    -------
    variant : DecisionModel
    infos : list of (family name, build info dict), in build order

    Raises
    ------
    ValueError
        Bad config, incompatible families, or a builder's own refusal.
    """
    from variants.families import get_family

    model, infos = reference, []
    for name, cfg in family_configs(config, group_size):
        fam = get_family(name)
        model, info = fam.build(model, cfg, inputs.only(fam.inputs), mode)
        infos.append((name, info))
    return model, infos


def summary(infos):
    """The cost-relevant numbers of the build infos (small, plain: what a worker returns):
    ``model_bytes`` (last builder's), ``linear_flop_ratio``, ``prune_work_ratio``,
    ``exit_expected_cost`` (1.0 where the family is absent)."""
    d = dict(infos)
    out = {"model_bytes": int(infos[-1][1]["model_bytes"]), "linear_flop_ratio": 1.0,
           "prune_work_ratio": 1.0, "exit_expected_cost": 1.0}
    if "lowrank" in d:  # it stored (and maybe quantized) the encoder; a simulated-quant wrapper
        # after it would count fp32 bytes: its native bytes, plus exit's fp32 heads
        out["model_bytes"] = int(d["lowrank"]["model_bytes"]
                                 + d.get("exit", {}).get("exit_head_bytes", 0))
        out["linear_flop_ratio"] = float(d["lowrank"]["cost"]["linear_flop_ratio"])
    if "prune" in d:
        p = d["prune"]
        out["prune_work_ratio"] = float(p.get("calibration_work_ratio", p["work_ratio"]))
    if "exit" in d:
        out["exit_expected_cost"] = float(d["exit"]["expected_cost"])
    return out


def costs(table, summ):
    """``{"bytes", "bits", "flops"}`` of a composed candidate from its :func:`summary` and the
    reference's :class:`variants.search.costs.CostTable` (module docstring)."""
    weights = sum(o * i for o, i in table.shape.values())
    fixed = table.total_bytes - sum(table.dense_bytes.values())
    dense_flops = float(sum(2 * o * i for o, i in table.shape.values()))
    return {"bytes": float(summ["model_bytes"]),
            "bits": 8.0 * (summ["model_bytes"] - fixed) / weights,
            "flops": dense_flops * summ["linear_flop_ratio"] * summ["prune_work_ratio"]
            * summ["exit_expected_cost"]}


def require_optuna():
    """Import optuna or raise ValueError naming the extra to install."""
    try:
        import optuna
    except ImportError:
        raise ValueError("--strategy optuna needs Optuna: pip install 'mlx-variants[search]' "
                         "(or optuna==5.0.*)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def check_options(opts):
    """Raise ValueError (one line naming the flag) for families/strategy/cost combinations the
    search cannot run."""
    fams = tuple(opts.families)
    others = [f for f in fams if f != "quant"]
    if opts.strategy != "optuna":
        if others:
            raise ValueError(f"--families {' '.join(fams)}: --strategy {opts.strategy} searches "
                             "per-layer bits of the quant family only; pass --strategy optuna "
                             "for the cross-family space, or --families quant")
        return
    require_optuna()
    check_families(fams)
    if others and opts.cost.startswith("latency"):
        raise ValueError(f"--cost {opts.cost} is a quant-kernel cost model; with --families "
                         f"{' '.join(others)} pass --cost bytes, bits or flops")
    if len(set(fams)) != len(fams):
        raise ValueError(f"--families {' '.join(fams)} repeats a family; name each once")

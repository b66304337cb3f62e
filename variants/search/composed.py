"""Composed candidates: one configuration across the families (quant x lowrank x prune x
exit), built by chaining the families' own builders, and what it costs.

A composed config is a plain dict (JSON-able, what the store keeps), any non-empty subset of::

    {"quant": {"bits": 4},                                   # uniform width, group --group-size
     "lowrank": {"ratio": 0.5, "method": "whitened"},        # rank rule params
     "prune": {"keep_ratio": 0.5, "after_layer": 2},
     "exit": {"target": 0.99, "rule": "entropy"}}            # or {"threshold": 0.3, ...}

Build: :mod:`variants.families.composed.build` (the composed family's builder, one fixed
order: Linears (lowrank, else quant, else w8a8), embeddings, then prune and / or exit; with both,
the exit net prunes inside its own loop). Chaining means the next family's "reference" is the
previous variant: exit heads are distilled from, and the exit target agreement is measured
against, the low-rank or quantized model (the contract still judges against the true reference).

Costs (:func:`costs`) come from the build infos: ``bytes`` the native stored form (quantized
packed weights + scales + biases, fp32 factors, exit heads): lowrank's ``model_bytes`` (+ exit's
``exit_head_bytes``) when lowrank is in, else the last builder's ``model_bytes``;
``bits`` = 8 x (bytes - the parameters no family changes) / the encoder Linears' weights
(for quant alone exactly :meth:`CostTable.bits_per_weight`); ``flops`` = the dense encoder
Linear FLOPs per token x lowrank's ``linear_flop_ratio`` x prune's realised work ratio on the
calibration texts x exit's mean fraction of layers run on calibration. Latency over the
composed space is the latency walk's (:mod:`variants.search.latency_walk`,
:mod:`variants.search.latency_model`); ``--strategy optuna`` refuses it.
"""

from variants.families.composed.recipe import ORDER, check, composed_id, name_of  # noqa: F401

FAMILIES = ("quant", "lowrank", "prune", "exit")  # --strategy optuna's; the latency walk adds w8a8


def check_families(families):
    """Raise ValueError (one line naming ``--families``) for a pair that cannot compose."""
    try:
        check({f: {} for f in families})
    except ValueError as e:
        raise ValueError(f"--families {' '.join(families)}: {e}") from None


def family_configs(config, group_size=64):
    """The families' config dataclasses of ``config`` in build order, as ``[(name, cfg)]``
    (:func:`variants.families.composed.build.steps`)."""
    from variants.families.composed.build import steps

    return steps(config, group_size)


def build(reference, config, inputs, mode="simulated", group_size=64, int8_mode="native"):
    """The composed variant and its build infos:
    :func:`variants.families.composed.build.build`."""
    from variants.families.composed.build import build as composed_build

    return composed_build(reference, config, inputs, mode=mode, group_size=group_size,
                          int8_mode=int8_mode)


def summary(infos):
    """:func:`variants.families.composed.build.summary`."""
    from variants.families.composed.build import summary as composed_summary

    return composed_summary(infos)


def costs(table, summ):
    """``{"bytes", "bits", "flops"}`` of a composed candidate from its :func:`summary` and the
    reference's :class:`variants.search.costs.CostTable` (module docstring)."""
    weights = sum(o * i for o, i in table.shape.values())
    fixed = table.total_bytes - sum(table.dense_bytes.values())
    dense_flops = float(sum(2 * o * i for o, i in table.shape.values()))
    # bits per encoder weight: the Linears only (tables quantized by an emb piece are not units)
    linear_bytes = summ["model_bytes"] + summ.get("embeddings_saved_bytes", 0) - fixed
    return {"bytes": float(summ["model_bytes"]),
            "bits": 8.0 * linear_bytes / weights,
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
    if opts.strategy == "latency":
        if not opts.cost.startswith("latency"):
            raise ValueError(f"--strategy latency walks the composed space by predicted latency; "
                             f"pass --cost latency-b1 or latency-b32 (not {opts.cost})")
        if others or opts.w8a8:
            raise ValueError("--strategy latency (the default of a latency cost) walks its own "
                             "composed space (W8A8, quantized embeddings, token pruning, early "
                             "exit); drop --families / --w8a8, or pass --strategy bisect for "
                             "per-Linear widths and W8A8")
        return
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

"""The composed family: several approximations in one variant (W8A8 or weight-only or low-rank
Linears, quantized embeddings, token pruning, early exit), described by a recipe
(:mod:`variants.families.composed.recipe`) and built in one fixed order
(:mod:`variants.families.composed.build`). Config, flags, ladder and report lines; no MLX.

``variants sweep --family composed --compose w8a8+prune:2:0.5 w8a8+exit:entropy:0.99`` judges
and times each recipe like any variant; ``variants search --cost latency-b32`` walks this space
(:mod:`variants.search.latency_walk`).
"""

from dataclasses import dataclass

from variants.families import realised_speed_lines
from variants.families.composed import recipe as recipe_mod
from variants.families.family import BuildInputs, Family

DEFAULT_RECIPES = ("w8a8+prune:2:0.7", "w8a8+exit:entropy:0.99")


@dataclass(frozen=True)
class ComposedConfig:
    """One composed variant: ``recipe`` (canonicalised on creation; ValueError when bad) and
    the quant ``group_size`` of its ``q`` / ``emb`` / low-rank pieces."""

    recipe: str = DEFAULT_RECIPES[0]
    group_size: int = 64

    def __post_init__(self):
        object.__setattr__(self, "recipe", recipe_mod.recipe_of(recipe_mod.parse(self.recipe)))

    @property
    def config(self):
        """The recipe as the dict the search stores (:func:`recipe.parse`)."""
        return recipe_mod.parse(self.recipe)

    @property
    def name(self):
        return recipe_mod.name_of(self.config) + ("" if self.group_size == 64
                                                  else f"-g{self.group_size}")


PARAMS = ("compose", "compose_group_size")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("composed family (--family composed)")
    g.add_argument("--compose", nargs="+", default=list(DEFAULT_RECIPES), metavar="RECIPE",
                   help="one variant per recipe: pieces joined by '+', built in the order "
                        "Linears (lowrank:R[:METHOD] | q:BITS | w8a8[:sq]), emb:BITS, "
                        "prune:AFTER_LAYER:KEEP_RATIO, exit:entropy|margin:TARGET; e.g. "
                        "w8a8+prune:2:0.5+exit:entropy:0.99")
    g.add_argument("--compose-group-size", type=int, default=64, choices=(32, 64, 128),
                   help="quant group size of the q / emb / lowrank pieces")


def ladder(*, compose=DEFAULT_RECIPES, compose_group_size=64):
    """One ComposedConfig per recipe (duplicates dropped); ValueError naming a bad recipe."""
    cfgs = [ComposedConfig(r, compose_group_size) for r in compose]
    return list({c.name: c for c in cfgs}.values())


def run_name(*, compose=DEFAULT_RECIPES, **_):
    """Default run-folder suffix."""
    return "composed" if len(compose) != 1 else ComposedConfig(compose[0]).name


def build(reference, config, inputs=BuildInputs(), mode="simulated", int8_mode=None):
    """The family's build: :func:`variants.families.composed.build.build`; W8A8 pieces in
    ``int8_mode`` (None: ``mode``, which the sweep sets to its speed mode for recipes with
    W8A8, :func:`judged_in_speed_mode`). Returns (variant, info) with info ``{"steps":
    {step: its builder's info}, "summary": ...}``."""
    from variants.families.composed import build as composed

    model, infos = composed.build(reference, config.config, inputs, mode=mode,
                                  group_size=config.group_size, int8_mode=int8_mode or mode)
    summ = composed.summary(infos)
    first = infos[0][1]
    return model, {"recipe": config.recipe, "steps": {n: i for n, i in infos},
                   "order": [n for n, _ in infos], "summary": summ,
                   "model_bytes": summ["model_bytes"], "mode": mode,
                   "kernel": first.get("kernel"), "int8": first.get("int8"),
                   "ideal_speedup": ideal_speedup(summ)}


def ideal_speedup(summ):
    """Product of the pieces' own ideal speed-ups (a plausibility figure: each piece's cost
    model, multiplied as if their shares did not overlap)."""
    w8 = summ.get("int8_share", 0.0)
    int8 = 1.0 / ((1.0 - w8) + w8 / 4.0) if w8 else 1.0
    return int8 / (summ["linear_flop_ratio"] * summ["prune_work_ratio"]
                   * summ["exit_expected_cost"])


def check_model(encoder, configs, model=None):
    """Raise ValueError for a recipe the loaded model cannot hold: a pruning layer outside
    [1, N), a module without per-layer access (prune, exit), a model without encoder Linears
    (w8a8)."""
    from variants.families.prune.family import PruneConfig

    for c in configs:
        cfg = c.config
        if "prune" in cfg:
            from variants.families.prune import build as prune

            p = cfg["prune"]
            try:
                prune.check_model(encoder, [PruneConfig(after_layer=p["after_layer"],
                                                        keep_ratio=p["keep_ratio"])])
            except ValueError as e:
                n = len(getattr(encoder, "layers", None) or encoder.encoder.layers)
                raise ValueError(f"--compose {c.recipe!r}: {str(e).split(';')[0]}; pass "
                                 f"prune:A:R with A between 1 and {n - 1}") from None
        if "w8a8" in cfg:
            from variants.families.w8a8 import build as w8a8
            from variants.families.w8a8.family import W8A8Config

            w8a8.check_model(encoder, [W8A8Config()])


def describe(info, timing=None):
    """Markdown: the recipe, its build order, each piece's own figure, the product of the
    pieces' ideal speed-ups beside the measured one."""
    s = info["summary"]
    steps = info["steps"]
    pieces = list(recipe_mod.parse(info["recipe"]))  # in build order (recipe.ORDER)
    lines = [f"- recipe `{info['recipe']}`, built in the order {' → '.join(pieces)}"
             + (" (pruning inside the exit loop)" if {"prune", "exit"} <= set(pieces) else "")]
    if "w8a8" in steps:
        w = steps["w8a8"]
        lines.append(f"- W8A8: {w['int8_layers']} Linears on int8 GEMMs "
                     f"({w['int8_share']:.1%} of the encoder Linears' weights), kernel "
                     f"{w['kernel']}")
    if "prune" in steps or "prune" in steps.get("exit", {}):
        lines.append(f"- token pruning: work ratio {s['prune_work_ratio']:.3f} of the encoder's "
                     "per-token work on calibration")
    if "exit" in steps:
        e = steps["exit"]
        lines.append(f"- early exit ({e['rule']}, threshold {e['threshold']:.4g}): mean "
                     f"{s['exit_expected_cost']:.3f} of the layers run on calibration")
    if "exact" in steps:
        e = steps["exact"]
        lines.append("- exact: " + ("equal rows in a call computed once" if e["kind"] == "dedup"
                                    else f"that and a result cache of {e['cache_size']} rows")
                     + " (the workload streams in timing.json price it on this data's repeats)")
    if "embeddings" in steps:
        m = steps["embeddings"]
        lines.append(f"- embeddings at {m['bits']} bits (group {m['group_size']}): "
                     f"{', '.join(m['tables'])}")
    lines.append(f"- stored: {s['model_bytes'] / 1e6:.2f} MB")
    lines += realised_speed_lines(timing, info["ideal_speedup"])
    return "\n".join(lines) + "\n"


class _ExactView:
    """The exact piece of a composed config as the exact family's timing reads a config."""

    def __init__(self, vcfg):
        e = vcfg.config["exact"]
        self.kind, self.cache_size = e["kind"], e.get("cache_size")


def timed_variant(variant, vcfg):
    """A recipe with a result cache is timed on its miss path, as the exact family's
    (:func:`variants.families.exact.build.timed_variant`); otherwise the variant."""
    if "exact" not in vcfg.config:
        return variant
    from variants.families.exact import build as exact

    return exact.timed_variant(variant, _ExactView(vcfg))


def time_extra(reference, variant, eval_taskset, cfg, vcfg):
    """With an ``exact`` piece: the exact family's workload streams (the eval split as it is and
    Zipf-repeated, reference and variant alternated per call): what its traffic's repeats are
    worth on top of the rest of the recipe. Nothing otherwise."""
    if "exact" not in vcfg.config:
        return {}
    from variants.families.exact.family import time_extra as exact_time

    return exact_time(reference, variant, eval_taskset, cfg, _ExactView(vcfg))


def extra_stale(timing, cfg, vcfg):
    """On resume: the exact family's check of saved workload settings (None without exact)."""
    if "exact" not in vcfg.config:
        return None
    from variants.families.exact.family import extra_stale as exact_stale

    return exact_stale(timing, cfg, _ExactView(vcfg))


def _judged_in_speed_mode(vcfg):
    """W8A8 pieces are judged on the model that runs (as the w8a8 family's)."""
    return "w8a8" in vcfg.config


FAMILY = Family(name="composed", config=ComposedConfig, params=PARAMS,
                add_arguments=add_arguments, ladder=ladder, run_name=run_name, build=build,
                check_model=check_model, describe=describe,
                inputs=("calibration", "fit", "cache_dir"), timed_variant=timed_variant,
                time_extra=time_extra, extra_stale=extra_stale,
                judged_in_speed_mode=_judged_in_speed_mode)

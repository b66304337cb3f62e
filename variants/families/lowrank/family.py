"""The lowrank family (SVD-LLM whitened, plain, ASVD scaled factorisation): config, flags,
ladder and report lines. No MLX: the factorisation is :mod:`variants.families.lowrank.build`.
"""

import math
from dataclasses import dataclass

from variants.families import name_number
from variants.layer_maps import ratio_map as ratio_map_mod
from variants.families import realised_speed_lines, unique_by_name
from variants.families.family import BuildInputs, Family
from variants.families.lowrank.config import METHODS, RULES  # noqa: F401
from variants.families.quant.family import BITS, GROUP_SIZES, check_bits

DEFAULT_RATIOS = (0.9, 0.7, 0.5, 0.3, 0.1)
DEFAULT_METHODS = ("whitened", "plain")


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LowRankConfig:
    """Parameters of one low-rank variant (validated on creation).

    ``rule`` picks the per-layer rank: ``params`` keeps ``ratio`` of each layer's break-even
    rank mn/(m+n), i.e. ``ratio`` of its parameters; ``energy`` the smallest rank retaining
    ``energy`` of the (weighted) squared singular values; ``rank`` the same rank ``rank`` in
    every layer. Fields of the other rules are ignored (and not in the name).
    """

    method: str = "whitened"
    rule: str = "params"
    ratio: float = 0.5
    energy: float = 0.95
    rank: int = 64
    alpha: float = 0.5
    bits: int | None = None
    group_size: int = 64
    #: per-layer ratios (:mod:`variants.layer_maps.ratio_map`, normalised); "" = uniform ``ratio``
    ratio_map: str = ""

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not known; choose one of {METHODS}")
        if self.rule not in RULES:
            raise ValueError(f"rank rule {self.rule!r} is not known; choose one of {RULES}")
        if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio <= 1):
            raise ValueError(f"ratio={self.ratio} is outside (0, 1]; pass e.g. --ratios 0.9 0.5")
        if not 0 < self.energy <= 1:
            raise ValueError(f"energy={self.energy} is outside (0, 1]; pass e.g. --energies 0.99")
        if int(self.rank) != self.rank or self.rank < 1:
            raise ValueError(f"rank={self.rank} must be a positive integer")
        if not (math.isfinite(self.alpha) and 0 <= self.alpha <= 2):
            raise ValueError(f"alpha={self.alpha} is outside [0, 2] (ASVD uses 0.5)")
        check_bits(self.bits, self.group_size, "lowrank_")
        object.__setattr__(self, "ratio_map", ratio_map_mod.canonical(self.ratio_map))
        if self.ratio_map and self.rule != "params":
            raise ValueError(f"--ratio-map sets per-layer parameter ratios, but --rank-rule is "
                             f"{self.rule}; pass --rank-rule params or drop --ratio-map")

    @property
    def name(self):
        method = (f"{self.method}-a{name_number(self.alpha, '.2f')}" if self.method == "scaled"
                  else self.method)
        rule = {"params": "p" + name_number(self.ratio, ".2f"),
                "energy": "e" + name_number(self.energy, ".3f"), "rank": f"r{self.rank}"}[self.rule]
        quant = ""
        if self.bits is not None:
            quant = f"-q{self.bits}" + ("" if self.group_size == 64 else f"g{self.group_size}")
        mixed = ratio_map_mod.tag(self.ratio_map)
        return f"lr-{method}-{rule}{quant}" + (f"-{mixed}" if mixed else "")



PARAMS = ("methods", "ratios", "rank_rule", "energies", "ranks", "alpha", "lowrank_bits",
          "lowrank_group_size", "ratio_map")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("lowrank family (--family lowrank)")
    g.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS),
                   help="factorisations: whitened (SVD-LLM), plain (truncated SVD, the control), "
                        "scaled (ASVD)")
    g.add_argument("--ratios", type=float, nargs="+", default=list(DEFAULT_RATIOS), metavar="R",
                   help="--rank-rule params: share (0, 1] of each layer's parameters kept")
    g.add_argument("--rank-rule", choices=RULES, default="params",
                   help="per-layer rank: params = ratio of parameters, energy = retained "
                        "(weighted) energy, rank = one fixed rank")
    g.add_argument("--energies", type=float, nargs="+", default=[0.9, 0.99], metavar="E",
                   help="--rank-rule energy: retained share of squared singular values")
    g.add_argument("--ranks", type=int, nargs="+", default=[64], metavar="K",
                   help="--rank-rule rank: the rank of every factorised layer")
    g.add_argument("--alpha", type=float, default=0.5, help="ASVD exponent of mean |x| (scaled)")
    g.add_argument("--lowrank-bits", type=int, nargs="+", default=None, metavar="B",
                   help=f"quantize the factors afterwards with these bit widths {BITS}")
    g.add_argument("--lowrank-group-size", type=int, default=64, choices=GROUP_SIZES,
                   help="group size when --lowrank-bits is given")
    g.add_argument("--ratio-map", default="", metavar="PATTERN=RATIO,...",
                   help="per-layer ratios (--rank-rule params): the first regex searched in a "
                        "layer path sets its ratio, 1 keeps it dense, other layers get "
                        f"--ratios; {ratio_map_mod.EXAMPLE}")


def ladder(*, methods=DEFAULT_METHODS, ratios=DEFAULT_RATIOS, rank_rule="params",
           energies=(0.9, 0.99), ranks=(64,), alpha=0.5, lowrank_bits=None,
           lowrank_group_size=64, ratio_map=""):
    """The variant configs of one sweep: method × rule values × bits (ValueError if bad)."""
    if not methods:
        raise ValueError("no methods given; pass e.g. --methods whitened plain")
    values = {"params": ratios, "energy": energies, "rank": ranks}.get(rank_rule)
    if values is None:
        raise ValueError(f"rank rule {rank_rule!r} is not known; choose one of {RULES}")
    if not values:
        raise ValueError(f"no values for --rank-rule {rank_rule}; pass e.g. --ratios 0.5")
    field = {"params": "ratio", "energy": "energy", "rank": "rank"}[rank_rule]
    out = []
    for method in dict.fromkeys(methods):
        for v in dict.fromkeys(values):
            for bits in (lowrank_bits or [None]):
                out.append(LowRankConfig(method=method, rule=rank_rule, alpha=float(alpha),
                                         bits=bits, group_size=lowrank_group_size,
                                         ratio_map=ratio_map, **{field: v}))
    return unique_by_name(out, {"method": "--methods", "ratio": "--ratios",
                                "energy": "--energies", "rank": "--ranks", "alpha": "--alpha",
                                "bits": "--lowrank-bits", "group_size": "--lowrank-group-size"})


def run_name(*, rank_rule="params", lowrank_bits=None, ratio_map="", **_):
    """Default run-folder suffix for these parameters."""
    mixed = ratio_map_mod.tag(ratio_map)
    return f"{rank_rule}" + ("" if not lowrank_bits else "-q" + "-".join(map(str, lowrank_bits))) \
        + (f"-{mixed}" if mixed else "")


def _f(x, spec):
    return "—" if x is None else format(x, spec)


def describe(info, timing=None):
    """Markdown: the per-layer table of one variant's ``build.json`` info (+ speed if given).

    ``timing`` is the variant's timing.json dict; with it the realised / ideal speed-up ratio
    is shown per batch size.
    """
    lines = [
        f"- factorised layers: {info['factorised_layers']} of {len(info['layers'])}; "
        f"parameters of these layers {info['params_dense']:,} → {info['params_lowrank']:,} "
        f"({info['param_ratio']:.3f}×); model {info['reference_bytes'] / 1e6:.1f} MB → "
        f"{info['model_bytes'] / 1e6:.1f} MB",
        f"- cost model: Linear FLOPs × {info['cost']['linear_flop_ratio']:.3f}; ideal speed-up "
        f"{info['ideal_speedup']:.2f}× ({info['ideal_speedup_note']})",
    ]
    if info.get("max_lambda_rel"):
        lines.append(f"- Cholesky needed λ up to {info['max_lambda_rel']:.1e}·mean diag(XᵀX/N)")
    lines += realised_speed_lines(timing, info["ideal_speedup"])
    ratios = {r["path"]: r.get("ratio") for r in info["layers"]}
    if len(set(ratios.values())) > 1:  # a --ratio-map: say which layers kept what
        groups = {}
        for path, ratio in ratios.items():
            groups.setdefault(ratio, []).append(path.removeprefix("encoder.layers."))
        lines.append("- per-layer ratios (--ratio-map): " + "; ".join(
            f"{ratio:g}: {', '.join(paths)}" for ratio, paths in sorted(groups.items())))
    dense = [r for r in info["layers"] if r["dense"]]
    if dense:
        lines.append(f"- kept dense (break-even): {len(dense)} layers, e.g. {dense[0]['reason']}")
    lines += ["", "| layer | shape | rank | retained energy | predicted rel. err | "
                  "weighted rel. err | plain rel. err | λ (rel) |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in info["layers"]:
        rank = "dense" if r["dense"] else str(r["rank"])
        lines.append(f"| {r['path'].removeprefix('encoder.')} | {r['shape'][0]}×{r['shape'][1]} | "
                     f"{rank} | {_f(r['retained_energy'], '.4f')} | "
                     f"{_f(r['predicted_rel_error'], '.4f')} | {_f(r['weighted_rel_error'], '.4f')} | "
                     f"{_f(r['plain_rel_error'], '.4f')} | {_f(r['lambda_rel'], '.0e')} |")
    return "\n".join(lines) + "\n"


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.families.lowrank.build.build` (calibration, cache_dir)."""
    from variants.families.lowrank import build as lowrank

    return lowrank.build(reference, config, mode=mode, calibration=inputs.calibration,
                         cache_dir=inputs.cache_dir)


def check_model(encoder, configs, model=None):
    """The family's model check: :func:`variants.families.lowrank.build.check_model`."""
    from variants.families.lowrank import build as lowrank

    lowrank.check_model(encoder, configs)


FAMILY = Family(name="lowrank", config=LowRankConfig, params=PARAMS,
                add_arguments=add_arguments, ladder=ladder, run_name=run_name, build=build,
                check_model=check_model, describe=describe, inputs=("calibration", "cache_dir"))

"""The prune family (PoWER-BERT style token pruning): config, flags, ladder and report lines.
No MLX: the pruned forward pass and the build are :mod:`variants.families.prune.build`.
"""

import math
from dataclasses import dataclass

from metrics._checks import short_repr
from variants.families import name_number, realised_speed_lines, unique_by_name
from variants.families.family import BuildInputs, Family
from variants.families.prune.config import PROTECTED_TOKENS, SCORES  # noqa: F401
from variants.families.quant.family import BITS, GROUP_SIZES, check_bits

DEFAULT_LAYERS = (1, 2, 3)
DEFAULT_KEEP_RATIOS = (0.7, 0.5, 0.3)


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------

def _check_ratio(r, what="keep_ratio"):
    if not (isinstance(r, (int, float)) and math.isfinite(r) and 0 < r <= 1):
        raise ValueError(f"{what}={r} is outside (0, 1]; pass e.g. --keep-ratios 0.7 0.5")


@dataclass(frozen=True)
class PruneConfig:
    """Parameters of one pruned variant (validated on creation; the layer bound N is checked by
    :func:`check_model` / :func:`build`, which know the encoder).

    ``after_layer`` a and ``keep_ratio`` ρ give one pruning point; ``schedule`` (a tuple of
    ``(layer, ratio)`` pairs, layers increasing, ratios non-increasing) replaces them when given.
    """

    after_layer: int = 2
    keep_ratio: float = 0.5
    score: str = "received"
    schedule: tuple | None = None
    bits: int | None = None
    group_size: int = 64

    def __post_init__(self):
        if self.score not in SCORES:
            raise ValueError(f"importance score {self.score!r} is not known; choose one of "
                             f"{SCORES} (--prune-scores)")
        for a, r in self.points:
            if int(a) != a or a < 1:
                raise ValueError(f"after_layer={a} must be an integer >= 1 (prune after encoder "
                                 "layer a, 1 <= a < number of layers); pass e.g. --prune-layers 2")
            _check_ratio(r)
        layers = [a for a, _ in self.points]
        ratios = [r for _, r in self.points]
        if layers != sorted(set(layers)):
            raise ValueError(f"schedule layers {layers} must be strictly increasing")
        if ratios != sorted(ratios, reverse=True):
            raise ValueError(f"schedule keep ratios {ratios} must be non-increasing (each is a "
                             "share of the original tokens)")
        check_bits(self.bits, self.group_size, "prune_")

    @property
    def points(self):
        """((layer, keep ratio), ...): where and how much to prune."""
        if self.schedule:
            return tuple((int(a), float(r)) for a, r in self.schedule)
        return ((self.after_layer, float(self.keep_ratio)),)

    @property
    def name(self):
        if self.schedule:
            core = "prune-s" + "-".join(f"{a}x{name_number(r, '.2f')}" for a, r in self.points)
        else:
            core = f"prune-a{self.after_layer}-r{name_number(self.keep_ratio, '.2f')}"
        extra = "" if self.score == "received" else f"-{self.score}"
        if self.bits is not None:
            extra += f"-q{self.bits}" + ("" if self.group_size == 64 else f"g{self.group_size}")
        return core + extra


def parse_schedule(text):
    """``"2:0.7,4:0.4"`` -> ((2, 0.7), (4, 0.4)) (ValueError naming --prune-schedule if bad)."""
    try:
        pairs = tuple((int(a), float(r)) for a, r in
                      (p.split(":") for p in text.split(",") if p.strip()))
    except ValueError:
        raise ValueError(f"--prune-schedule {short_repr(text)} is not 'layer:ratio,layer:ratio', "
                         "e.g. 2:0.7,4:0.4") from None
    if not pairs:
        raise ValueError(f"--prune-schedule {short_repr(text)} is empty; e.g. 2:0.7,4:0.4")
    return pairs



PARAMS = ("prune_layers", "keep_ratios", "prune_scores", "prune_schedules", "prune_bits",
          "prune_group_size")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("prune family (--family prune)")
    g.add_argument("--prune-layers", type=int, nargs="+", default=list(DEFAULT_LAYERS),
                   metavar="A", help="prune after encoder layer A (1 <= A < number of layers)")
    g.add_argument("--keep-ratios", type=float, nargs="+", default=list(DEFAULT_KEEP_RATIOS),
                   metavar="R", help="share (0, 1] of each text's real tokens kept")
    g.add_argument("--prune-scores", nargs="+", choices=SCORES, default=["received"],
                   help="token importance: received = attention received, mean over heads and "
                        "queries (PoWER-BERT); cls = attention from [CLS]")
    g.add_argument("--prune-schedules", nargs="+", default=None, metavar="S",
                   help="instead of the layer x ratio grid: schedules 'layer:ratio,...', "
                        "e.g. 2:0.7,4:0.4 (ratios share of the original tokens)")
    g.add_argument("--prune-bits", type=int, nargs="+", default=None, metavar="B",
                   help=f"also quantize the model with these bit widths {BITS}")
    g.add_argument("--prune-group-size", type=int, default=64, choices=GROUP_SIZES,
                   help="group size when --prune-bits is given")


def ladder(*, prune_layers=DEFAULT_LAYERS, keep_ratios=DEFAULT_KEEP_RATIOS,
           prune_scores=("received",), prune_schedules=None, prune_bits=None,
           prune_group_size=64):
    """The variant configs of one sweep: layer × ratio × score × bits, or the given schedules
    × score × bits (ValueError naming the parameter if bad)."""
    if not prune_scores:
        raise ValueError("no importance score given; pass e.g. --prune-scores received")
    if prune_schedules:
        grid = [dict(schedule=parse_schedule(s)) for s in prune_schedules]
    else:
        if not prune_layers or not keep_ratios:
            raise ValueError("no layers or keep ratios given; pass e.g. --prune-layers 2 "
                             "--keep-ratios 0.5")
        grid = [dict(after_layer=int(a), keep_ratio=float(r))
                for a in dict.fromkeys(prune_layers) for r in dict.fromkeys(keep_ratios)]
    out = [PruneConfig(score=s, bits=b, group_size=prune_group_size, **g)
           for g in grid for s in dict.fromkeys(prune_scores) for b in (prune_bits or [None])]
    return unique_by_name(out, {"after_layer": "--prune-layers", "keep_ratio": "--keep-ratios",
                                "schedule": "--prune-schedules", "score": "--prune-scores",
                                "bits": "--prune-bits", "group_size": "--prune-group-size"})


def run_name(*, prune_scores=("received",), prune_schedules=None, prune_bits=None, **_):
    """Default run-folder suffix for these parameters."""
    return ("schedule" if prune_schedules else "grid") + "-" + "-".join(prune_scores) + (
        "" if not prune_bits else "-q" + "-".join(map(str, prune_bits)))


def describe(info, timing=None):
    """Markdown lines for the report: pruning point(s), ideal vs measured speed-up."""
    pts = ", ".join(f"after layer {a} keep {r:.2f}" for a, r in info["schedule"])
    lines = [f"- pruning: {pts} of each text's real tokens (score `{info['score']}`; "
             f"{'/'.join(info['protected_tokens'])} always kept), {info['n_layers']} layers",
             f"- cost model: work ratio {info['work_ratio']:.3f} → ideal speed-up "
             f"{info['ideal_speedup']:.2f}×"]
    if "calibration_work_ratio" in info:
        lines.append(f"- on the calibration texts ({info['calibration_mean_tokens']:.1f} tokens "
                     f"on average, {info['calibration_mean_tokens_kept']:.1f} kept): work ratio "
                     f"{info['calibration_work_ratio']:.3f} → ideal "
                     f"{info['calibration_ideal_speedup']:.2f}×")
    lines += realised_speed_lines(timing, info["ideal_speedup"])
    return "\n".join(lines) + "\n"


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.families.prune.build.build` (calibration: realised work)."""
    from variants.families.prune import build as prune

    return prune.build(reference, config, mode=mode, calibration=inputs.calibration)


def check_model(encoder, configs, model=None):
    """The family's model check: :func:`variants.families.prune.build.check_model`."""
    from variants.families.prune import build as prune

    prune.check_model(encoder, configs)


FAMILY = Family(name="prune", config=PruneConfig, params=PARAMS, add_arguments=add_arguments,
                ladder=ladder, run_name=run_name, build=build, check_model=check_model,
                describe=describe)

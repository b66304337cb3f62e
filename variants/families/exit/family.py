"""The exit family (early exit: distilled heads after intermediate layers + a confidence rule):
config, flags, ladder and report lines. No MLX: heads, rules and the forward pass are
:mod:`variants.families.exit.build`.
"""

import math
from dataclasses import dataclass

from variants.families import name_number, realised_speed_lines, unique_by_name
from variants.families.exit.rules import RULES, summary_lines
from variants.families.family import BuildInputs, Family
from variants.families.quant.family import BITS, GROUP_SIZES, check_bits

DEFAULT_TARGETS = (0.99, 0.97)
from metrics.defaults import NEAR_TIE_MARGIN  # noqa: E402,F401  (the reference's raw-logit near-tie margin)


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExitConfig:
    """Parameters of one early-exit variant (validated on creation).

    Exactly one of ``target`` (calibration agreement to reach; the threshold is fitted) and
    ``threshold`` (fixed τ, or t for patience) is set. ``exit_layers`` None = every layer 1..N−1.
    """

    rule: str = "entropy"
    target: float | None = 0.99
    threshold: float | None = None
    exit_layers: tuple | None = None
    label_mix: float = 0.0
    bits: int | None = None
    group_size: int = 64

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"exit rule {self.rule!r} is not known; choose one of {RULES} "
                             "(--exit-rules)")
        if (self.target is None) == (self.threshold is None):
            raise ValueError("give exactly one of --exit-targets (fit the threshold) and "
                             "--exit-thresholds (fixed), e.g. --exit-targets 0.99")
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"--exit-targets {self.target} is outside (0, 1]; it is the agreement "
                             "with the reference to reach on calibration, e.g. 0.99")
        if self.threshold is not None:
            t = self.threshold
            if not math.isfinite(t):
                raise ValueError(f"--exit-thresholds {t} is not a finite number; pass e.g. "
                                 "--exit-thresholds 0.3 (entropy/margin) or 2 (patience)")
            if self.rule == "entropy" and not 0 < t <= 1:
                raise ValueError(f"--exit-thresholds {t} for rule entropy is outside (0, 1]: no "
                                 "calibration example can have normalised entropy below it")
            if self.rule == "margin" and not 0 <= t < 1:
                raise ValueError(f"--exit-thresholds {t} for rule margin is outside [0, 1): no "
                                 "calibration example can have a top-2 margin above it")
            if self.rule == "patience" and (int(t) != t or t < 2):
                raise ValueError(f"--exit-thresholds {t} for rule patience must be an integer >= 2 "
                                 "(heads that must agree)")
        if self.exit_layers is not None and (
                not self.exit_layers or any(int(a) != a or a < 1 for a in self.exit_layers)
                or list(self.exit_layers) != sorted(set(self.exit_layers))):
            raise ValueError(f"--exit-layers {list(self.exit_layers)} must be increasing integers >= 1 "
                             "(and < number of layers)")
        if not 0 <= self.label_mix <= 1:
            raise ValueError(f"--exit-label-mix {self.label_mix} is outside [0, 1]; pass e.g. 0.5")
        check_bits(self.bits, self.group_size, "exit_")

    @property
    def name(self):
        # numbers as before (0.99 -> ag0.99, 0.3 -> t0.3, mix 0.3 -> mix0.30) unless that rounds
        # them: then the shortest exact form (0.1231 -> t0.1231), so names never collide
        if self.target is not None:
            s = f"exit-{self.rule}-ag{name_number(self.target, '.3g')}"
        elif self.rule == "patience":
            s = f"exit-patience-t{int(self.threshold)}"
        else:
            s = f"exit-{self.rule}-t{name_number(self.threshold, '.3g')}"
        if self.exit_layers is not None:
            s += "-h" + ".".join(str(int(a)) for a in self.exit_layers)
        if self.label_mix:
            s += f"-mix{name_number(self.label_mix, '.2f')}"
        if self.bits is not None:
            s += f"-q{self.bits}" + ("" if self.group_size == 64 else f"g{self.group_size}")
        return s



PARAMS = ("exit_rules", "exit_targets", "exit_thresholds", "exit_layers", "exit_label_mix",
          "exit_bits", "exit_group_size")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("exit family (--family exit)")
    g.add_argument("--exit-rules", nargs="+", choices=RULES, default=list(RULES),
                   help="entropy (DeeBERT), margin (top-2 probability), patience (PABEE)")
    g.add_argument("--exit-targets", type=float, nargs="+", default=None, metavar="A",
                   help="calibration agreement with the reference each fitted threshold must "
                        "reach; not with --exit-thresholds; when neither is given: "
                        + " ".join(map(str, DEFAULT_TARGETS)))
    g.add_argument("--exit-thresholds", type=float, nargs="+", default=None, metavar="T",
                   help="fixed thresholds instead of --exit-targets (entropy: τ in (0, 1]; "
                        "margin: τ in [0, 1); patience: t >= 2 heads)")
    g.add_argument("--exit-layers", type=int, nargs="+", default=None, metavar="L",
                   help="layers with an exit head (default: every layer 1..N-1)")
    g.add_argument("--exit-label-mix", type=float, default=0.0,
                   help="weight of the labels in the head loss (0 = pure distillation)")
    g.add_argument("--exit-bits", type=int, nargs="+", default=None, metavar="B",
                   help=f"also quantize the encoder with these bit widths {BITS}")
    g.add_argument("--exit-group-size", type=int, default=64, choices=GROUP_SIZES,
                   help="group size when --exit-bits is given")


def ladder(*, exit_rules=RULES, exit_targets=None, exit_thresholds=None,
           exit_layers=None, exit_label_mix=0.0, exit_bits=None, exit_group_size=64):
    """The variant configs of one sweep: rule × (targets or thresholds) × bits.

    ``exit_targets`` None = ``DEFAULT_TARGETS`` unless ``exit_thresholds`` are given; giving
    both is refused (one would be ignored).

    Raises
    ------
    ValueError
        Naming the parameter and the fix.
    """
    if not exit_rules:
        raise ValueError("no exit rule given; pass e.g. --exit-rules entropy")
    if exit_thresholds is not None and exit_targets is not None:
        raise ValueError("--exit-targets and --exit-thresholds were both given: pass one or the "
                         "other (--exit-targets fits each threshold on calibration to reach that "
                         "agreement, --exit-thresholds fixes it)")
    if exit_thresholds is not None and not len(exit_thresholds):
        raise ValueError("no thresholds given; pass e.g. --exit-thresholds 0.3")
    if exit_thresholds is None and exit_targets is None:
        exit_targets = DEFAULT_TARGETS
    if exit_thresholds is None and not len(exit_targets):
        raise ValueError("no targets given; pass e.g. --exit-targets 0.99")
    values = ([dict(threshold=float(t), target=None) for t in exit_thresholds]
              if exit_thresholds is not None else [dict(target=float(a)) for a in exit_targets])
    layers = tuple(int(a) for a in exit_layers) if exit_layers else None
    rules = list(dict.fromkeys(exit_rules))
    out = []
    for rule in rules:
        for v in values:
            for b in (exit_bits or [None]):
                try:
                    out.append(ExitConfig(rule=rule, exit_layers=layers,
                                          label_mix=exit_label_mix, bits=b,
                                          group_size=exit_group_size, **v))
                except ValueError as e:
                    if "threshold" in v and "patience" in rules and len(rules) > 1:
                        raise ValueError(f"{e}; {_mixed_patience_hint(rules)}") from None
                    raise
    return unique_by_name(out, {"rule": "--exit-rules", "target": "--exit-targets",
                                "threshold": "--exit-thresholds",
                                "exit_layers": "--exit-layers",
                                "label_mix": "--exit-label-mix", "bits": "--exit-bits",
                                "group_size": "--exit-group-size"})


def _mixed_patience_hint(rules):
    """Fixed thresholds go to every rule, but patience counts heads (t >= 2) while entropy and
    margin take τ in (0, 1] / [0, 1): no threshold suits both, so say which rules to pass."""
    others = " ".join(r for r in rules if r != "patience")
    default = " (by default: " + " ".join(RULES) + ")" if sorted(rules) == sorted(RULES) else ""
    return (f"rule patience is among the --exit-rules{default}, and fixed thresholds go to "
            f"every rule: patience needs an integer t >= 2, {others} a τ between 0 and 1; pass "
            f"--exit-rules {others} for τ thresholds (or sweep --exit-rules patience "
            "--exit-thresholds 2 on its own)")


def run_name(*, exit_thresholds=None, exit_bits=None, **_):
    """Default run-folder suffix for these parameters."""
    return ("fixed" if exit_thresholds else "target") + (
        "" if not exit_bits else "-q" + "-".join(map(str, exit_bits)))


def describe(info, timing=None, eval_summary=None):
    """Markdown lines: threshold, calibration exit histogram and cost, near ties, speed; with
    ``eval_summary`` (an :func:`exit_rules.exit_summary` dict of the eval split, or
    ``info['eval_exit']`` when present) the eval-split histogram, cost and near ties too. (The
    sweep calls ``describe(build.json, timing.json)``; the eval lines of a finished run are also
    written by :func:`runs.plots.markdown.exit_markdown` from the saved ``exit_layer`` arrays.)"""
    thr = info["threshold"]
    lines = [f"- rule `{info['rule']}`, threshold {thr:.4g} ({info['threshold_fitted_on']}"
             + (f", target agreement {info['target']}" if info.get("target") else "") + "); "
             f"{info.get('head_kind', 'linear')} heads after layers {info['exit_layers']} "
             f"({info['fit_source']})"
             + ("; the rule can never fire: no head runs" if info.get("never_fires") else ""),
             f"- calibration: agreement {info['calibration_agreement']:.4f}"]
    # build.json keeps the calibration exit_summary's fields at its top level
    lines += summary_lines({**info, "n": info["n_calibration"]}, "calibration")
    ev = eval_summary if eval_summary is not None else info.get("eval_exit")
    if ev:
        lines += summary_lines(ev, "eval")
    lines += realised_speed_lines(timing, info["ideal_speedup"])
    return "\n".join(lines) + "\n"


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.families.exit.build.build` (calibration, fit,
    cache_dir)."""
    from variants.families.exit import build as early_exit

    return early_exit.build(reference, config, mode=mode, calibration=inputs.calibration,
                            cache_dir=inputs.cache_dir, fit=inputs.fit)


#: what a head that is not a softmax can use instead (:func:`check_model`)
FIX = ("choose --family quant (rtn, gptq or awq), lowrank, prune, w8a8 or exact, which the "
       "head's own contract judges")


def check_model(encoder, configs, model=None):
    """The family's model check: :func:`variants.families.exit.build.check_model`."""
    from variants.families.exit import build as early_exit
    from variants.models.head_output import require_softmax

    require_softmax(model, "--family exit stops on the softmax confidence of its exit heads "
                    "(entropy, top-2 margin, patience of the top option) and fits them by KL to "
                    "the final head's softmax", FIX)
    early_exit.check_model(encoder, configs, model=model)


FAMILY = Family(name="exit", config=ExitConfig, params=PARAMS, add_arguments=add_arguments,
                ladder=ladder, run_name=run_name, build=build, check_model=check_model,
                describe=describe, inputs=("calibration", "fit", "cache_dir"))

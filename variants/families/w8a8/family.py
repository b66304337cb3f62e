"""The w8a8 family (8-bit weights and 8-bit activations on integer GEMMs): config, flags,
ladder. No MLX.

Weights: per-output-channel symmetric int8 (scale max|w| / 127). Activations: quantized per
token at run time, asymmetric uint8 (:mod:`variants.families.w8a8.build`). Optionally SmoothQuant
(Xiao et al. 2023): per-input-channel factors s_j = max|X_j|^α / max|W_:,j|^(1-α) from the fit
split's activations move the activations' outliers into the weights (x / s, W s), one factor
vector per input site (q, k and v share theirs), with α searched per site on the fit split's
rows when not given. Embeddings, norms, softmax and the
decision head stay fp32; ``--int8-skip`` keeps matching Linears fp32 too.
"""

import re
from dataclasses import dataclass

from variants.families import name_number
from variants.families.family import BuildInputs, Family
from variants.families.w8a8.config import ALPHAS  # noqa: F401

SMOOTH_CHOICES = ("off", "on")


def check_skip(pattern, flag="--int8-skip"):
    """Raise ValueError unless ``pattern`` ("" = none) is a valid regular expression."""
    if pattern:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"{flag} {pattern!r} is not a valid regular expression ({e}); "
                             f"e.g. {flag} 'output$'") from None


@dataclass(frozen=True)
class W8A8Config:
    """Parameters of one W8A8 variant (validated on creation).

    ``smooth``: SmoothQuant migration on or off; ``alpha``: its exponent in [0, 1], None =
    searched per input site (q|k|v share one) over :data:`ALPHAS`; ``skip``: regex searched in
    Linear paths, matches stay fp32."""

    smooth: bool = False
    alpha: float | None = None
    skip: str = ""

    def __post_init__(self):
        if self.alpha is not None:
            a = float(self.alpha)
            if not 0.0 <= a <= 1.0:  # also refuses nan
                raise ValueError(f"--smooth-alpha {self.alpha} is outside [0, 1]; pass e.g. "
                                 "--smooth-alpha 0.5, or leave it out to search it per input site")
        check_skip(self.skip)

    @property
    def name(self):
        if not self.smooth:
            base = "w8a8"
        elif self.alpha is None:
            base = "w8a8-sq"
        else:
            base = f"w8a8-sq{name_number(self.alpha, '.2f')}"
        return base + ("-skip" if self.skip else "")


PARAMS = ("smooth", "smooth_alpha", "int8_skip")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("w8a8 family (--family w8a8)")
    g.add_argument("--smooth", nargs="+", choices=SMOOTH_CHOICES, default=None, metavar="S",
                   help="SmoothQuant migration off and/or on: one variant each (default: off on)")
    g.add_argument("--smooth-alpha", type=float, default=None, metavar="A",
                   help="SmoothQuant exponent in [0, 1] (default: searched per input site over "
                        f"{', '.join(map(str, ALPHAS))} on the fit split)")
    g.add_argument("--int8-skip", default="", metavar="REGEX",
                   help="Linears whose path matches stay fp32 (default: none), e.g. "
                        "'attention.out|output$' for attention output and FFN down")


def ladder(*, smooth=None, smooth_alpha=None, int8_skip=""):
    """One W8A8Config per ``smooth`` choice (default both); ValueError on bad values."""
    choices = list(dict.fromkeys(smooth or SMOOTH_CHOICES))
    return [W8A8Config(c == "on", smooth_alpha if c == "on" else None, int8_skip)
            for c in choices]


def run_name(*, int8_skip="", **_):
    """Default run-folder suffix."""
    return "int8" + ("-skip" if int8_skip else "")


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.families.w8a8.build.build`."""
    from variants.families.w8a8 import build as w8a8

    return w8a8.build(reference, config, mode=mode, fit=inputs.fit, cache_dir=inputs.cache_dir)


def check_model(encoder, configs, model=None):
    """Raise ValueError for a ``--int8-skip`` that leaves no Linear in int8, or a model without
    encoder Linears (:func:`variants.families.w8a8.build.check_model`)."""
    from variants.families.w8a8 import build as w8a8

    w8a8.check_model(encoder, configs)


def describe(info, timing=None):
    """Markdown: the kernel, which Linears run in int8, per-site α and output errors. The
    kernel named is the timed one (timing.json's ``kernel.variant``) when ``timing`` has it:
    build.json's comes from the quality build, which may be the simulated one."""
    kernel = ((timing or {}).get("kernel") or {}).get("variant") or info["kernel"]
    simulated = (kernel == "w8a8-simulated") if timing and timing.get("kernel") \
        else info.get("simulated_speed")
    lines = [f"- {info['int8_layers']} Linears on int8 GEMMs ({info['int8_share']:.1%} of the "
             f"encoder Linears' weights); kept fp32: "
             f"{', '.join(info['kept_fp32']) or 'none'}",
             f"- kernel: {kernel}" + (" (speed columns are simulated: fake-quantized fp32)"
                                      if simulated else "")]
    if info.get("smooth"):
        a = info.get("alphas", {})
        lines.append(f"- SmoothQuant α per input site: "
                     f"{min(a.values()):.1f}-{max(a.values()):.1f} "
                     f"(median output error {info['median_error_smooth']:.3g} vs "
                     f"{info['median_error_plain']:.3g} without), from "
                     f"{info['fit_rows']} fit-split token rows")
    return "\n".join(lines) + "\n"


FAMILY = Family(name="w8a8", config=W8A8Config, params=PARAMS, add_arguments=add_arguments,
                ladder=ladder, run_name=run_name, build=build, check_model=check_model,
                describe=describe, inputs=("fit", "cache_dir"),
                # the model that runs is judged: native where oneDNN is built (family.py)
                judged_in_speed_mode=lambda vcfg: True)

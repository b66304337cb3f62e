"""The exact family: savings that keep every answer (de-duplication, a result cache, output
selection): config, flags, ladder and report lines. No MLX: the variants are built by
:mod:`variants.families.exact.build`, the workload streams timed by
:mod:`variants.families.exact.workload`.

Every variant must show zero drift against the reference (0 flips, every example certified):
``dedup`` is bit-identical on batches without repeats and float round-off elsewhere, ``cache``
and ``outsel`` float round-off (build.json's ``exactness`` says which). ``null-control`` is the **null
control**: the reference itself recomputed on the plain MLX path (compiled layers and kernels
off, :mod:`variants.runtime.plain`), float round-off by construction; it saves nothing and must
pass every clause of every packaged contract (a failure is a checker or contract defect, or
numerical noise the contract counts as a change).
"""

import argparse
import math
from dataclasses import dataclass

from metrics._checks import short_repr
from variants.families import unique_by_name
from variants.families.family import BuildInputs, Family

KINDS = ("dedup", "cache", "outsel", "null-control")
#: kinds with no repeat-dependent saving: no workload streams
NO_WORKLOADS = ("outsel", "null-control")
DEFAULT_KINDS = ("dedup", "cache")
DEFAULT_CACHE_SIZE = 4096
DEFAULT_ZIPF_EXPONENT = 1.1
DEFAULT_WORKLOAD_CALLS = 20
DEFAULT_WORKLOAD_BATCH = 32


@dataclass(frozen=True)
class ExactConfig:
    """One exact variant: ``kind`` in KINDS; ``cache_size`` (LRU rows) for ``cache`` only."""

    kind: str = "dedup"
    cache_size: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"exact kind {self.kind!r} is not known; choose from {KINDS} "
                             "(--exact-kinds)")
        if self.kind == "cache":
            if not (isinstance(self.cache_size, int) and self.cache_size >= 1):
                raise ValueError(f"cache size {self.cache_size!r} must be an integer >= 1; pass "
                                 "e.g. --cache-sizes 4096")
        elif self.cache_size is not None:
            raise ValueError(f"cache_size is for the cache kind only, not {self.kind!r}")

    @property
    def name(self):
        return f"cache-{self.cache_size}" if self.kind == "cache" else self.kind


PARAMS = ("exact_kinds", "cache_sizes", "zipf_exponent", "workload_calls", "workload_batch")


class _Unique(argparse.Action):
    """Stores a ``nargs="+"`` flag's values once each, in the order given (``--exact-kinds
    dedup dedup`` is one dedup variant, and run.json records it once)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(dict.fromkeys(values)))


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("exact family (--family exact)")
    g.add_argument("--exact-kinds", nargs="+", choices=KINDS, default=list(DEFAULT_KINDS),
                   action=_Unique,
                   help="dedup: identical prepared rows of a call run once; cache: + an LRU of "
                        "results across calls; outsel: the last layer only at the positions the "
                        "output reads (CLS heads, marker models; not mean pooling); null-control: the "
                        "null control, the reference recomputed on the plain MLX path (compiled "
                        "layers and kernels off): saves nothing, must pass every contract")
    g.add_argument("--cache-sizes", type=int, nargs="+", default=None, action=_Unique,
                   metavar="N", help="LRU entries (rows) of each cache variant (only with "
                                     f"cache in --exact-kinds; None = {DEFAULT_CACHE_SIZE})")
    g.add_argument("--zipf-exponent", type=float, default=DEFAULT_ZIPF_EXPONENT, metavar="A",
                   help="repeated workload: eval rows drawn with P(rank k) ∝ k^-A (seeded by "
                        "--seed)")
    g.add_argument("--workload-calls", type=int, default=DEFAULT_WORKLOAD_CALLS, metavar="C",
                   help="calls per timed workload stream")
    g.add_argument("--workload-batch", type=int, default=DEFAULT_WORKLOAD_BATCH, metavar="B",
                   help="rows per call of the workload streams")


def ladder(*, exact_kinds=DEFAULT_KINDS, cache_sizes=None,
           zipf_exponent=DEFAULT_ZIPF_EXPONENT, workload_calls=DEFAULT_WORKLOAD_CALLS,
           workload_batch=DEFAULT_WORKLOAD_BATCH):
    """The variant configs of one sweep (ValueError naming the flag if a value is bad).

    ``cache_sizes`` None means (DEFAULT_CACHE_SIZE,) when ``cache`` is among ``exact_kinds``;
    sizes given without the cache kind are refused (they would be ignored). Repeated kinds and
    sizes give one variant each."""
    if not exact_kinds:
        raise ValueError("no exact kind given; pass e.g. --exact-kinds dedup cache")
    if cache_sizes is not None and "cache" not in exact_kinds:
        raise ValueError(f"--cache-sizes is for the cache kind, which --exact-kinds "
                         f"{short_repr(' '.join(map(str, dict.fromkeys(exact_kinds))))} leaves "
                         "out; add cache to --exact-kinds or drop --cache-sizes")
    if cache_sizes is None:
        cache_sizes = (DEFAULT_CACHE_SIZE,)
    if not (isinstance(zipf_exponent, (int, float)) and math.isfinite(zipf_exponent)
            and zipf_exponent > 0):
        raise ValueError(f"--zipf-exponent {zipf_exponent!r} must be a finite number > 0, "
                         "e.g. 1.1")
    for flag, v, top in (("--workload-calls", workload_calls, 10_000),
                         ("--workload-batch", workload_batch, 1024)):
        if not (isinstance(v, int) and 1 <= v <= top):  # the top: minutes, not hours, of timing
            raise ValueError(f"{flag} {v!r} must be an integer in [1, {top}], e.g. 32")
    if "cache" in exact_kinds and not cache_sizes:
        raise ValueError("no cache size given; pass e.g. --cache-sizes 4096")
    out = []
    for k in dict.fromkeys(exact_kinds):
        if k == "cache":
            out += [ExactConfig("cache", s) for s in dict.fromkeys(cache_sizes)]
        else:
            out.append(ExactConfig(k))
    return unique_by_name(out, {"kind": "--exact-kinds", "cache_size": "--cache-sizes"})


def run_name(*, exact_kinds=DEFAULT_KINDS, **_):
    """Default run-folder suffix."""
    return "-".join(dict.fromkeys(exact_kinds))


def _f(x, spec=".2f"):
    return "–" if x is None else format(x, spec)


def describe(info, timing=None):
    """Markdown for the report: exactness, and the two workloads side by side."""
    lines = [f"- exact variant `{info['kind']}`"
             + (f" (LRU of {info['cache_size']} rows)" if info["kind"] == "cache" else "")
             + f": logits {info['exactness']}"]
    if info["kind"] == "null-control":
        lines.append("- the null control: the reference's own weights on a second compute path; "
                     "any clause it fails measures the checker, not an approximation")
        return "\n".join(lines) + "\n"
    if info["kind"] == "outsel":
        lines.append(f"- the output reads `{info['reads']}` positions; the last of "
                     f"{info['n_layers']} layers runs its query, attention output and MLP there "
                     "only (keys and values from every token); no repeat-dependent saving, so "
                     "no workload streams (timing.json `batches` is the speed-up)")
        return "\n".join(lines) + "\n"
    wl = (timing or {}).get("workloads")
    if not wl:
        return "\n".join(lines + ["- workloads: not timed"]) + "\n"
    s = wl["settings"]
    lines.append(f"- workloads: {s['calls']} calls × B={s['batch_size']} rows at most, end to "
                 f"end, reference and variant alternated per call; zipf exponent "
                 f"{s['zipf_exponent']}, seed {s['seed']}, over {s['n_eval']} eval rows")
    cache = info["kind"] == "cache"
    head = "| workload | rows | repeat rate | U/N | ideal N/U |"
    rule = "|---|---|---|---|---|"
    if cache:
        head += " h | ideal 1/(1−h) | model 1−h+hε | measured var/ref |"
        rule += "---|---|---|---|"
    head += (" mean ms ref / var | measured speed-up (mean / median) | cold first call ref / "
             "var ms |")
    rule += "---|---|---|"
    lines += ["", head, rule]
    for name in ("eval", "zipf"):
        w = wl[name]
        row = (f"| {name} | {w['rows']} | {_f(w['repeat_rate'])} | {_f(w['U_over_N'], '.3f')} "
               f"| {_f(w['ideal_dedup_speedup'])}× |")
        if cache:
            row += (f" {_f(w['h'], '.3f')} | {_f(w['ideal_speedup'])}× | "
                    f"{_f(w['model_relative_latency'], '.3f')} | "
                    f"{_f(w['measured_relative_latency'], '.3f')} |")
        row += (f" {_f(w['ref_mean_ms'], '.1f')} / {_f(w['var_mean_ms'], '.1f')} | "
                f"{_f(w['speedup_mean'])}× / {_f(w['speedup_median'])}× | "
                f"{_f(w['cold_first_call_ms']['ref'], '.1f')} / "
                f"{_f(w['cold_first_call_ms']['var'], '.1f')} |")
        lines.append(row)
    lines.append("")
    if cache:
        hc = wl["hit_cost"]
        lines.append(f"- hit cost ε = {hc['epsilon']:.3f} (a {hc['rows']}-row call: all hits "
                     f"{hc['hit_median_ms']:.2f} ms vs all misses {hc['miss_median_ms']:.2f} ms; "
                     f"miss path {hc['miss_overhead']:.3f}× the reference's "
                     f"{hc['ref_median_ms']:.2f} ms): the same request repeated on purpose")
        lines.append("- timing.json `batches`/`end_to_end` (the summary's speed-up) time the "
                     "miss path: the common timing repeats its requests (B=1: a few texts in "
                     "turn), so the cache is emptied before each of its calls; repeats are "
                     "priced in the table above")
    return "\n".join(lines) + "\n"


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.families.exact.build.build`."""
    from variants.families.exact import build as exact

    return exact.build(reference, config, mode=mode)


def check_model(module, configs, model=None):
    """``outsel`` on a module it cannot apply to: one-line ValueError, before any write."""
    from variants.families.exact import build as exact

    exact.check_model(module, configs)


def timed_variant(variant, vcfg):
    """The common timing's view of ``variant``: a cache variant with its cache emptied before
    every call (:class:`variants.families.exact.build.MissPath`)."""
    from variants.families.exact import build as exact

    return exact.timed_variant(variant, vcfg)


def time_extra(reference, variant, eval_taskset, cfg, vcfg):
    """timing.json additions: ``workloads`` (eval as is and Zipf-repeated streams,
    :func:`variants.families.exact.workload.workload_timing`); nothing for ``outsel`` and
    ``null``."""
    if vcfg.kind in NO_WORKLOADS:
        return {}
    from variants.families.exact.workload import workload_timing

    p = cfg.params
    out = {} if vcfg.kind != "cache" else {"timed_as": (
        "batches/end_to_end: the miss path (cache emptied before every call, since the timing "
        "repeats its requests); workloads: streams with the cache cold at the start")}
    out["workloads"] = workload_timing(
        reference, variant, eval_taskset, kind=vcfg.kind,
        batch_size=p.get("workload_batch", DEFAULT_WORKLOAD_BATCH),
        calls=p.get("workload_calls", DEFAULT_WORKLOAD_CALLS),
        exponent=p.get("zipf_exponent", DEFAULT_ZIPF_EXPONENT), seed=cfg.seed)
    return out


def extra_stale(timing, cfg, vcfg):
    """On resume: why ``timing``'s workloads no longer fit ``cfg`` (their saved settings differ
    from --workload-batch / --workload-calls / --zipf-exponent / --seed now), or None."""
    if vcfg.kind in NO_WORKLOADS:
        return None
    p = cfg.params
    want = {"batch_size": p.get("workload_batch", DEFAULT_WORKLOAD_BATCH),
            "calls": p.get("workload_calls", DEFAULT_WORKLOAD_CALLS),
            "zipf_exponent": float(p.get("zipf_exponent", DEFAULT_ZIPF_EXPONENT)),
            "seed": cfg.seed}
    have = ((timing or {}).get("workloads") or {}).get("settings") or {}
    diff = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
    return f"workloads timed with other settings {diff} (old, new)" if diff else None


FAMILY = Family(name="exact", config=ExactConfig, params=PARAMS, add_arguments=add_arguments,
                ladder=ladder, run_name=run_name, build=build, check_model=check_model,
                describe=describe, inputs=(), time_extra=time_extra,
                timed_variant=timed_variant, extra_stale=extra_stale)

"""W8A8: int8 weights and per-token int8 activations, multiplied on integer GEMMs.

Per Linear W (out, in) with bias b:

- weights, per output channel j, symmetric: s_w,j = max_k |W_jk| / 127 (1 when the row is 0),
  Wq = clip(round(W / s_w), -127, 127) as int8;
- activations, per token (row) i at run time, asymmetric uint8 over [min(x_i, 0), max(x_i, 0)]:
  s_i = (hi - lo) / 255, zp_i = round(-lo / s_i), q = clip(round(x / s_i) + zp_i, 0, 255);
- y_ij = s_i s_w,j Σ_k (q_ik - zp_i) Wq_jk + b_j (int32 accumulation).

``native`` runs the compiled op ``int8_linear`` of :mod:`variants.runtime.qkernel`: oneDNN's
u8 x s8 matmul primitive on each weight reordered once when the variant is built (kernel
``int8-matmul-dnnl-prepacked``), or, where oneDNN has no such primitive, its
``dnnl_gemm_u8s8s32`` (``int8-gemm-dnnl``; the same int32 sums), VNNI / AVX-512 / AVX2 kernels
chosen by oneDNN at run time; ``simulated``
computes the same quantization in MLX and multiplies the dequantized values in fp32. For the same
input the two agree to fp32 round-off (the codes are identical: same divisions, round half to
even), so quality figures do not depend on the kernel. Without oneDNN, native runs simulated
(kernel ``w8a8-simulated``; one line on stderr says so).

SmoothQuant (Xiao et al. 2023, §4): per input channel s_j = max|X_j|^α / max_o|W_oj|^(1-α), then
x / s and W s (same product). Here 1/s is not folded into the preceding LayerNorm: it is applied
inside the per-token quantizer (one multiply per input element, K per row against the GEMM's
K·N multiply-adds per row), which also serves inputs that follow no norm (attention output,
FFN down). The factors are per input site (:func:`variants.arch.activations.input_site`): q, k
and v read one input, so they share one s (from their stacked weights) and the fused layer keeps
one quantized input and one stacked q|k|v GEMM; α is chosen per site from :data:`ALPHAS` by the
summed W8A8 output error of the site's Linears on fit-split rows.
"""

import re
import sys
import time

import mlx.core as mx
import numpy as np

from variants.arch import activations
from variants.runtime import parallel, qkernel
from variants.families.w8a8.config import ALPHAS
from variants.runtime.int8_linear import (NAMES, Int8Linear, _kernel, int8_record, quantize_rows,  # noqa: F401
                                         quantize_weight)

#: token rows per Linear input kept for the α search (sampled evenly from the fit split)
SAMPLE_ROWS = 512
#: multiply-adds per int8 lane against one fp32 lane (VNNI: four 8-bit products per 32 bits)
INT8_GAIN = 4.0
_warned = {"done": False}


def target_paths(module, cfg):
    """Encoder Linear paths that run in int8 (:func:`variants.arch.activations.target_linears`
    minus ``cfg.skip`` matches) and those kept fp32 by ``cfg.skip``."""
    paths = activations.target_linears(module)
    pat = re.compile(cfg.skip) if cfg.skip else None
    keep = [p for p in paths if pat and pat.search(p)]
    return [p for p in paths if p not in keep], keep


#: the most inputs (K) an int8 Linear may have: its int32 sums, and the zero-point correction
#: zp x colsum, stay exact while 255 x 128 x K < 2^31 (the compiled ops refuse more too)
MAX_IN = 65793


def check_model(module, cfgs):
    """Raise ValueError, before anything is written, when the model has no encoder Linear, a
    config's ``--int8-skip`` keeps every one fp32, or a Linear to run in int8 has more than
    :data:`MAX_IN` inputs."""
    for cfg in cfgs:
        run, keep = target_paths(module, cfg)
        if cfg.skip and not keep:
            raise ValueError(f"--int8-skip {cfg.skip!r} matches no encoder Linear (they are e.g. "
                             f"{', '.join((run or ['none'])[:2])}); fix the pattern or drop it")
        if not run:
            what = (f"--int8-skip {cfg.skip!r} matches all {len(keep)} encoder Linears"
                    if keep else "the model has no nn.Linear under encoder.layers")
            raise ValueError(f"w8a8: no Linear left to run in int8 ({what}); pass a narrower "
                             "--int8-skip, e.g. 'output$'")
        mods = dict(module.named_modules())
        wide = [p for p in run if mods[p].weight.shape[1] > MAX_IN]
        if wide:
            raise ValueError(f"w8a8: {wide[0]} has {mods[wide[0]].weight.shape[1]} inputs; int8 "
                             f"sums are exact in int32 up to {MAX_IN} (255 x 128 x K < 2^31); "
                             "keep it fp32 with --int8-skip")


class _SampleSink:
    """Per Linear input site: max |x| per channel and up to SAMPLE_ROWS real-token rows."""

    def __init__(self, rng):
        self.mask, self.seen_this_call, self.absmax, self.rows = None, set(), {}, {}
        self.rng = rng

    def record(self, site, x):
        if site in self.seen_this_call:
            return
        self.seen_this_call.add(site)
        a = np.array(x.astype(mx.float32))[self.mask]
        m = np.abs(a).max(axis=0)
        self.absmax[site] = np.maximum(self.absmax.get(site, m), m)
        keep = a[self.rng.choice(len(a), min(len(a), SAMPLE_ROWS // 4), replace=False)]
        old = self.rows.get(site)
        self.rows[site] = keep if old is None else np.concatenate([old, keep])[-SAMPLE_ROWS:]


def collect_samples(reference, fit, paths, seed=0):
    """({site: max|x| (in,)}, {site: rows (n, in) float32}) of the Linear inputs at ``paths``
    over the fit split. Raises ValueError without fit texts."""
    if fit is None or len(fit) == 0:
        raise ValueError("w8a8 SmoothQuant needs fit-split texts for its activation statistics; "
                         "pass --n-fit 200 or more (or --smooth off)")
    sink = _SampleSink(np.random.default_rng(seed))
    import copy

    inner = copy.deepcopy(reference.module)
    mods = dict(inner.named_modules())
    for p in paths:
        activations.set_module(inner, p, activations._Recorder(mods[p], activations.input_site(p),
                                                               sink))
    recording = reference.replace_module(activations._MaskGrabber(inner, sink))
    batches, _ = recording.prepare(fit.subset(np.arange(min(len(fit), 256))), 32)
    with parallel.single_stream():
        for b in batches:
            mx.eval(recording.forward(b))
    return sink.absmax, sink.rows


def smooth_factors(absmax_x, w, alpha):
    """SmoothQuant's s (in,) float64: max|X_j|^α / max_o|W_oj|^(1-α), floored at 1e-5."""
    wmax = np.abs(np.asarray(w, np.float64)).max(axis=0)
    s = np.power(np.maximum(absmax_x, 1e-5), alpha) / np.power(np.maximum(wmax, 1e-5), 1 - alpha)
    return np.maximum(s, 1e-5)


def output_error(linear, rows, smooth):
    """Mean squared error of the simulated W8A8 output against the fp32 Linear on ``rows``."""
    x = mx.array(rows)
    ref = x @ linear.weight.T
    q = Int8Linear(linear, native=False, smooth=smooth)
    got = q.simulated(x) - (q["bias"] if "bias" in q else 0)
    return float(mx.mean(mx.square(got - ref)))


def site_weight(linears):
    """The Linears reading one input site stacked along the output axis: (Σ out, in) float64
    (q|k|v of an attention block; one Linear elsewhere)."""
    return np.concatenate([np.array(m.weight, np.float64) for m in linears])


def search_alpha(absmax_x, rows, linears, alpha=None):
    """(α, {α: error}) for one input site: the error of an α is the summed
    :func:`output_error` of the ``linears`` reading the site, all smoothed by the one factor
    vector of :func:`smooth_factors` over their stacked weights (so q, k and v keep one
    quantized input and one stacked GEMM). ``alpha`` None searches :data:`ALPHAS` (α = 0 is
    plain W8A8, kept when nothing beats it); a number is taken as is, with α = 0 evaluated
    beside it."""
    w = site_weight(linears)
    grid = ALPHAS if alpha is None else (0.0, alpha)
    errs = {}
    for a in grid:
        s = None if a == 0 else smooth_factors(absmax_x, w, a)
        errs[a] = sum(output_error(lin, rows, s) for lin in linears)
    return (min(errs, key=errs.get) if alpha is None else alpha), errs


def build(reference, cfg, mode="simulated", fit=None, cache_dir=None):
    """The reference DecisionModel with its encoder Linears as :class:`Int8Linear`.

    Returns (variant, info): ``int8_layers``, ``kept_fp32``, ``int8_share`` (of the encoder
    Linears' weights), ``kernel``, ``simulated_speed``, ``model_bytes``, ``build_seconds``;
    with SmoothQuant ``alphas`` ({input site: α}, :func:`variants.arch.activations.input_site`),
    ``errors`` ({input site: [plain, smoothed] summed over the site's Linears}),
    ``median_error_plain`` / ``_smooth``, ``fit_rows``. Raises ValueError (no Linear to run in
    int8, SmoothQuant without fit texts)."""
    import copy

    t0 = time.perf_counter()
    module = copy.deepcopy(reference.module)
    run, keep = target_paths(module, cfg)
    check_model(module, [cfg])
    mods = dict(module.named_modules())
    native = mode == "native"
    if native and _kernel() is None and not _warned["done"]:
        _warned["done"] = True
        k = qkernel.load()
        why = qkernel.why_unavailable() if k is None else (
            f"oneDNN's int8 GEMM gives no exact sums on this CPU ({k.int8_cpu_isa()})"
            if k.has_dnnl() else "oneDNN not found (apt-get install libdnnl-dev, then "
            "python -m variants.runtime.qkernel --force)")
        print(f"variants: w8a8 runs simulated (fake-quantized fp32): {why}", file=sys.stderr)
    info = {"int8_layers": len(run), "kept_fp32": keep, "smooth": cfg.smooth}
    smooth = {}
    if cfg.smooth:
        absmax, rows = collect_samples(reference, fit, run)
        sites = {}
        for p in run:
            sites.setdefault(activations.input_site(p), []).append(p)
        alphas, errors = {}, {}
        for site, paths in sites.items():
            best, errs = search_alpha(absmax[site], rows[site], [mods[p] for p in paths],
                                      None if cfg.alpha is None else cfg.alpha)
            alphas[site], errors[site] = best, [errs[0.0], errs[best]]
            if best > 0:
                s = smooth_factors(absmax[site], site_weight([mods[p] for p in paths]), best)
                smooth.update({p: s for p in paths})
        info.update(alphas=alphas, errors=errors, fit_rows=int(sum(len(r) for r in rows.values())),
                    median_error_plain=float(np.median([e[0] for e in errors.values()])),
                    median_error_smooth=float(np.median([e[1] for e in errors.values()])))
    total = sum(mods[p].weight.size for p in run + keep)
    for p in run:
        activations.set_module(module, p, Int8Linear(mods[p], native=native, smooth=smooth.get(p)))
    mx.eval(module.parameters())
    from variants.runtime.memory import model_bytes

    variant = reference.replace_module(module)
    share = sum(mods[p].weight.size for p in run) / max(total, 1)
    info.update(int8_share=share,
                # Amdahl over the encoder Linears' multiply-adds: an int8 (VNNI) lane does
                # INT8_GAIN times an fp32 lane's; the plausibility alarm's ceiling, not a claim
                ideal_speedup=1.0 / ((1.0 - share) + share / INT8_GAIN),
                kernel=kernel_name(module) or NAMES["simulated"],
                # how the integer GEMM is exact on this CPU (int8_linear.scheme), None simulated
                int8=int8_record(kernel_name(module)),
                simulated_speed=not (native and _kernel() is not None),
                model_bytes=model_bytes(variant), build_seconds=time.perf_counter() - t0,
                mode=mode)
    return variant, info


def kernel_name(module):
    """The kernel of the module's Int8Linears (``int8-matmul-dnnl-prepacked`` /
    ``int8-gemm-dnnl`` / ``w8a8-simulated``, comma-joined when mixed), or None."""
    names = sorted({m.kernel for _, m in module.named_modules() if isinstance(m, Int8Linear)})
    return ", ".join(names) or None

"""The quant family's learned quantizers: AWQ, GPTQ and distilled scales (DWQ), one build.

Every method writes the packed format of round-to-nearest (``mx.quantize``: packed uint32
codes, per-group scales and biases, :mod:`variants.families.quant.affine_codes`) into the same
``nn.QuantizedLinear`` layers, so native execution, the compiled CPU kernel, export and verify
read them unchanged. AWQ's per-input-channel scale 1/s cannot be folded into a post-LN BERT's
LayerNorm (it is also the residual stream): such a layer is an :class:`InputScaledLinear` (the
input times 1/s, then the packed Linear), which the fused whole-layer CPU kernels do not take
(that layer runs Linear by Linear).

Only the encoder's Linears (:func:`variants.arch.activations.target_linears`) are learned; a head or
embedding table the config also quantizes stays round-to-nearest. The statistics come from the
**fit** split (:func:`variants.arch.activations.cached_collect`): never calibration or eval rows.
AWQ and GPTQ results are cached per Linear (:mod:`variants.families.quant.layer_cache`, keyed by
the layer's weight, its width and group size, the method and its settings, and its input
site's fit statistics), DWQ's under ``cache_dir/quant/<model>-<key>.npz``, keyed by the
reference's weights, the fit split's fingerprint, the method, its settings, the widths and the
version.
"""

import copy
import json
import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_unflatten

from variants.arch import activations
from variants.arch.input_scaled import InputScaledLinear  # noqa: F401  (learned.InputScaledLinear)
from variants.families.quant import affine_codes, awq, dwq, gptq, layer_cache
from variants.families.quant import build as quantize
from variants.families.quant.row_use import row_use_of

VERSION = 5  # 5: a cosine readout's options embedded by DWQ's student itself

SETTINGS = {
    "awq": {"grid": awq.GRID, "clip_grid": awq.CLIP_GRID, "min_clip": awq.MIN_CLIP,
            "statistic": "mean |x| per input channel"},
    "gptq": {"damping": gptq.DAMPING, "block_size": gptq.BLOCK_SIZE, "act_order": False},
    "awq-gptq": {"awq_grid": awq.GRID, "damping": gptq.DAMPING, "block_size": gptq.BLOCK_SIZE,
                 "act_order": False},
    "dwq": {"init": dwq.INIT, "epochs": dwq.EPOCHS, "learning_rate": dwq.LEARNING_RATE,
            "warmup_share": dwq.WARMUP_SHARE, "schedule": "linear warm-up, cosine decay",
            "batch_size": dwq.BATCH_SIZE, "max_texts": dwq.MAX_TEXTS,
            "valid_texts": dwq.VALID_TEXTS, "optimizer": "Adam",
            "parametrisation": "scale = s0 (1 + 15 theta / (2^bits - 1)), bias = b0 + s0 beta",
            "trains": "scales, biases" + (", encoder LayerNorms" if dwq.TRAIN_NORMS else ""),
            "loss": "KL(p_ref || p_q) at the reference's temperatures + hidden_weight x mean "
                    "relative squared error of each layer's output",
            "hidden_weight": dwq.HIDDEN_WEIGHT, "learn_codes": dwq.LEARN_CODES},
}


def check_inputs(cfg, fit):
    """ValueError (one line) when ``cfg.method`` needs activations and ``fit`` has no rows."""
    if cfg.method != "rtn" and (fit is None or len(fit) == 0):
        raise ValueError(f"--quant-method {cfg.method} learns from fit-split activations, but "
                         "the fit split is empty; pass --n-fit > 0 (or use --quant-method rtn)")


def _rel(err, W, G):
    base = gptq.output_error(W, np.zeros_like(W), G)
    return float(err / base) if base > 0 else 0.0


def _learn(reference, cfg, paths, settings, stats, cache_dir=None, progress=True, method=None):
    """AWQ, GPTQ or (``method`` "awq-gptq", DWQ's start) AWQ's scales with GPTQ's codes of
    ``paths``: {path: (codes, scales, biases, input_scale|None)} and the
    per-layer rows (relative output errors of RTN and of the method on the fit statistics,
    ``learn_s``: the layer's learning seconds, ``reused``: read from the per-layer cache,
    :mod:`variants.families.quant.layer_cache`, when ``cache_dir``)."""
    from tqdm import tqdm

    method = method or cfg.method
    mods = dict(reference.module.named_modules())
    out, rows, sites = {}, [], {}
    for path in tqdm(paths, desc=f"{method} layers", unit="layer", leave=False,
                     disable=None if progress else True):
        bits, gs = settings[path]
        W = np.array(mods[path].weight, np.float32)
        site = activations.input_site(path)
        s = stats[site]
        key = None
        if cache_dir is not None:
            if site not in sites:
                sites[site] = layer_cache.site_fingerprint(s)
            key = layer_cache.layer_key(W, sites[site], method, SETTINGS[method], bits, gs)
            hit = layer_cache.load(cache_dir, method, key)
            if hit is not None:
                out[path] = hit[0]
                rows.append(dict(hit[1], path=path, reused=True))
                continue
        t0 = time.perf_counter()
        G = s.gram
        rtn = affine_codes.quantize(W, bits, gs)
        err_rtn = gptq.output_error(W, affine_codes.dequantize(*rtn, gs), G)
        row = {"path": path, "bits": bits, "group_size": gs}
        inv = None
        if method == "gptq":
            codes, scales, biases = gptq.quantize(W, G, bits, gs, where=path)
        elif method == "awq-gptq":
            codes, scales, biases, inv, facts = awq.quantize_gptq(W, G, s.mean_abs, bits, gs,
                                                                  where=path)
            row.update(alpha=facts["alpha"])
            inv = None if facts["alpha"] == 0 else inv
        else:
            codes, scales, biases, inv, facts = awq.quantize(W, G, s.mean_abs, bits, gs)
            row.update(alpha=facts["alpha"], clipped_groups=facts["clipped_groups"])
            inv = None if facts["alpha"] == 0 else inv
        deq = affine_codes.dequantize(codes, scales, biases, gs)
        err = gptq.output_error(W, deq if inv is None else deq * inv, G)
        row.update(rtn_rel_error=_rel(err_rtn, W, G), rel_error=_rel(err, W, G),
                   learn_s=time.perf_counter() - t0)
        out[path] = (codes, scales, biases, inv)
        if key is not None:
            layer_cache.save(cache_dir, method, key, out[path], row)
        rows.append(dict(row, reused=False))
    return out, rows


def _distill(reference, cfg, start, rows, stats, fit, log):
    """DWQ from the ``start`` layers (:data:`dwq.INIT`'s): the trained layers, rows with
    ``init_rel_error`` (the start's) and ``rel_error`` (after training), and the training
    facts. The student carries the embedding tables and head ``cfg`` quantizes by
    round-to-nearest (``--quantize-embeddings``, ``--quantize-head``, or a ``--bits-map`` entry
    naming a table; dequantized), so the training compensates for them too."""
    mods = dict(reference.module.named_modules())
    rows = [dict(r) for r in rows]
    layers = {r["path"]: (*start[r["path"]][:3], r["group_size"], start[r["path"]][3])
              for r in rows}
    student = None
    if cfg.quantize_embeddings or cfg.quantize_head or cfg.bits_map:  # (a map may name a table)
        native = quantize.quantize_module(reference.module, cfg, "native",
                                          row_use=row_use_of(reference, fit, cfg))[0]
        if any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) and p not in layers
               for p, m in native.named_modules()):
            student = _dense(native)
    trained, norms, facts = dwq.distill(reference, layers, fit, module=student,
                                        widths={r["path"]: r["bits"] for r in rows})
    out = {}
    for row in rows:
        p = row["path"]
        _, _, _, inv = start[p]
        c, s, b = trained[p]
        W = np.array(mods[p].weight, np.float32)
        G = stats[activations.input_site(p)].gram
        deq = affine_codes.dequantize(c, s, b, row["group_size"])
        row["init_rel_error"] = row["rel_error"]
        row["rel_error"] = _rel(gptq.output_error(W, deq if inv is None else deq * inv, G), W, G)
        out[p] = (c, s, b, inv)
    if log:
        log(f"distilled scales: held-out KL {facts['kl_before']:.4g} -> {facts['kl_after']:.4g}")
    return out, rows, norms, facts


def _cache_path(reference, cfg, fit, cache_dir):
    from pathlib import Path

    key = reference.cache_key(activations.module_fingerprint(reference.module),
                              fit.fingerprint(), cfg.method, SETTINGS[cfg.method], cfg.bits,
                              cfg.group_size, cfg.bits_map, cfg.quantize_head,
                              cfg.quantize_embeddings, VERSION)
    return Path(cache_dir) / "quant" / f"{reference.name}-{cfg.method}-{key}.npz"


def learned_layers(reference, cfg, fit, cache_dir=None, log=None):
    """The learned layers of ``cfg`` (read from / written to the cache when ``cache_dir``).

    AWQ and GPTQ are cached per Linear (:mod:`variants.families.quant.layer_cache`: a layer
    learned for one bit map is re-used by every map that gives it the same width); DWQ, which
    trains all layers together, per whole config.

    Returns ``(layers, norms, facts)``: layers {path: (codes (o, n) uint8, scales, biases
    (o, n/g) float32, input_scale (n,) float32 or None)}; norms {parameter name: (D,) float32}
    (DWQ's trained LayerNorm weights and biases; empty for the other methods); facts
    (JSON-able) with ``layers`` (per-layer
    rows: bits, group size, relative output error of RTN and of the method on the fit
    statistics, ``learn_s``, ``reused``), ``layers_reused`` (Linears read from the per-layer
    cache), ``build_s`` (this build's seconds plus the first learning's seconds of every
    re-used layer: the method's cost from scratch), ``cached`` (nothing learned now) and the
    method's own facts. Raises ValueError on bad input."""
    check_inputs(cfg, fit)
    whole = None if cache_dir is None or cfg.method != "dwq" else \
        _cache_path(reference, cfg, fit, cache_dir)
    if whole is not None and whole.exists():
        try:
            with np.load(whole) as z:
                facts = json.loads(str(z["facts"]))
                layers = {p: (z[f"{p}|codes"], z[f"{p}|scales"], z[f"{p}|biases"],
                              z[f"{p}|input_scale"] if f"{p}|input_scale" in z else None)
                          for p in facts["paths"]}
                norms = {k: z[f"norm|{k}"] for k in facts.get("norms", [])}
            facts["cached"] = True
            return layers, norms, facts
        except (OSError, KeyError, ValueError):
            pass  # unreadable: learn again and overwrite
    t0 = time.perf_counter()
    settings = quantize.layer_settings(reference.module, cfg) or {}
    skipped = []
    predicate = quantize.make_predicate(cfg, skipped, settings or None)
    mods = dict(reference.module.named_modules())
    paths = [p for p in activations.target_linears(reference.module) if predicate(p, mods[p])]
    settings = {p: tuple(settings[p][:2]) if p in settings else (cfg.bits, cfg.group_size)
                for p in paths}
    stats = activations.cached_collect(reference, fit, cache_dir=cache_dir, log=log)
    if cfg.method == "dwq":  # from its start's layers (their per-Linear cache entries too)
        start, srows = _learn(reference, cfg, paths, settings, stats, cache_dir,
                              method=dwq.INIT)
        layers, rows, norms, extra = _distill(reference, cfg, start, srows, stats, fit, log)
        extra["start_build_s"] = sum(r.get("learn_s", 0.0) for r in srows)
        reused_s = sum(r.get("learn_s", 0.0) for r in srows if r.get("reused"))
        n_reused = sum(bool(r.get("reused")) for r in srows)
    else:
        layers, rows = _learn(reference, cfg, paths, settings, stats, cache_dir)
        extra, norms = {}, {}
        reused_s = sum(r.get("learn_s", 0.0) for r in rows if r.get("reused"))
        n_reused = sum(bool(r.get("reused")) for r in rows)
    facts = {"paths": paths, "layers": rows, "build_s": time.perf_counter() - t0 + reused_s,
             "fit_rows": len(fit), "layers_reused": n_reused, "norms": sorted(norms), **extra}
    if whole is not None:
        from runs.io import write_npz

        arrays = {"facts": np.array(json.dumps(facts))}
        for p, (c, s, b, inv) in layers.items():
            arrays.update({f"{p}|codes": c, f"{p}|scales": s, f"{p}|biases": b})
            if inv is not None:
                arrays[f"{p}|input_scale"] = inv
        arrays.update({f"norm|{k}": v for k, v in norms.items()})
        write_npz(whole, arrays)
    facts["cached"] = bool(rows) and n_reused == len(rows)
    return layers, norms, facts


def round_trip(reference, method, fit, cache_dir=None, log=None):
    """``(path, bits, group_size) -> (o, n) float32 array``: one encoder Linear of the reference
    quantized alone by ``method`` (``awq`` or ``gptq``, learned on ``fit`` exactly as a build
    learns it, through the per-layer cache) and dequantized (times AWQ's input scale): the
    weight the simulated build uses for that Linear. Raises ValueError on bad input (as
    :func:`build`)."""
    from variants.families.quant.config import QuantConfig

    if method not in ("awq", "gptq"):
        raise ValueError(f"round_trip: {method!r} is not learned per Linear; use awq or gptq")
    check_inputs(QuantConfig(method=method), fit)
    stats = activations.cached_collect(reference, fit, cache_dir=cache_dir, log=log)

    def weight(path, bits, group_size):
        cfg = QuantConfig(bits=bits, group_size=group_size, method=method)
        layers, _ = _learn(reference, cfg, [path], {path: (bits, group_size)}, stats, cache_dir,
                           progress=False)
        codes, scales, biases, inv = layers[path]
        deq = affine_codes.dequantize(codes, scales, biases, group_size)
        return (deq if inv is None else deq * inv).astype(np.float32)

    return weight


def _dense(module):
    """A dense copy of a packed module: each quantized layer's ``mx.dequantize`` (times the
    input scale for an :class:`InputScaledLinear`) as an ``nn.Linear`` / ``nn.Embedding``."""
    sim = copy.deepcopy(module)
    for path, m in list(sim.named_modules()):
        inv = None
        if isinstance(m, InputScaledLinear):
            inv, m = m.input_scale, m.linear
        if not isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            continue
        w = mx.dequantize(m["weight"], m["scales"].astype(mx.float32),
                          m["biases"].astype(mx.float32), group_size=m.group_size, bits=m.bits)
        if inv is not None:
            w = w * inv
        if isinstance(m, nn.QuantizedEmbedding):
            new = nn.Embedding(*w.shape)
        else:
            new = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
            if "bias" in m:
                new.bias = m["bias"]
        new.weight = w
        activations.set_module(sim, path, new)
    mx.eval(sim.parameters())
    return sim


def build(reference, cfg, mode="simulated", fit=None, cache_dir=None, log=None):
    """The quantized reference of a learned ``cfg.method`` (``awq``, ``gptq``, ``dwq``).

    Returns ``(variant, info)``: info is :func:`variants.families.quant.build.quantize_module`'s
    (sizes: the input scales of AWQ counted in ``model_bytes``) plus ``method``,
    ``method_settings``, ``calibration_split`` ("fit"), ``calibration_rows``, ``layers``
    (per-layer relative output error, RTN and method), ``build_s`` (learning seconds; the
    first build's when read from the cache) and the method's own facts. Raises ValueError on
    bad input (no fit rows, a singular GPTQ Hessian, a forward DWQ cannot differentiate)."""
    layers, norms, facts = learned_layers(reference, cfg, fit, cache_dir, log)
    native, info = quantize.quantize_module(reference.module, cfg, "native",
                                            row_use=row_use_of(reference, fit, cfg))
    if norms:  # DWQ's trained LayerNorms (same shapes and bytes as the reference's)
        native.update(tree_unflatten([(k, mx.array(v)) for k, v in norms.items()]))
    extra_bytes = 0
    for path, (codes, scales, biases, inv) in layers.items():
        m = dict(native.named_modules())[path]
        m.weight = mx.array(affine_codes.pack(codes, m.bits))
        dt = m.scales.dtype  # --scale-dtype: the learned fp32 scales stored as the build's
        m.scales, m.biases = mx.array(scales).astype(dt), mx.array(biases).astype(dt)
        if inv is not None:
            activations.set_module(native, path, InputScaledLinear(m, inv))
            extra_bytes += inv.nbytes
    info["model_bytes"] += extra_bytes
    info.update(method=cfg.method, method_settings=SETTINGS[cfg.method],
                calibration_split="fit", calibration_rows=facts["fit_rows"],
                learned_layers=len(layers), input_scaled_layers=sum(
                    v[3] is not None for v in layers.values()),
                trained_norms=len(norms),
                **{k: v for k, v in facts.items() if k not in ("paths", "fit_rows", "norms")})
    module = native if mode == "native" else _dense(native)
    mx.eval(module.parameters())
    return reference.replace_module(module), info

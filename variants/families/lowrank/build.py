"""Low-rank factorisation of the encoder's Linear layers: plain, whitened (SVD-LLM) or scaled (ASVD).

Each chosen layer y = x Wᵀ + b, W of shape (m, n), becomes y = (x W_vᵀ) W_uᵀ + b with W_u (m, k)
and W_v (k, n): two dense matmuls, k(m + n) weights instead of mn. A factorisation pays only below
the break-even rank mn / (m + n) (192 for 384×384, 307 for 1536×384); a layer whose chosen rank
reaches it stays dense, and the per-layer table says so.

Methods (W_k = W_u W_v; G = E[x xᵀ] over real calibration tokens, see :mod:`variants.arch.activations`):

- ``plain``: truncated SVD of W (Eckart-Young): minimises ‖W − W_k‖_F.
- ``whitened`` (SVD-LLM, Wang et al. 2024, §3.1): S = Cholesky(G + λI) (float64; λ = 0 unless the
  factorisation fails, then it grows ×10 from ``LAMBDA_START`` · mean diag(G)); SVD of W S = U Σ Vᵀ;
  W_u = U_k Σ_k^{1/2}, W_v = Σ_k^{1/2} V_kᵀ S⁻¹. Then ‖(W − W_k) S‖_F = √(Σ_{j>k} σ_j²): the
  activation-weighted error is the SVD tail, and it is the smallest any rank-k matrix achieves.
- ``scaled`` (ASVD, Yuan et al. 2023, §3.2): D = diag((E|x|)^α); SVD of W D; W_v = Σ_k^{1/2} V_kᵀ D⁻¹.

Low rank composes with quantization (``bits``): the factors (and every other Linear the quant
family would quantize) are then quantized by :func:`variants.families.quant.build.quantize_module`;
ranks are rounded down to a multiple of the group size so the second factor quantizes too.
"""

import copy
import dataclasses
import math
from collections import OrderedDict

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from threadpoolctl import threadpool_limits

from variants.arch import activations
from variants.arch.lowrank import LowRankLinear
from variants.runtime import qlinear
from variants.layer_maps import ratio_map
from variants.families.lowrank.factorise import (ABS_FLOOR, LAMBDA_MAX, LAMBDA_START, Decomposition,
                                                 _weighted_norm, break_even, choose_rank,
                                                 cost_model, decompose, whitening)
from variants.families.quant.build import MODES, QuantConfig, quantize_module

# ---------------------------------------------------------------------------------------------
# the module transform (the factorised layer, LowRankLinear, is variants.arch.lowrank's)
# ---------------------------------------------------------------------------------------------

def factorize_module(module, cfg, stats=None, *, paths=None):
    """A copy of ``module`` with its encoder Linears factorised per ``cfg`` (input unmodified).

    Parameters
    ----------
    module : mlx.nn.Module
    cfg : LowRankConfig
    stats : dict {site: LinearStats}, optional
        From :func:`variants.arch.activations.collect`; required for ``whitened`` and ``scaled``;
        with ``plain`` it only adds the activation-weighted errors to the table.
    paths : list of str, optional
        Layers to factorise; default :func:`variants.arch.activations.target_linears`.

    Returns
    -------
    new_module : mlx.nn.Module
    layers : list of dict
        Per layer: ``path``, ``shape`` (m, n), ``break_even``, ``rank`` (None if dense), ``dense``
        (bool), ``reason``, ``retained_energy`` (of the method's decomposed matrix),
        ``predicted_rel_error`` (√(1 − retained): the method's own objective),
        ``weighted_rel_error`` (‖(W − W_k)‖ over calibration activations / ‖W‖ over them),
        ``plain_rel_error`` (‖W − W_k‖_F / ‖W‖_F), ``lambda`` (absolute λ) and ``lambda_rel``,
        ``params_dense``, ``params`` (weights + bias as built).
    """
    paths = activations.target_linears(module) if paths is None else list(paths)
    if not paths:
        raise ValueError("no Linear layer to factorise")
    new = copy.deepcopy(module)
    # one BLAS thread for the float64 NumPy work: NumPy's and MLX's OpenBLAS pools spinning side
    # by side on 2 cores made it ~10x slower (measured 25 s vs 2.8 s; see bench/blas_gemm.py)
    ratios = ratio_map.resolve(cfg.ratio_map, paths, cfg.ratio) if cfg.ratio_map else None
    with threadpool_limits(1, user_api="blas"):
        layers = _factorize_into(new, paths, cfg, stats, ratios)
    mx.eval(new.parameters())
    return new, layers


def _factorize_into(new, paths, cfg, stats, ratios=None):
    mods = dict(new.named_modules())
    base = cfg
    layers = []
    for path in paths:
        lin = mods[path]
        w = np.array(lin.weight, np.float64)
        m, n = w.shape
        bias = np.array(lin.bias) if "bias" in lin else None
        site_stats = None if stats is None else stats.get(activations.input_site(path))
        if cfg.method != "plain" and site_stats is None:
            raise ValueError(f"no activation statistics for {path}: no calibration data")
        dec = decompose(w, cfg.method, site_stats, alpha=cfg.alpha, site=path)
        cfg = dataclasses.replace(base, ratio=ratios[path], ratio_map="") if ratios else base
        k = choose_rank(dec, (m, n), cfg)
        be = break_even(m, n)
        row = {"path": path, "shape": [m, n], "break_even": be, "method": cfg.method,
               "params_dense": m * n + (m if bias is not None else 0),
               "ratio": cfg.ratio if cfg.rule == "params" else None,
               "lambda": dec.lam, "lambda_rel": (dec.lam / float(np.mean(np.diag(
                   site_stats.second_moment)))) if dec.lam else 0.0}
        if k >= be or (ratios and ratios[path] >= 1):  # a map's 1: dense by request
            row.update(rank=None, wanted_rank=k, dense=True,
                       reason=(f"rank {k} >= break-even {be:.1f}: kept dense" if k >= be else
                               "--ratio-map gives it 1: kept dense"),
                       retained_energy=1.0, predicted_rel_error=0.0, weighted_rel_error=0.0,
                       plain_rel_error=0.0, params=row["params_dense"])
            layers.append(row)
            continue
        w_u, w_v = dec.factors(k)
        err = w - w_u @ w_v
        row.update(rank=k, dense=False, reason="",
                   retained_energy=dec.retained(k),
                   predicted_rel_error=math.sqrt(max(1.0 - dec.retained(k), 0.0)),
                   plain_rel_error=float(np.linalg.norm(err) / np.linalg.norm(w)),
                   params=k * (m + n) + (m if bias is not None else 0))
        if site_stats is not None:
            g = site_stats.second_moment
            row["weighted_rel_error"] = _weighted_norm(err, g) / _weighted_norm(w, g)
        else:
            row["weighted_rel_error"] = None
        activations.set_module(new, path, LowRankLinear(w_u, w_v, bias))
        layers.append(row)
    return layers


def check_model(module, cfgs):
    """Reject, before a sweep writes anything, a fixed rank no encoder Linear can hold.

    ``module``: the encoder (its Linears under ``layers.``) or the decision module (under
    ``encoder.layers.``: :func:`variants.arch.activations.target_linears`; a classifier head is not
    factorised, so its shape sets no limit).

    Raises
    ------
    ValueError
        If a config's ``rank`` exceeds min(m, n) of the smallest factorised weight.
    """
    qlinear.refuse_packed(module, "lowrank")
    prefix = "layers." if hasattr(module, "layers") else "encoder.layers."
    mods = dict(module.named_modules())
    paths = activations.target_linears(module, prefix=prefix)
    shapes = [mods[p].weight.shape for p in paths]
    for cfg in cfgs:  # a --ratio-map pattern that matches no layer: now, not mid-sweep
        if cfg.ratio_map:
            ratio_map.resolve(cfg.ratio_map, paths, cfg.ratio)
    if not shapes:
        return
    limit = min(min(s) for s in shapes)
    for cfg in cfgs:
        if cfg.rule == "rank" and cfg.rank > limit:
            raise ValueError(f"rank={cfg.rank} is larger than min(m, n) = {limit} of the model's "
                             f"smallest Linear; pass --ranks at most {limit}")


# in-process memo: the sweep builds each variant twice (quality, then speed without calibration)
_STATS = OrderedDict()  # (id(module), reference.cache_key(calibration)) -> (module, stats)
_FACTORED = OrderedDict()  # (id(module), cfg) -> (module, factored module, layers, info extras)
_MEMO_SIZE = 2


def _memo_get(memo, key, module):
    hit = memo.get(key)
    if hit is not None and hit[0] is module:
        memo.move_to_end(key)
        return hit[1:]
    return None


def _memo_put(memo, key, value):
    memo[key] = value
    while len(memo) > _MEMO_SIZE:
        memo.popitem(last=False)


def _stats_for(reference, calibration, cache_dir):
    key = (id(reference.module), reference.cache_key(calibration.fingerprint()))
    hit = _memo_get(_STATS, key, reference.module)
    if hit is not None:
        return hit[0]
    stats = activations.cached_collect(reference, calibration, cache_dir=cache_dir)
    _memo_put(_STATS, key, (reference.module, stats))
    return stats


def build(reference, cfg, mode="simulated", calibration=None, *, cache_dir=None):
    """Registry entry: the reference DecisionModel with its encoder Linears factorised.

    Parameters
    ----------
    reference : DecisionModel
    cfg : LowRankConfig
    mode : {'native', 'simulated'}, default='simulated'
        Meaningful only with ``cfg.bits`` (passed to ``quantize_module``); unquantized factors
        are the same dense fp32 layers in both modes.
    calibration : TaskSet
        Calibration split for the activation statistics. May be None only when this process
        already built ``cfg`` for ``reference`` (the sweep's speed build reuses it) or for
        ``plain`` (which needs no statistics; weighted errors are then not reported).
    cache_dir : path, optional
        Activation statistics are cached in ``cache_dir/activations/``.

    Returns
    -------
    variant : DecisionModel
    info : dict
        ``layers`` (per-layer table, see :func:`factorize_module`), ``totals``, ``cost``
        (:func:`cost_model` at the calibration texts' mean token count), ``ideal_speedup``,
        ``model_bytes``, ``params_dense``/``params_lowrank`` of the factorised layers,
        ``dense_layers`` (kept dense, with reason) and, with bits, the quantizer's info.

    Raises
    ------
    ValueError
        Unknown mode, no calibration data, bad statistics, rank above min(m, n).
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; choose one of {MODES}")
    module = reference.module
    key = (id(module), cfg)
    hit = _memo_get(_FACTORED, key, module)
    if hit is not None:
        factored, layers, extra = hit
    else:
        stats = None
        if calibration is not None:
            stats = _stats_for(reference, calibration, cache_dir)
        elif cfg.method != "plain":
            raise ValueError(f"no calibration data: method {cfg.method!r} needs the calibration "
                             "TaskSet (build(reference, cfg, calibration=...))")
        factored, layers = factorize_module(module, cfg, stats)
        extra = {"calibration_tokens": None}
        if stats is not None:
            site = next(iter(stats.values()))
            extra["calibration_tokens"] = int(site.count)
            extra["calibration_texts"] = len(calibration)
        _memo_put(_FACTORED, key, (module, factored, layers, extra))
    info = _info(module, factored, layers, extra, getattr(getattr(module, "encoder", None),
                                                          "args", None))
    info["mode"] = mode if cfg.bits is not None else "dense factors (mode not applicable)"
    # the report's "bits/w" column: stored bits per original weight of the factorised layers
    info["bits_per_weight"] = 32.0 * info["param_ratio"]
    info["bits_per_weight_note"] = "fp32 bits per original weight of the factorised layers"
    variant_module = factored
    if cfg.bits is not None:
        variant_module, qinfo = quantize_module(factored, QuantConfig(cfg.bits, cfg.group_size),
                                                mode)
        info["quant"] = qinfo
        info["bits_per_weight"] = qinfo["bits_per_weight"] * info["param_ratio"]
        info["bits_per_weight_note"] = ("quantized bits per stored weight × stored / original "
                                        "weights of the factorised layers")
        info["model_bytes"] = qinfo["model_bytes"]
    return reference.replace_module(variant_module), info


def _info(module, factored, layers, extra, args):
    p_dense = sum(r["params_dense"] for r in layers)
    p_low = sum(r["params"] for r in layers)
    seq_len = 32
    if extra.get("calibration_tokens") and extra.get("calibration_texts"):
        seq_len = max(1, round(extra["calibration_tokens"] / extra["calibration_texts"]))
    cost = cost_model(layers, seq_len=seq_len,
                      hidden_size=getattr(args, "hidden_size", None),
                      n_layers=getattr(args, "num_hidden_layers", None))
    return {
        "layers": layers,
        "dense_layers": [(r["path"], r["reason"]) for r in layers if r["dense"]],
        "factorised_layers": sum(not r["dense"] for r in layers),
        "params_dense": int(p_dense),
        "params_lowrank": int(p_low),
        "param_ratio": p_low / p_dense,
        "total_params": int(sum(v.size for _, v in tree_flatten(module.parameters()))),
        "model_bytes": int(sum(v.nbytes for _, v in tree_flatten(factored.parameters()))),
        "reference_bytes": int(sum(v.nbytes for _, v in tree_flatten(module.parameters()))),
        "cost": cost,
        "ideal_speedup": cost["ideal_speedup"],
        "ideal_speedup_note": ("encoder Linear GEMMs + attention products at the calibration "
                               f"texts' mean length ({seq_len} tokens); embeddings, LayerNorm, "
                               "GELU, softmax, head excluded"),
        "max_lambda_rel": max((r["lambda_rel"] for r in layers), default=0.0),
        **extra,
    }

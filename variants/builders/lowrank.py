"""Low-rank factorisation of the encoder's Linear layers: plain, whitened (SVD-LLM) or scaled (ASVD).

Each chosen layer y = x Wᵀ + b, W of shape (m, n), becomes y = (x W_vᵀ) W_uᵀ + b with W_u (m, k)
and W_v (k, n): two dense matmuls, k(m + n) weights instead of mn. A factorisation pays only below
the break-even rank mn / (m + n) (192 for 384×384, 307 for 1536×384); a layer whose chosen rank
reaches it stays dense, and the per-layer table says so.

Methods (W_k = W_u W_v; G = E[x xᵀ] over real calibration tokens, see :mod:`variants.activations`):

- ``plain``: truncated SVD of W (Eckart-Young): minimises ‖W − W_k‖_F.
- ``whitened`` (SVD-LLM, Wang et al. 2024, §3.1): S = Cholesky(G + λI) (float64; λ = 0 unless the
  factorisation fails, then it grows ×10 from ``LAMBDA_START`` · mean diag(G)); SVD of W S = U Σ Vᵀ;
  W_u = U_k Σ_k^{1/2}, W_v = Σ_k^{1/2} V_kᵀ S⁻¹. Then ‖(W − W_k) S‖_F = √(Σ_{j>k} σ_j²): the
  activation-weighted error is the SVD tail, and it is the smallest any rank-k matrix achieves.
- ``scaled`` (ASVD, Yuan et al. 2023, §3.2): D = diag((E|x|)^α); SVD of W D; W_v = Σ_k^{1/2} V_kᵀ D⁻¹.

Low rank composes with quantization (``bits``): the factors (and every other Linear the quant
family would quantize) are then quantized by :func:`variants.builders.quantize.quantize_module`;
ranks are rounded down to a multiple of the group size so the second factor quantizes too.
"""

import copy
import math
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from scipy.linalg import solve_triangular
from threadpoolctl import threadpool_limits

from variants import activations
from variants.builders import name_number, realised_speed_lines, unique_by_name  # noqa: F401
from variants.builders.quantize import (BITS, GROUP_SIZES, MODES, QuantConfig, check_bits,
                                        quantize_module)

METHODS = ("plain", "whitened", "scaled")
RULES = ("params", "energy", "rank")
DEFAULT_RATIOS = (0.9, 0.7, 0.5, 0.3, 0.1)
DEFAULT_METHODS = ("whitened", "plain")
LAMBDA_START = 1e-8  # first λ / mean diag(G) tried when Cholesky(G) fails
LAMBDA_MAX = 1e-1  # beyond this the statistics matrix is declared singular
ABS_FLOOR = 1e-6  # ASVD: channels with mean |x| below this (relative to the max) are clipped


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
        check_bits(self.bits, self.group_size, "")

    @property
    def name(self):
        method = (f"{self.method}-a{name_number(self.alpha, '.2f')}" if self.method == "scaled"
                  else self.method)
        rule = {"params": "p" + name_number(self.ratio, ".2f"),
                "energy": "e" + name_number(self.energy, ".3f"), "rank": f"r{self.rank}"}[self.rule]
        quant = ""
        if self.bits is not None:
            quant = f"-q{self.bits}" + ("" if self.group_size == 64 else f"g{self.group_size}")
        return f"lr-{method}-{rule}{quant}"


# ---------------------------------------------------------------------------------------------
# the factorised layer and the factorisation
# ---------------------------------------------------------------------------------------------

class LowRankLinear(nn.Module):
    """y = (x W_vᵀ) W_uᵀ + b as two nn.Linear layers ``down`` (k, n) and ``up`` (m, k).

    Parameters
    ----------
    w_u : array of shape (m, k)
    w_v : array of shape (k, n)
    bias : array of shape (m,), optional
    """

    def __init__(self, w_u, w_v, bias=None):
        super().__init__()
        m, k = w_u.shape
        k2, n = w_v.shape
        if k != k2:
            raise ValueError(f"factor shapes {w_u.shape} and {w_v.shape} do not chain")
        self.down = nn.Linear(n, k, bias=False)
        self.up = nn.Linear(k, m, bias=bias is not None)
        self.down.weight = mx.array(np.asarray(w_v, np.float32))
        self.up.weight = mx.array(np.asarray(w_u, np.float32))
        if bias is not None:
            self.up.bias = mx.array(np.asarray(bias, np.float32))

    def __call__(self, x):
        return self.up(self.down(x))


def whitening(second_moment, *, site="layer"):
    """Lower Cholesky factor S of G + λI (G = E[x xᵀ]) in float64, with the λ that was needed.

    Parameters
    ----------
    second_moment : ndarray of shape (n, n)
    site : str
        Named in errors.

    Returns
    -------
    S : ndarray of shape (n, n), float64, lower triangular, S Sᵀ = G + λI
    lam : float
        λ actually added (0.0 when G itself factorised).

    Raises
    ------
    ValueError
        Non-finite or all-zero G, or no λ ≤ LAMBDA_MAX · mean diag(G) makes it positive definite.
    """
    g = np.asarray(second_moment, np.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise ValueError(f"statistics matrix at {site} must be square, got shape {g.shape}")
    if not np.isfinite(g).all():
        raise ValueError(f"statistics matrix at {site} has non-finite entries; "
                         "recompute the activation statistics")
    scale = float(np.mean(np.diag(g)))
    if not scale > 0:
        raise ValueError(f"statistics matrix at {site} is singular (zero diagonal): "
                         "no calibration token reached this layer")
    g = (g + g.T) / 2
    lam = 0.0
    while True:
        try:
            return np.linalg.cholesky(g + lam * np.eye(len(g))), lam
        except np.linalg.LinAlgError:
            lam = LAMBDA_START * scale if lam == 0 else lam * 10
            if lam > LAMBDA_MAX * scale:
                raise ValueError(f"statistics matrix at {site} is singular: Cholesky failed up to "
                                 f"λ = {LAMBDA_MAX:g}·mean diag; use more calibration data") from None


@dataclass
class Decomposition:
    """SVD of W T for a right transform T (I, S or D): W T = U diag(sv) Vt."""

    u: np.ndarray
    sv: np.ndarray
    vt: np.ndarray
    method: str
    right: np.ndarray | None = None  # T (None: identity)
    lam: float = 0.0

    def factors(self, k):
        """(W_u (m, k), W_v (k, n)) float64 with W_u W_v = U_k Σ_k V_kᵀ T⁻¹."""
        if not 1 <= k <= len(self.sv):
            raise ValueError(f"rank {k} is outside [1, {len(self.sv)}] = [1, min(m, n)]")
        root = np.sqrt(self.sv[:k])
        w_u = self.u[:, :k] * root
        z = root[:, None] * self.vt[:k]  # (k, n): Σ_k^{1/2} V_kᵀ
        if self.right is None:
            w_v = z
        elif self.right.ndim == 1:  # diagonal D
            w_v = z / self.right
        else:  # lower-triangular S: W_v = Z S⁻¹  <=>  Sᵀ W_vᵀ = Zᵀ
            w_v = solve_triangular(self.right, z.T, lower=True, trans="T").T
        return w_u, w_v

    def retained(self, k):
        """Share of Σ σ_j² kept by the first k triplets."""
        e = self.sv ** 2
        return float(e[:k].sum() / e.sum()) if e.sum() > 0 else 1.0


def decompose(weight, method, stats=None, *, alpha=0.5, site="layer"):
    """Decompose ``weight`` (m, n) for ``method`` in float64.

    Parameters
    ----------
    weight : array of shape (m, n)
    method : {'plain', 'whitened', 'scaled'}
    stats : variants.activations.LinearStats, optional
        Required by ``whitened`` and ``scaled``.
    alpha : float, default=0.5
        ASVD exponent of the mean |x| scaling.

    Returns
    -------
    Decomposition

    Raises
    ------
    ValueError
        Unknown method, missing statistics, bad statistics (see :func:`whitening`).

    References
    ----------
    Wang et al. 2024, "SVD-LLM: Truncation-aware Singular Value Decomposition for LLM
    Compression", §3.1; Yuan et al. 2023, "ASVD: Activation-aware Singular Value Decomposition
    for Compressing Large Language Models", §3.2.
    """
    w = np.asarray(weight, np.float64)
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not known; choose one of {METHODS}")
    if not np.isfinite(w).all():
        raise ValueError(f"weight at {site} has non-finite entries")
    if method != "plain" and stats is None:
        raise ValueError(f"method {method!r} needs activation statistics: no calibration data")
    right, lam = None, 0.0
    if method == "whitened":
        right, lam = whitening(stats.second_moment, site=site)
        a = w @ right
    elif method == "scaled":
        mean_abs = np.asarray(stats.mean_abs, np.float64)
        if not np.isfinite(mean_abs).all():
            raise ValueError(f"mean |x| at {site} has non-finite entries")
        top = mean_abs.max()
        if not top > 0:
            raise ValueError(f"mean |x| at {site} is all zero: no calibration token reached it")
        right = np.maximum(mean_abs, ABS_FLOOR * top) ** alpha
        a = w * right
    else:
        a = w
    u, sv, vt = np.linalg.svd(a, full_matrices=False)
    return Decomposition(u, sv, vt, method, right, lam)


def break_even(m, n):
    """Rank mn/(m+n) at which k(m+n) factor weights equal the mn dense ones."""
    return m * n / (m + n)


def choose_rank(dec, shape, cfg):
    """Rank of one layer under ``cfg``'s rule (before the break-even test).

    Raises ValueError when ``cfg.rank`` exceeds min(m, n)."""
    m, n = shape
    if cfg.rule == "params":
        k = int(math.floor(cfg.ratio * break_even(m, n) + 1e-9))
    elif cfg.rule == "energy":
        cum = np.cumsum(dec.sv ** 2) / max(float(np.sum(dec.sv ** 2)), 1e-300)
        k = int(np.searchsorted(cum, cfg.energy - 1e-12) + 1)
    elif cfg.rule == "rank":
        if cfg.rank > min(m, n):
            raise ValueError(f"rank={cfg.rank} is larger than min(m, n) = {min(m, n)} of a "
                             f"{m}x{n} layer; choose --ranks <= {min(m, n)}")
        k = int(cfg.rank)
    else:
        raise ValueError(f"rank rule {cfg.rule!r} is not known; choose one of {RULES}")
    if cfg.bits is not None:  # the up factor's input (k) must be a multiple of the group size
        k = max(cfg.group_size, k // cfg.group_size * cfg.group_size)
    return max(1, min(k, min(m, n)))


def _weighted_norm(e, g):
    """√tr(E G Eᵀ): the Frobenius norm of E X over calibration tokens (G = E[x xᵀ])."""
    return math.sqrt(max(float(((e @ g) * e).sum()), 0.0))


# ---------------------------------------------------------------------------------------------
# the module transform
# ---------------------------------------------------------------------------------------------

def factorize_module(module, cfg, stats=None, *, paths=None):
    """A copy of ``module`` with its encoder Linears factorised per ``cfg`` (input unmodified).

    Parameters
    ----------
    module : mlx.nn.Module
    cfg : LowRankConfig
    stats : dict {site: LinearStats}, optional
        From :func:`variants.activations.collect`; required for ``whitened`` and ``scaled``;
        with ``plain`` it only adds the activation-weighted errors to the table.
    paths : list of str, optional
        Layers to factorise; default :func:`variants.activations.target_linears`.

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
    with threadpool_limits(1, user_api="blas"):
        layers = _factorize_into(new, paths, cfg, stats)
    mx.eval(new.parameters())
    return new, layers


def _factorize_into(new, paths, cfg, stats):
    mods = dict(new.named_modules())
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
        k = choose_rank(dec, (m, n), cfg)
        be = break_even(m, n)
        row = {"path": path, "shape": [m, n], "break_even": be, "method": cfg.method,
               "params_dense": m * n + (m if bias is not None else 0),
               "lambda": dec.lam, "lambda_rel": (dec.lam / float(np.mean(np.diag(
                   site_stats.second_moment)))) if dec.lam else 0.0}
        if k >= be:
            row.update(rank=None, wanted_rank=k, dense=True,
                       reason=f"rank {k} >= break-even {be:.1f}: kept dense",
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


def cost_model(layers, *, seq_len, hidden_size=None, n_layers=None):
    """Encoder FLOPs per example at ``seq_len`` tokens, dense vs factorised.

    Counts 2·L·(weights) for every listed Linear (dense mn or factorised k(m+n)) plus, when
    ``hidden_size`` and ``n_layers`` are given, the attention products 4·L²·D per layer
    (QKᵀ and AV). Embeddings, LayerNorm, GELU, softmax and the head are excluded.

    Returns
    -------
    dict
        ``flops_dense``, ``flops_lowrank``, ``linear_flop_ratio`` (factorised / dense Linear FLOPs),
        ``ideal_speedup`` (dense / factorised, attention products included when given).
    """
    dense = sum(2 * seq_len * r["shape"][0] * r["shape"][1] for r in layers)
    low = sum(2 * seq_len * (r["shape"][0] * r["shape"][1] if r["dense"]
                             else r["rank"] * (r["shape"][0] + r["shape"][1])) for r in layers)
    attn = 4 * seq_len ** 2 * hidden_size * n_layers if hidden_size and n_layers else 0
    return {"seq_len": int(seq_len), "flops_dense": int(dense + attn),
            "flops_lowrank": int(low + attn), "linear_flop_ratio": low / dense,
            "ideal_speedup": (dense + attn) / (low + attn)}


# ---------------------------------------------------------------------------------------------
# the family's registry interface
# ---------------------------------------------------------------------------------------------

PARAMS = ("methods", "ratios", "rank_rule", "energies", "ranks", "alpha", "lowrank_bits",
          "lowrank_group_size")


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


def ladder(*, methods=DEFAULT_METHODS, ratios=DEFAULT_RATIOS, rank_rule="params",
           energies=(0.9, 0.99), ranks=(64,), alpha=0.5, lowrank_bits=None,
           lowrank_group_size=64):
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
                                         **{field: v}))
    return unique_by_name(out, {"method": "--methods", "ratio": "--ratios",
                                "energy": "--energies", "rank": "--ranks", "alpha": "--alpha",
                                "bits": "--lowrank-bits", "group_size": "--lowrank-group-size"})


def check_model(module, cfgs):
    """Reject, before a sweep writes anything, a fixed rank no encoder Linear can hold.

    Raises
    ------
    ValueError
        If a config's ``rank`` exceeds min(m, n) of the smallest factorised weight.
    """
    shapes = [m.weight.shape for _, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not shapes:
        return
    limit = min(min(s) for s in shapes)
    for cfg in cfgs:
        if cfg.rule == "rank" and cfg.rank > limit:
            raise ValueError(f"rank={cfg.rank} is larger than min(m, n) = {limit} of the model's "
                             f"smallest Linear; pass --ranks at most {limit}")


def run_name(*, rank_rule="params", lowrank_bits=None, **_):
    """Default run-folder suffix for these parameters."""
    return f"{rank_rule}" + ("" if not lowrank_bits else "-q" + "-".join(map(str, lowrank_bits)))


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

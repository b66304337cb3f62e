"""Low-rank factorisation maths (NumPy/SciPy, float64): whitening, the decomposition of one
weight per method, rank choice and the FLOP cost model. See :mod:`variants.families.lowrank.build` for
the methods (SVD-LLM, Wang et al. 2024, §3.1; ASVD, Yuan et al. 2023, §3.2).
"""

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_triangular

from variants.families.lowrank.config import METHODS, RULES

LAMBDA_START = 1e-8  # first λ / mean diag(G) tried when Cholesky(G) fails
LAMBDA_MAX = 1e-1  # beyond this the statistics matrix is declared singular
ABS_FLOOR = 1e-6  # ASVD: channels with mean |x| below this (relative to the max) are clipped


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
    stats : variants.arch.activations.LinearStats, optional
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

"""GPTQ: group-wise quantization with error compensation through the inverse Hessian.

Frantar, Ashkboos, Hoefler & Alistarh, "GPTQ: Accurate Post-Training Quantization for
Generative Pre-trained Transformers" (ICLR 2023), Algorithm 1, as in the authors' ``gptq.py``:
H = 2 XᵀX over the layer's input tokens (here the float64 Gram matrix Σ x xᵀ of the fit split,
:mod:`variants.arch.activations`; the factor and the token count cancel, the damping being relative),
damped by ``damping`` · mean diag(H); the upper Cholesky factor U of H⁻¹; columns quantized left
to right, each column's error (w - q) / U_jj pushed onto the columns to its right through row j
of U, lazily per block of ``block_size`` columns (one GEMM per block for the columns beyond it).
Each group's scale and bias are taken, by MLX's affine rule (:mod:`variants.families.quant.affine_codes`),
from the group's weights as updated when its first column is reached. Inputs that never
activate (diag(H) = 0) get H_jj = 1 and zero weights, as in the reference code.

``act_order``: the columns are quantized in order of descending diag(H) (the most active inputs
first, while the most error can still be compensated), with the reference code's "static
groups": every group's scale and bias are taken from the original weights before any update, so
the groups stay the packed format's contiguous input ranges and the codes are written back in
input order.

Pure NumPy/SciPy in float64 (MLX on the CPU has no Cholesky in float64); no MLX import.
"""

import numpy as np
import scipy.linalg

from variants.families.quant import affine_codes

DAMPING = 0.01
BLOCK_SIZE = 128


class SingularHessianError(ValueError):
    """H stays singular (not positive definite) after damping."""


def inverse_cholesky(H, damping=DAMPING, where="layer"):
    """Upper Cholesky factor U (n, n) float64 of (H + λI)⁻¹, λ = ``damping`` · mean diag(H)
    (dead inputs' diagonal set to 1 first). Raises :class:`SingularHessianError` naming
    ``where`` and the damping when H + λI (or its inverse) is not positive definite or not
    finite."""
    H = np.array(H, np.float64, copy=True)
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    lam = damping * float(np.mean(np.diag(H)))
    H[np.diag_indices_from(H)] += lam
    try:
        if not np.isfinite(H).all():
            raise np.linalg.LinAlgError("non-finite entries")
        c = scipy.linalg.cho_factor(H, lower=False)
        Hinv = scipy.linalg.cho_solve(c, np.eye(len(H)))
        U = scipy.linalg.cholesky(Hinv, lower=False)
    except (np.linalg.LinAlgError, ValueError) as e:
        raise SingularHessianError(
            f"GPTQ at {where}: the Hessian 2XᵀX stays singular after damping {damping:g}·mean "
            f"diag ({e}); use more fit texts (--n-fit) or another --quant-method") from None
    return U, dead


def quantize(W, H, bits, group_size, *, damping=DAMPING, block_size=BLOCK_SIZE, act_order=False,
             where="layer"):
    """GPTQ of one Linear weight.

    Parameters
    ----------
    W : (o, n) float array — the weight (out × in, MLX's Linear layout)
    H : (n, n) float64 — Σ x xᵀ over the input tokens (any positive multiple of XᵀX)
    bits, group_size : int — MLX affine format (n a multiple of group_size)
    damping : float — relative damping λ / mean diag(H)
    block_size : int — columns per lazy batch update (rounded up to whole groups)
    act_order : bool — columns by descending diag(H), group parameters from the original weights
    where : str — the layer's name in errors

    Returns
    -------
    codes : (o, n) uint8, scales, biases : (o, n / group_size) float32 — the packed format's
        tensors (``affine_codes.pack(codes, bits)`` is the packed weight)

    Raises
    ------
    SingularHessianError
        H + λI is not positive definite.
    """
    W = np.array(W, np.float64, copy=True)
    o, n = W.shape
    affine_codes.grouped(W, group_size)  # ValueError when n is not a multiple
    H = np.asarray(H, np.float64)
    dead = np.diag(H) == 0
    W[:, dead] = 0.0
    n_bins = 2 ** bits - 1
    codes = np.zeros((o, n), np.uint8)
    scales = np.zeros((o, n // group_size), np.float32)
    biases = np.zeros((o, n // group_size), np.float32)
    perm = np.arange(n)
    if act_order:
        perm = np.argsort(-np.where(dead, 1.0, np.diag(H)), kind="stable")
        G = affine_codes.grouped(W, group_size)  # static groups: the original weights' ranges
        scales[:], biases[:] = affine_codes.group_params(G.min(axis=-1), G.max(axis=-1), bits)
        W, H = W[:, perm], H[np.ix_(perm, perm)]
    U, _ = inverse_cholesky(H, damping, where)
    block_size = -(-block_size // group_size) * group_size  # whole groups per block
    for i1 in range(0, n, block_size):
        i2 = min(i1 + block_size, n)
        W1 = W[:, i1:i2].copy()
        Err1 = np.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = perm[i1 + i]  # the input this column is
            if col % group_size == 0 and not act_order:
                g = col // group_size
                cur = W1[:, i:i + group_size]  # the group's weights as updated so far
                scales[:, g], biases[:, g] = affine_codes.group_params(
                    cur.min(axis=1), cur.max(axis=1), bits)
            g = col // group_size
            s, b = scales[:, g], biases[:, g]
            w = W1[:, i]
            q = np.clip(np.rint((w.astype(np.float32) - b) / s), 0, n_bins)
            codes[:, col] = q.astype(np.uint8)
            deq = (s * q.astype(np.float32) + b).astype(np.float64)
            err = (w - deq) / U1[i, i]
            W1[:, i:] -= np.outer(err, U1[i, i:])
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]
    return codes, scales, biases


def output_error(W, W_hat, G):
    """tr((W - Ŵ) G (W - Ŵ)ᵀ): the summed squared output error over the tokens whose Gram
    matrix is ``G`` (n, n) (float64; :mod:`variants.arch.activations`)."""
    D = np.asarray(W, np.float64) - np.asarray(W_hat, np.float64)
    return float(np.sum((D @ G) * D))

"""Exact sliding-window attention for ModernBERT's local layers (Warner et al. 2024; the
Longformer-style banded attention of Beltagy et al. 2020, computed block by block): a query at
position p attends to the keys with |p - p_k| <= ``half`` (``half = local_attention // 2``).

The dense masked path (:class:`variants.arch.modernbert_layers.Attention` with the (B, 1, L, L) window
bias) computes all L x L scores and throws most away; here the queries are cut into blocks of
``block`` slots (:func:`default_block`) and block j attends only to key slots
[j·block - half, (j+1)·block + half), a strided view of the keys padded by ``half`` on each
side. Cost per local layer: L · (block +
2·half) scores instead of L², linear in L.

Exactness: the per-block bias masks (a) padding keys (the batch's and the edge padding) and
(b) every key with |p_q - p_k| > half, using the tokens' own positions. Every key the dense path
weights is inside the block's span whenever a row's positions strictly increase along its slots
(slot distance <= position distance), e.g. 0..L-1, or a pruned row kept in order; the weights
are then those of the dense path up to float summation order (tested <= 1e-5 on every layer).
Rows whose positions do not increase (reordered slots) must use the dense path:
:func:`positions_increase` says which.
"""

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from variants.arch.encoder import MASK_BIAS

#: Environment variable choosing the local layers' attention: ``auto`` (windowed from
#: :data:`CROSSOVER` · local_attention tokens on), ``windowed`` or ``masked`` (dense).
ENV = "VARIANTS_MODERNBERT_ATTENTION"
MODES = ("auto", "windowed", "masked")
#: ``auto`` windows when L >= CROSSOVER · local_attention. Measured with
#: bench/modernbert_window.py (ModernBERT-base shapes, window 128, block 16, B=1, one local
#: layer's attention module, masked / windowed, 7 alternated rounds): 0.83 at L=128, 1.09 at
#: 192, 1.41 at 256, 1.36 at 320, 1.33 at 384, 1.78 at 512. Up to L = 1.5 · window the window
#: covers (nearly) every key and the blocking only adds work.
CROSSOVER = 2


def resolve_mode(mode):
    """``mode`` (str or None; None reads :data:`ENV`, default ``auto``) -> one of :data:`MODES`.
    Raises ValueError (one line) naming the bad value and the choices."""
    if mode is None:
        from variants.runtime import env

        return env.choice(ENV)  # EnvError (a ValueError) for any other value
    src = "local_attention_impl"
    if mode not in MODES:
        from metrics._checks import short_repr

        raise ValueError(f"{src} {short_repr(mode)} is not one of {', '.join(MODES)}; "
                         f"set it to one of them")
    return mode


def positions_increase(positions):
    """Whether every row of ``positions`` (B, L) int strictly increases (numpy, one sync)."""
    p = np.array(positions)
    return bool((np.diff(p, axis=1) > 0).all())


def use_window(mode, length, local_attention, increasing):
    """Whether local layers take the windowed path for ``length`` slots under ``mode``."""
    if mode == "masked" or not increasing:
        return False
    return mode == "windowed" or length >= CROSSOVER * local_attention


def default_block(half):
    """Query slots per block: max(8, half // 4), 16 for ModernBERT-base's window 128. Each block
    scores block + 2·half keys, and on MLX's CPU the softmax's element-wise exp (~30 ns a float)
    costs more than the two block GEMMs, so small blocks win until the GEMMs get too thin.
    Measured (bench/modernbert_window.py shapes, one local layer's core, B=1, ms, block 8 / 16 /
    32 / 64): L=384 25 / 27 / 48 / 67, L=1024 64 / 55 / 114 / 118, L=2048 217 / 231 / 269 / 217
    (shared machine: noisy; 16 never far from the best)."""
    return max(8, half // 4)


@dataclass
class WindowPlan:
    """Per-batch tables of the windowed path: ``bias`` (B, 1, n_blocks, block, block + 2·half)
    float32 (0 or MASK_BIAS), ``half``, ``block``, ``n_blocks``, ``length`` (L)."""

    bias: mx.array
    half: int
    block: int
    n_blocks: int
    length: int


def _key_blocks(a, n_blocks, block, span):
    """``a`` (B, H, Lk, d) contiguous -> (B, H, n_blocks, span, d), block j = a[:, :, j·block :
    j·block + span] (strided view, Lk = n_blocks·block + span - block)."""
    B, H, Lk, d = a.shape
    return mx.as_strided(a, (B, H, n_blocks, span, d), (H * Lk * d, Lk * d, block * d, d, 1))


def make_plan(mask, positions, half, block=None):
    """A :class:`WindowPlan` for ``mask`` (B, L) 0/1 and ``positions`` (B, L) int; ``block``
    (query slots per block) defaults to :func:`default_block`."""
    block = int(block or default_block(half))
    B, L = mask.shape
    nb = math.ceil(L / block)
    tail = nb * block - L
    span = block + 2 * half
    Lk = nb * block + 2 * half
    mask_p = mx.pad(mask.astype(mx.float32), [(0, 0), (half, tail + half)])
    pos_p = mx.pad(positions.astype(mx.int32), [(0, 0), (half, tail + half)])
    kmask = mx.as_strided(mask_p, (B, nb, span), (Lk, block, 1))
    kpos = mx.as_strided(pos_p, (B, nb, span), (Lk, block, 1))
    qpos = mx.pad(positions.astype(mx.int32), [(0, 0), (0, tail)]).reshape(B, nb, block)
    far = mx.abs(qpos[..., :, None] - kpos[..., None, :]) > half
    bad = far | (kmask[..., None, :] == 0)
    bias = mx.where(bad, mx.array(MASK_BIAS, mx.float32), mx.array(0.0, mx.float32))
    return WindowPlan(bias[:, None], half, block, nb, L)


def windowed_attention(q, k, v, scale, plan):
    """softmax(q kᵀ · scale + window bias) v over each query's window only. ``q``, ``k``, ``v``
    (B, H, L, d) float32 (rotary already applied) -> (B, H, L, d)."""
    B, H, L, d = q.shape
    nb, w, h = plan.n_blocks, plan.block, plan.half
    tail = nb * w - L
    q = q * scale
    if tail:
        q = mx.pad(q, [(0, 0), (0, 0), (0, tail), (0, 0)])
    qb = q.reshape(B, H, nb, w, d)
    pad = [(0, 0), (0, 0), (h, tail + h), (0, 0)]
    kb = _key_blocks(mx.pad(k, pad), nb, w, w + 2 * h)
    vb = _key_blocks(mx.pad(v, pad), nb, w, w + 2 * h)
    scores = qb @ kb.swapaxes(-1, -2) + plan.bias
    probs = mx.softmax(scores, axis=-1, precise=True)
    out = (probs @ vb).reshape(B, H, nb * w, d)
    return out[:, :, :L] if tail else out

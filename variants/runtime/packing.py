"""Padding-free ("packed") batches for the encoder: per-token work runs on real tokens only.

A batch of B texts padded to length L holds B·L positions, of which only N are real tokens.
Everything in a BERT layer except the attention core works token by token (projections, MLP,
GELU, layer norms), so it can run on the (N, D) matrix of real tokens; only the attention core
needs the (B, L) layout, and gets it by a gather before and after (the "remove padding" idea of
TurboTransformers, Fang et al. 2021, and of PyTorch's nested-tensor BetterTransformer path).
On the real eval split sorted by length as sentence-transformers does, 28% of the positions
are padding (bench/torch_peer.py).

:func:`plan` builds the index arrays on the host, once per batch, from the (B, L) mask.
"""

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

# Below this share of padded positions the gathers cost about what packing saves.
MIN_PADDING = 0.10


@dataclass
class Part:
    """One stream's share of a packed batch: sequences ``seqs`` = (a, b) (positions in the
    plan's ``order``), packed rows ``rows``.

    ``L``: the part's own padded length (its longest sequence; the attention core runs on
    (b−a, L) and a part of short texts does not pay for the batch's longest);
    ``pad_index`` ((b−a)·L,) int32: for every padded position, its row among this part's packed
    rows (any valid row for padding: those keys are masked, those queries dropped);
    ``real_index`` (n,) int32: for every packed row, its position in the part's (b−a)·L layout;
    ``bias`` (b−a, 1, 1, L) float32: the additive key padding bias; ``lens``: real tokens per
    sequence (the packed rows are these sequences end to end; :mod:`variants.runtime.fused_layer`).
    """

    seqs: tuple
    rows: tuple
    L: int
    pad_index: mx.array
    real_index: mx.array
    bias: mx.array
    lens: tuple = None


@dataclass
class Plan:
    """How a (B, L) batch is packed: ``real_index`` (N,) int32 positions of real tokens in the
    flattened B·L layout; ``unpack_index`` (B·L,) int32 packed row of each position, N for
    padding (a zero row appended); ``parts``: one :class:`Part` per stream."""

    B: int
    L: int
    real_index: mx.array
    unpack_index: mx.array
    parts: list

    def pack(self, x):
        """(B, L, D) -> (N, D): the real tokens, in batch-major order."""
        return mx.take(x.reshape(self.B * self.L, -1), self.real_index, axis=0)

    def split(self, x):
        """(B, L, D) -> [(part, its (n, D) real tokens)] for every part, in order."""
        xp = self.pack(x)
        return [(part, xp[part.rows[0]:part.rows[1]]) for part in self.parts]

    def unpack(self, xp):
        """(N, D) -> (B, L, D) with zeros at padded positions."""
        padded = mx.concatenate([xp, mx.zeros((1, xp.shape[-1]), xp.dtype)])
        return mx.take(padded, self.unpack_index, axis=0).reshape(self.B, self.L, -1)


def _part_bias(bias, a, b, Lp):
    """``bias`` (B or 1, ..., Lq or 1, L) for sequences a..b cut to the part's length Lp on the
    key axis, and on the query axis too when it has one (a per-query bias)."""
    if bias.shape[0] != 1:
        bias = bias[a:b]
    if bias.ndim >= 2 and bias.shape[-2] > 1:
        return bias[..., :Lp, :Lp]
    return bias[..., :Lp]


def balanced_bounds(lengths, k):
    """Cut sequences with ``lengths`` (real tokens each, in batch order) into at most ``k``
    contiguous non-empty groups holding near-equal numbers of tokens: a list of (start, stop).

    Per-token work (projections, MLP) dominates a packed layer, so equal tokens keep the streams
    equally busy; a batch sorted by length (as sentence-transformers sorts it) cut by *count*
    gives the first stream up to 55% of the tokens (bench/torch_peer.py's eval batches).
    Each cut sits at the sequence boundary whose token prefix is nearest to j/k of the total.
    """
    lengths = np.asarray(lengths, np.int64)
    n = len(lengths)
    k = max(1, min(k, n))
    prefix = np.cumsum(lengths)
    total = prefix[-1] if n else 0
    cuts = [0]
    for j in range(1, k):
        # boundary i (1..n-1) splits after sequence i-1; keep every group non-empty
        lo, hi = cuts[-1] + 1, n - (k - j)
        if lo > hi:
            break
        i = lo + int(np.argmin(np.abs(prefix[lo - 1:hi] - total * j / k)))
        cuts.append(i)
    cuts.append(n)
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def longest_first(mask):
    """Sequence order for :func:`plan`: longest first (stable), from ``mask`` (B, L) NumPy.

    The encoder packs a batch in this order, so the parts cut from it hold sequences of similar
    length and each part's attention layout (padded to its own longest sequence) wastes little:
    the two halves' attention positions sum(B_p · L_p²) fall to 0.65x for the mixed batch of
    ``tests/runtime/test_packing.py``, to 0.71x (0.52-0.87) on batches of 32 random eval texts and to
    0.83x on the length-sorted batches of bench/torch_peer.py's end-to-end run. Forward time,
    alternated in one process (bench/packing_order.py): random batches 0.94-0.97x, sorted
    0.985-1.01x (noise)."""
    return np.argsort(-np.asarray(mask).astype(bool).sum(axis=1), kind="stable")


def plan(mask, bias, bounds, *, order=None, min_padding=MIN_PADDING):
    """A :class:`Plan` for ``mask`` (B, L) 0/1 (NumPy or MLX), or None when packing does not pay.

    ``bias`` (B or 1, 1, 1 or L, L): the encoder's additive padding bias, or a per-query one
    (sliced per part); ``order`` (B,) ints: the order sequences are packed in (default the
    batch's own; :func:`longest_first`), ``bounds``: the (a, b) ranges of that order, one per
    stream (:func:`balanced_bounds`). :meth:`Plan.unpack` restores the batch's own order. None
    when fewer than ``min_padding`` of the positions are padding, or a part would hold no real
    token.
    """
    m = np.asarray(mask).astype(bool)
    B, L = m.shape
    n = int(m.sum())
    if B * L == 0 or 1.0 - n / (B * L) < min_padding:
        return None
    order = np.arange(B) if order is None else np.asarray(order, np.int64)
    if sorted(order.tolist()) != list(range(B)):
        raise ValueError(f"order must be a permutation of range({B}), got {order.tolist()}")
    if bias.shape[0] != 1 and np.any(order != np.arange(B)):
        bias = mx.take(bias, mx.array(order.astype(np.int32)), axis=0)
    m = m[order]
    # flat (B·L) position of every real token, sequences in ``order``
    real = (order[:, None] * L + np.arange(L)[None, :])[m].astype(np.int32)
    unpack = np.full(B * L, n, np.int32)
    unpack[real] = np.arange(n, dtype=np.int32)
    parts, start = [], 0
    for a, b in bounds:
        cols = np.flatnonzero(m[a:b].any(axis=0))
        if cols.size == 0:
            return None
        Lp = int(cols[-1]) + 1  # the part's own length: columns past it are padding in every row
        sub = m[a:b, :Lp].reshape(-1)
        k = int(sub.sum())
        local = np.zeros(sub.size, np.int32)
        local[sub] = np.arange(k, dtype=np.int32)
        parts.append(Part((a, b), (start, start + k), Lp, mx.array(local),
                          mx.array(np.flatnonzero(sub).astype(np.int32)),
                          _part_bias(bias, a, b, Lp), tuple(int(n) for n in m[a:b].sum(axis=1))))
        start += k
    return Plan(B, L, mx.array(real), mx.array(unpack), parts)

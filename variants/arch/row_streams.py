"""Running layers called as ``layer(x, ctx, return_attention)`` over the CPU streams, the batch
split by sequences: for architectures whose layer context carries per-query data (MPNet's
relative position bias, DeBERTa-v2's relative positions), which the BERT paths of
:mod:`variants.runtime.streams` (packed batches, query or head splits, the compiled layer) do not
carry. Every row's arithmetic is unchanged: each part is a complete, independent sub-batch.

A context used here has ``take_rows(idx)``; :class:`RowParts` caches its row parts so that a
stack run layer by layer (pruning, early exit) slices it once.
"""

import mlx.core as mx

from variants.runtime import parallel


def cuts(B, L):
    """The (start, stop) sequence parts of a (B, L) batch, one per stream, or None when it runs
    best on one stream (one stream only, fewer sequences than streams, or fewer than
    ``parallel.MIN_ROWS`` token rows)."""
    n = len(parallel.streams())
    if n < 2 or B < n or B * L < parallel.MIN_ROWS:
        return None
    return parallel.bounds(B, n)


class RowParts:
    """Mixin for a layer context: :meth:`rows` gives the context of sequences ``a:b``, built by
    ``take_rows`` once per part and kept."""

    def rows(self, a, b):
        """The context of sequences ``a``..``b - 1`` (cached)."""
        parts = self.__dict__.setdefault("_row_parts", {})
        if (a, b) not in parts:
            parts[(a, b)] = self.take_rows(mx.arange(a, b))
        return parts[(a, b)]


def run(layers, x, ctx):
    """Every layer of ``layers`` in turn on ``x`` (B, L, D) float32 with ``ctx`` -> (B, L, D):
    the sequences split over the streams (:func:`cuts`), each part running the whole list on
    its own stream and joined once at the end, else all on the caller's stream."""
    parts = cuts(*x.shape[:2])
    if parts is None:
        for layer in layers:
            x = layer(x, ctx)[0]
        return x
    outs = []
    for s, (a, b) in zip(parallel.streams(), parts):
        with mx.stream(s):
            h, c = x[a:b], ctx.rows(a, b)
            for layer in layers:
                h = layer(h, c)[0]
            outs.append(h)
    return mx.concatenate(outs, axis=0)

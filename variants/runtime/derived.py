"""Weights derived from a module's own (fused, transposed or sharded copies), cached until the
module's weights are replaced: the cache behind the encoder's fast paths
(:mod:`variants.runtime.fused`, :mod:`variants.runtime.streams`), reusable by any MLX architecture."""

import mlx.core as mx
import mlx.nn as nn


class DerivedWeights:
    """Holds weights derived from a module's own (folded or sharded copies) and the arrays they
    were built from (a plain object, so nn.Module does not treat it as parameters).

    A source is recognised by its array object, not its contents: replacing a weight
    (``load_weights``, ``update``, assigning a new array) rebuilds, but writing into an array in
    place (``w[...] = v``, which keeps the object) does not — call :meth:`clear` after such an
    edit, or assign a new array instead."""

    def __init__(self):
        self.sources, self.arrays = None, None

    def __deepcopy__(self, memo):
        # a deep-copied module starts empty and builds from its own weights on first use: a
        # variant made by deep-copying a warmed reference and replacing its Linears would
        # otherwise hold the reference's derived arrays (~85 MB for MiniLM) without using them
        return DerivedWeights()

    def clear(self):
        """Drop the cached arrays (and the references to their sources)."""
        self.sources, self.arrays = None, None

    def get(self, sources, build):
        """The cached arrays while ``sources`` are the same array objects, else ``build()``."""
        if self.sources is None or len(sources) != len(self.sources) or any(
                a is not b for a, b in zip(sources, self.sources)):
            self.sources, self.arrays = sources, build()  # left lazy: the first forward computes
        return self.arrays


def plain_linear(m):
    """Whether ``m`` is a plain biased ``nn.Linear`` (not quantized, factorised or bias-free):
    the only kind the fused paths derive weights from."""
    return type(m) is nn.Linear and "bias" in m


def transposed(w):
    """``w`` (out, in) -> its transpose (in, out), contiguous (see
    :meth:`variants.runtime.fused.FusedAttention.folded`)."""
    return mx.contiguous(w.T)

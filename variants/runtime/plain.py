"""The plain MLX compute path on demand: inside :func:`plain` the compiled encoder layers
(:mod:`variants.runtime.fused_layer`) and the compiled CPU kernels (:mod:`variants.runtime.qkernel`)
are switched off for this process, as ``VARIANTS_FUSED_LAYER=off VARIANTS_QKERNEL=off`` would
switch them off, so a model's forward takes MLX's own ops (the same algebra, other float32
round-off: tests/runtime/test_fused_layer.py).

It gives the reference a second compute path: the null control (``--family exact
--exact-kinds null-control``, :mod:`variants.families.exact.build`) is the reference recomputed this way,
and the reference's numerical noise (:mod:`variants.sweep.noise`) is the largest
``|Δlogit|`` between the two paths. The path is chosen when a forward builds its MLX graph, so a
forward called inside the block runs plain whenever MLX evaluates it.

Not thread-safe across concurrent forwards of other models (the sweep never runs two at once:
timing alternates reference and variant). No MLX.
"""

from contextlib import contextmanager

_depth = [0]


def active():
    """True inside :func:`plain`."""
    return _depth[0] > 0


@contextmanager
def plain():
    """Switch the compiled layers and kernels off for the block (nests)."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1

"""Which timed calls are cold, and the buffer-cache clear that starts every timed configuration.

A call is **cold** when it is the first call of its shape — the (batch size, padded length) of
each batch it runs — that a model has run since MLX's buffer cache was last cleared by
:func:`clear_buffer_cache`. Both halves matter on the CPU: a new shape builds its compiled
graphs and kernels' workspaces (the first B=1 call of a MiniLM reference measured 121 ms against
9 ms warm), and after a clear every buffer is allocated afresh (the next B=32 call measured
~120 ms against ~97 ms warm; both measured on a 2-core AMD EPYC (Zen 4) shared with other jobs,
MLX 0.32.4, all-MiniLM-L6-v2).

:func:`variants.runtime.timing.time_alternating` clears the cache at its start, so "since the
last clear" is "in this measurement": warm-ups and timed calls of the same model and shape
count, a quality forward run earlier does not. Models are told apart by identity (a copy made by
``replace_module`` starts with no shapes); the log holds them weakly.
"""

import weakref

import mlx.core as mx

_epoch = 0
#: model -> (epoch, set of shapes it ran in that epoch)
_seen = weakref.WeakKeyDictionary()


def clear_buffer_cache():
    """Empty MLX's buffer cache (``mx.clear_cache``) and reset its allocator peak
    (``mx.reset_peak_memory``); every model's next call of any shape is cold again.

    Returns
    -------
    int
        Bytes the cache held before the clear (``mx.get_cache_memory``).
    """
    global _epoch
    held = int(mx.get_cache_memory())
    mx.clear_cache()
    mx.reset_peak_memory()
    _epoch += 1
    return held


def batch_shapes(batches):
    """``((B, L), ...)``: batch size and padded length (ints) of each PreparedBatch's
    ``input_ids``, in order."""
    return tuple((int(b.input_ids.shape[0]), int(b.input_ids.shape[1])) for b in batches)


def _shapes(model):
    epoch, shapes = _seen.get(model, (None, None))
    if epoch != _epoch:
        shapes = set()
        _seen[model] = (_epoch, shapes)
    return shapes


def is_cold(model, shapes):
    """True when ``model`` has not run one of ``shapes`` (:func:`batch_shapes`) since the last
    :func:`clear_buffer_cache` (or ever). ``model`` must be weak-referenceable and hashable by
    identity (a DecisionModel is); raises TypeError otherwise."""
    seen = _shapes(model)
    return any(s not in seen for s in shapes)


def record(model, shapes):
    """Note that ``model`` ran ``shapes`` (:func:`batch_shapes`): its next call of them is
    warm until the next :func:`clear_buffer_cache`."""
    _shapes(model).update(shapes)

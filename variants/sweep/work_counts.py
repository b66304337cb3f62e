"""Work per forward: MLX graph evaluations and compiled-function calls, and their slopes.

Method (docs/method.md, "Slopes over at least three sizes"): the counts are taken at several sequence
lengths and batch sizes and fitted with a slope; a count that grows per token or per example is
per-launch overhead to remove, not a number to report. The segment profile and the Amdahl
ceilings are in :mod:`variants.sweep.profile`.
"""

from contextlib import contextmanager

import mlx.core as mx
import numpy as np

from variants.runtime import fast_ops


@contextmanager
def count_work():
    """Count ``mx.eval`` calls and calls of :mod:`variants.runtime.fast_ops`' fused functions (GELU,
    softmax; each runs two or three compiled kernels).

    Yields a dict ``{"evals": n, "compiled_calls": n}`` that fills while the block runs.
    Patches module attributes for the duration only (nothing persists across uses).
    """
    counts = {"evals": 0, "compiled_calls": 0}
    real_eval = mx.eval
    compiled = {n: getattr(fast_ops, n) for n in ("gelu", "masked_softmax", "softmax_parts")}

    def eval_(*a, **k):
        counts["evals"] += 1
        return real_eval(*a, **k)

    def wrap(fn):
        def inner(*a, **k):
            counts["compiled_calls"] += 1
            return fn(*a, **k)
        return inner

    import variants.arch.encoder as encoder_mod
    real_act = dict(encoder_mod.ACTIVATIONS)
    mx.eval = eval_
    for n, fn in compiled.items():
        setattr(fast_ops, n, wrap(fn))
    encoder_mod.ACTIVATIONS["gelu"] = fast_ops.gelu
    try:
        yield counts
    finally:
        mx.eval = real_eval
        for n, fn in compiled.items():
            setattr(fast_ops, n, fn)
        encoder_mod.ACTIVATIONS.clear()
        encoder_mod.ACTIVATIONS.update(real_act)


def work_slopes(forward, make_batch, *, seq_lens=(16, 64, 128), batch_sizes=(1, 8, 32)):
    """Work counts per forward at each (batch size, sequence length), with fitted slopes.

    Parameters
    ----------
    forward : callable (batch) -> mx.array
        One forward; evaluated once inside the count (as a harness would).
    make_batch : callable (batch_size, seq_len) -> batch
    seq_lens, batch_sizes : tuple of int, each at least 3 values

    Returns
    -------
    table : list of dict
        One row per (batch_size, seq_len): ``evals``, ``compiled_calls``.
    slopes : dict
        ``{count: {"per_token": slope, "per_example": slope}}``, least-squares slopes of each
        count against seq_len (all batch sizes pooled) and against batch_size. ~0 means the work
        does not grow with the input.
    """
    if len(set(seq_lens)) < 3 or len(set(batch_sizes)) < 3:
        raise ValueError("seq_lens and batch_sizes need >= 3 distinct values each to fit a slope.")
    rows = []
    for b in batch_sizes:
        for L in seq_lens:
            batch = make_batch(b, L)
            with count_work() as c:
                mx.eval(forward(batch))
            rows.append({"batch_size": b, "seq_len": L, **c})
    slopes = {}
    for key in ("evals", "compiled_calls"):
        y = np.array([r[key] for r in rows], float)
        slopes[key] = {
            "per_token": float(np.polyfit([r["seq_len"] for r in rows], y, 1)[0]),
            "per_example": float(np.polyfit([r["batch_size"] for r in rows], y, 1)[0]),
        }
    return rows, slopes


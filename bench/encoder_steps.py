"""What each speed step of the MLX reference forward gave: a table step -> ms, in one run.

Steps, each added to the previous one (all in one process, alternated round by round, so a
change in machine load hits every step alike; the figure per step is the median over rounds):

0. port as first written: ``mx.softmax`` attention, ``nn.gelu`` (erf), one Linear per
   projection, one MLX stream, MLX's default buffer cache;
1. GELU as two compiled kernels with a float32 rational erf (``variants.runtime.fast_ops.gelu``);
2. softmax as compiled exp kernels, normalised after ``probs @ v`` by the row sums that
   ``e @ [v, 1]`` gives (``variants.runtime.fast_ops.softmax_parts``);
3. the batch split over two MLX CPU streams, one whole layer stack per stream, one OpenBLAS
   thread each (``variants.runtime.parallel``);
4. one fused QKV GEMM with the scale and biases folded (``Attention.folded``);
5. MLX's buffer cache raised from 32 MB to 1 GB (``parallel.CACHE_LIMIT_BYTES``);
6. attention scores computed transposed (keys on axis -2), so the softmax's max is a column
   reduction (``Attention.core``);
7. the fused path's weights stored transposed, input features first (``Attention.folded``,
   ``TransformerLayer.mlp_weights``): ``x @ w_t`` instead of ``x @ w.T`` — shipped.

Also checks that every step's pooled embeddings equal step 0's to float32 round-off.
Run: ``python bench/encoder_steps.py [--batch-size 32] [--seq-len 128] [--rounds 5]``.
"""

import argparse
import time

import variants  # noqa: F401  (preloads OpenBLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.arch import encoder
from variants.runtime import fast_ops, parallel
from variants.checkpoints.load import load_checkpoint
from variants.arch.encoder import mean_pool

STEPS = ("0 mx.softmax + nn.gelu, 1 stream", "1 + fused rational-erf GELU",
         "2 + fused exp softmax", "3 + two CPU streams", "4 + folded QKV GEMM",
         "5 + 1 GB buffer cache", "6 + transposed scores",
         "7 + transposed weights (shipped)")


def _plain_parts(scores, bias=None, total=True, axis=-1):
    p = mx.softmax(scores if bias is None else scores + bias, axis=axis)
    return (p, mx.array(1.0)) if total else p


def _untransposed_core(self, q, k, v, bias, return_attention=False):
    """``Attention.core`` before step 6: scores (B, h, Lq, L), softmax over the last axis."""
    if return_attention:
        return _SHIPPED["core"](self, q, k, v, bias, True)
    B, h, Lq, d = q.shape
    e = fast_ops.softmax_parts(q @ k.transpose(0, 1, 3, 2), bias, total=False)
    r = e @ mx.concatenate([v, mx.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
    return (r[..., :d] / r[..., d:]).transpose(0, 2, 1, 3).reshape(B, Lq, h * d), None


_UNTRANSPOSED = {}


def _untransposed_folded(self):
    """``Attention.folded`` before step 7: the same tuple, weights as transposed *views* of the
    (out, in) arrays, so ``x @ w_t`` runs as ``x @ w.T`` did (built once per module)."""
    if not all(encoder._plain_linear(m) for m in (self.query, self.key, self.value, self.out)):
        return None
    # keyed by the module's id *and* checked against its own weight arrays: an id can be reused
    # by a later module once this one is garbage-collected (a stale entry gave another model's
    # weights, max |diff| 0.17, in one full test run)
    sources = tuple(a for m in (self.query, self.key, self.value, self.out)
                    for a in (m.weight, m.bias))
    cached = _UNTRANSPOSED.get(id(self))
    if cached is None or any(a is not b for a, b in zip(cached[0], sources)):
        w = mx.concatenate([self.query.weight * self.scale, self.key.weight, self.value.weight])
        b_out = self.out.bias + self.out.weight @ self.value.bias
        mx.eval(w, b_out)
        cached = (sources, (w.T, self.query.bias * self.scale, b_out, self.out.weight.T))
        _UNTRANSPOSED[id(self)] = cached
    return cached[1]


def _untransposed_mlp(self):
    """``TransformerLayer.mlp_weights`` before step 7: transposed views, as ``nn.Linear``."""
    i, u = self.intermediate, self.output
    return (i.weight.T, i.bias, u.weight.T, u.bias)


_SHIPPED = {"gelu": fast_ops.gelu, "parts": fast_ops.softmax_parts,
            "folded": encoder.Attention.folded, "core": encoder.Attention.core,
            "mlp": encoder.TransformerLayer.mlp_weights}


def _configure(step):
    """Patch the encoder's element-wise functions, projections, stream split and buffer cache
    to ``step``'s state; returns whether the two-stream split is on."""
    encoder.ACTIVATIONS["gelu"] = _SHIPPED["gelu"] if step >= 1 else nn.gelu
    fast_ops.softmax_parts = _SHIPPED["parts"] if step >= 2 else _plain_parts
    two = step >= 3 and len(parallel.streams()) > 1
    parallel._set_blas_threads(1 if two else 2)
    encoder.Attention.folded = (_SHIPPED["folded"] if step >= 7 else _untransposed_folded
                                if step >= 4 else (lambda self: None))
    encoder.TransformerLayer.mlp_weights = _SHIPPED["mlp"] if step >= 7 else _untransposed_mlp
    mx.set_cache_limit(parallel.CACHE_LIMIT_BYTES if step >= 5
                       else parallel.info()["mlx_default_cache_limit"])
    encoder.Attention.core = _SHIPPED["core"] if step >= 6 else _untransposed_core
    return two


def measure(batch_size=32, seq_len=128, rounds=5, seed=0):
    """Alternated rounds of every step; returns a list of rows
    ``{"step", "ms", "tokens_per_s", "speedup_vs_0", "max_abs_diff_vs_0"}``."""
    enc = load_checkpoint().encoder
    rng = np.random.default_rng(seed)
    ids = mx.array(rng.integers(1000, 30000, (batch_size, seq_len)).astype(np.int32))
    mask = mx.ones((batch_size, seq_len), mx.int32)
    parallel.streams()  # create the streams once
    # per-step head-split shard caches (B = 1): built from the step's own folded / MLP layout
    shipped_shards = [layer._shards for layer in enc.layers]
    shards = {s: [encoder._Folded() for _ in enc.layers] for s in range(len(STEPS))}

    def run(step):
        two = _configure(step)
        for layer, cache in zip(enc.layers, shards[step]):
            layer._shards = cache
        if two:
            out = mean_pool(enc(ids, mask).last_hidden, mask)
        else:
            with parallel.single_stream():
                out = mean_pool(enc(ids, mask).last_hidden, mask)
        mx.eval(out)
        return out

    try:
        outs = {s: np.array(run(s)) for s in range(len(STEPS))}  # warm-up + outputs to compare
        ms = {s: [] for s in range(len(STEPS))}
        for _ in range(rounds):
            for s in range(len(STEPS)):
                t0 = time.perf_counter()
                run(s)
                ms[s].append((time.perf_counter() - t0) * 1e3)
    finally:
        _configure(len(STEPS) - 1)
        for layer, cache in zip(enc.layers, shipped_shards):
            layer._shards = cache
    base = np.array(ms[0])
    return [{"step": name, "ms": float(np.median(ms[s])),
             "tokens_per_s": batch_size * seq_len / float(np.median(ms[s])) * 1e3,
             "speedup_vs_0": float(np.median(base / np.array(ms[s]))),
             "max_abs_diff_vs_0": float(np.abs(outs[s] - outs[0]).max())}
            for s, name in enumerate(STEPS)]


def print_table(rows, batch_size, seq_len, rounds):
    print(f"MLX reference forward, B={batch_size} L={seq_len} (random ids, full mask), "
          f"median of {rounds} alternated rounds")
    print(f"  {'step':<36}{'ms':>9}{'tok/s':>9}{'vs step 0':>11}{'max |dx| vs 0':>15}")
    for r in rows:
        print(f"  {r['step']:<36}{r['ms']:9.1f}{r['tokens_per_s']:9.0f}"
              f"{r['speedup_vs_0']:10.2f}x{r['max_abs_diff_vs_0']:15.1e}")


def main(batch_size=32, seq_len=128, rounds=5):
    rows = measure(batch_size, seq_len, rounds)
    print_table(rows, batch_size, seq_len, rounds)
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    main(a.batch_size, a.seq_len, a.rounds)

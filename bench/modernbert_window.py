"""ModernBERT's local attention, windowed (only the keys inside each window,
:mod:`variants.arch.modernbert_window`) against masked (dense L x L scores plus a window bias), on a
random-init encoder at ModernBERT-base's shapes (hidden 768, 12 heads, intermediate 1152,
window 128, a global layer every 3rd; built in MLX, nothing downloaded).

Per length L (default 128, 512, 1024, 2048) and batch size: the attention module of one local
layer (Wqkv, rotary, scores, softmax, values, Wo; the bias / window tables built beforehand),
its core alone (softmax(q kᵀ + bias) v from given q, k, v: what the window changes),
one global layer's attention (dense, the same in both modes) and the whole forward (``--layers``
layers, default 6: 2 global + 4 local, the 1:2 mix of ModernBERT-base's 22 (8 + 14), which at
L=2048 would take ~1 min per forward here; the context built inside the timed call), each timed in
alternated A/B rounds (masked, windowed, then windowed, masked, ...; ``mx.eval`` inside the timed
region) and reported as medians with the ratio masked / windowed. Then the slope of log(time)
over log(L), least squares over the lengths >= ``--slope-from`` (default 512, three sizes):
local windowed attention should grow ~1 (linear), the global and the masked local ~2 at
large L (their projections are linear, so below ~1k tokens the slope sits between). The
crossover section times the local attention at lengths around the window to place
:data:`variants.arch.modernbert_window.CROSSOVER`.

The machine is shared: read the ratios (measured in alternation), not absolute milliseconds.
Measured here (2 shared cores, MLX 0.32.4, B=1, masked / windowed): local attention module
0.86 / 1.90 / 3.54 / 3.98x at L = 128 / 512 / 1024 / 2048, its core 0.58 / 3.18 / 7.27 / 9.30x,
6-layer forward 0.96 / 1.53 / 1.32 / 2.05x; slopes over 512-2048: core windowed 1.03, core
masked 1.80, global attention 1.77 (B=8, L=512, 5 rounds: forward 1.41x, local attention 2.27x).
Run: ``python bench/modernbert_window.py [--batch 1 8] [--rounds 3] [--layers 22]``.
"""

import argparse
import statistics
import time

import variants  # noqa: F401  must come before `import mlx`: it preloads OpenBLAS

import mlx.core as mx
import numpy as np

from variants.arch import modernbert_window as W
from variants.arch.modernbert import ModernBertArgs, ModernBertContext, ModernBertEncoder
from variants.arch.modernbert_layers import apply_rope


def base_args(layers=22):
    """ModernBERT-base's encoder shapes (answerdotai/ModernBERT-base config.json)."""
    return ModernBertArgs(
        vocab_size=50368, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
        intermediate_size=1152, max_position_embeddings=8192, norm_eps=1e-5, norm_bias=False,
        attention_bias=False, mlp_bias=False, classifier_bias=False, hidden_activation="gelu",
        classifier_activation="gelu", classifier_pooling="mean", global_rope_theta=160000.0,
        local_rope_theta=10000.0, local_attention=128, pad_token_id=50283,
        global_attn_every_n_layers=3)


def _time(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ab(fns, rounds):
    """{name: median seconds} over ``rounds`` alternated rounds (order flips each round), one
    untimed warm-up call each."""
    names = list(fns)
    for n in names:
        fns[n]()
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(_time(fns[n]))
    return {n: statistics.median(v) for n, v in times.items()}


def slope(lengths, times):
    """Least-squares slope of log(time) over log(length)."""
    return float(np.polyfit(np.log(lengths), np.log(times), 1)[0])


def _inputs(args, batch, length, seed=0):
    rng = np.random.default_rng(seed)
    ids = mx.array(rng.integers(5, args.vocab_size, (batch, length)).astype(np.int32))
    return ids, mx.ones((batch, length), dtype=mx.int32)


def attention_times(enc, batch, length, rounds):
    """Median seconds of one local layer's attention (masked, windowed) and a global one's."""
    args = enc.args
    x = mx.random.normal((batch, length, args.hidden_size), key=mx.random.key(1))
    mask = mx.ones((batch, length), dtype=mx.int32)
    pos = mx.broadcast_to(mx.arange(length), (batch, length))
    ctx = ModernBertContext(args, mask, pos, "windowed", increasing=True)
    cos_l, sin_l = ctx.rope(False)
    cos_g, sin_g = ctx.rope(True)
    local_bias, global_bias, plan = ctx.bias(False), ctx.bias(True), ctx.window()
    mx.eval(x, cos_l, sin_l, cos_g, sin_g, local_bias, global_bias, plan.bias)
    loc, glob = enc.layers[1].attn, enc.layers[0].attn
    q, k, v = _qkv(loc, x, cos_l, sin_l)
    mx.eval(q, k, v)
    fns = {"masked": lambda: mx.eval(loc(x, local_bias, cos_l, sin_l)[0]),
           "windowed": lambda: mx.eval(loc(x, None, cos_l, sin_l, window=plan)[0]),
           "global": lambda: mx.eval(glob(x, global_bias, cos_g, sin_g)[0]),
           "core masked": lambda: mx.eval(_dense_core(q, k, v, loc.scale, local_bias)),
           "core windowed": lambda: mx.eval(W.windowed_attention(q, k, v, loc.scale, plan))}
    return ab(fns, rounds)


def _qkv(attn, x, cos, sin):
    """The rotary q, k and v (B, heads, L, head_dim) of :class:`Attention` ``attn``."""
    B, L, _ = x.shape
    qkv = attn.Wqkv(x).reshape(B, L, 3, attn.n_heads, attn.head_dim).transpose(2, 0, 3, 1, 4)
    return apply_rope(qkv[0], cos, sin), apply_rope(qkv[1], cos, sin), qkv[2]


def _dense_core(q, k, v, scale, bias):
    """The masked path's core, as in :class:`Attention`: softmax(q kᵀ · scale + bias) v."""
    scores = (q * scale) @ k.transpose(0, 1, 3, 2) + bias
    return mx.softmax(scores, axis=-1, precise=True) @ v


def forward_times(enc, batch, length, rounds):
    ids, mask = _inputs(enc.args, batch, length)

    def run(mode):
        def fn():
            enc.local_attention_impl = mode
            mx.eval(enc(ids, mask).last_hidden)
        return fn
    try:
        return ab({"masked": run("masked"), "windowed": run("windowed")}, rounds)
    finally:
        enc.local_attention_impl = None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1024, 2048])
    p.add_argument("--batch", type=int, nargs="+", default=[1])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--forward-rounds", type=int, default=2)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--slope-from", type=int, default=512)
    p.add_argument("--crossover", type=int, nargs="*", default=[128, 192, 256, 384])
    a = p.parse_args(argv)
    args = base_args(a.layers)
    enc = ModernBertEncoder(args)
    mx.eval(enc.parameters())
    n_local = sum(not layer.is_global for layer in enc.layers)
    print(f"ModernBERT-base shapes, random init: {a.layers} layers ({n_local} local, window "
          f"{args.local_attention}), block {W.default_block(args.local_attention // 2)}; "
          f"medians of {a.rounds} "
          f"(attention) / {a.forward_rounds} (forward) alternated rounds; auto windows from "
          f"L >= {W.CROSSOVER * args.local_attention}; forward rounds + 2 up to L=512")
    if a.crossover:
        print("\ncrossover, one local layer's attention, B=1 (ms):")
        print(f"{'L':>6} {'masked':>9} {'windowed':>9} {'masked/win':>10} | {'core masked':>11} "
              f"{'core win':>9} {'masked/win':>10}")
        for L in a.crossover:
            t = attention_times(enc, 1, L, a.rounds + 2)
            print(f"{L:>6} {t['masked'] * 1e3:>9.2f} {t['windowed'] * 1e3:>9.2f} "
                  f"{t['masked'] / t['windowed']:>10.2f} | {t['core masked'] * 1e3:>11.2f} "
                  f"{t['core windowed'] * 1e3:>9.2f} "
                  f"{t['core masked'] / t['core windowed']:>10.2f}", flush=True)
    for B in a.batch:
        rows = []
        print(f"\nB={B} (ms; ratio = masked / windowed, > 1: windowed faster)")
        print(f"{'L':>6} | {'local masked':>12} {'local win':>10} {'ratio':>6} | "
              f"{'core masked':>11} {'core win':>9} {'ratio':>6} | {'global':>9} | "
              f"{'fwd masked':>11} {'fwd win':>10} {'ratio':>6}")
        for L in a.lengths:
            t = attention_times(enc, B, L, a.rounds)
            f = forward_times(enc, B, L, a.forward_rounds + (2 if L <= 512 else 0))
            rows.append((L, t, f))
            print(f"{L:>6} | {t['masked'] * 1e3:>12.2f} {t['windowed'] * 1e3:>10.2f} "
                  f"{t['masked'] / t['windowed']:>6.2f} | {t['core masked'] * 1e3:>11.2f} "
                  f"{t['core windowed'] * 1e3:>9.2f} "
                  f"{t['core masked'] / t['core windowed']:>6.2f} | {t['global'] * 1e3:>9.2f} | "
                  f"{f['masked'] * 1e3:>11.1f} {f['windowed'] * 1e3:>10.1f} "
                  f"{f['masked'] / f['windowed']:>6.2f}", flush=True)
        fit = [r for r in rows if r[0] >= a.slope_from]
        if len(fit) >= 2:
            Ls = [r[0] for r in fit]
            print(f"slope of log(time) over log(L), L in {Ls}: "
                  f"local windowed {slope(Ls, [r[1]['windowed'] for r in fit]):.2f}, "
                  f"local masked {slope(Ls, [r[1]['masked'] for r in fit]):.2f}, "
                  f"core windowed {slope(Ls, [r[1]['core windowed'] for r in fit]):.2f}, "
                  f"core masked {slope(Ls, [r[1]['core masked'] for r in fit]):.2f}, "
                  f"global {slope(Ls, [r[1]['global'] for r in fit]):.2f}, "
                  f"forward windowed {slope(Ls, [r[2]['windowed'] for r in fit]):.2f}, "
                  f"forward masked {slope(Ls, [r[2]['masked'] for r in fit]):.2f}")


if __name__ == "__main__":
    main()

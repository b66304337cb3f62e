"""Half-precision scales and the microscaling modes on the compiled CPU kernels, side by side.

Part 1, per Linear: MiniLM's real shapes (384 -> 384, 384 -> 1536, 1536 -> 384) at B * 128
token rows (B = 1 and 32), affine 4 and 8 bits at group 64: the same packed weight with float32
scales and biases (A) against float16 / bfloat16 copies of them (B), one
:class:`variants.runtime.qlinear.CpuQuantizedLinear` call each (``dequant-cpp+gemm``), timed in
strict alternation (``time_alternating``). Printed: p50 of both and the speed of B relative to
A (median over rounds of A_ms / B_ms, bootstrap 95% CI): the issue's target is >= 0.95.

Part 2, per Linear: each microscaling mode (``mxfp4``, ``mxfp8``, ``nvfp4``, dequantized by
``dequant-mode-cpp+gemm``) against affine 4 bits (and ``mxfp8`` against affine 8 bits) on the
same shapes, alternated the same way.

Part 3 (``--encoder``, default on): the whole quantized MiniLM sentiment model (4 bits, g64,
native: the fused quantized layer where it applies) with float32 scales against the same model
with float16 scales, B = 1 and B = 32 at ``--seq-len`` tokens.

Run: ``python bench/scale_dtype_speed.py`` (~4 min on 2 cores). Results: docs/speed.md.
"""

import argparse
import sys

import variants  # noqa: F401  (OpenBLAS before mlx)

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.runtime import qlinear
from variants.runtime.timing import time_alternating

SHAPES = ((384, 384), (384, 1536), (1536, 384))
HALF = {"float16": mx.float16, "bfloat16": mx.bfloat16}
RULE = "=" * 6


def configure_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32],
                   help="B: the Linears see B * 128 rows")
    p.add_argument("--bits", type=int, nargs="+", default=[4, 8], help="affine bit widths")
    p.add_argument("--group-size", type=int, default=64, help="affine group size")
    p.add_argument("--rounds", type=int, default=30, help="alternated rounds per row")
    p.add_argument("--budget-s", type=float, default=4.0, help="seconds per row at most")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (encoder)")
    p.add_argument("--no-encoder", action="store_true", help="skip part 3")
    p.add_argument("--no-modes", action="store_true", help="skip part 2")
    return p


def _layer(inp, out, seed, **quant):
    mx.random.seed(seed)
    q = nn.QuantizedLinear.from_linear(nn.Linear(inp, out), **quant)
    qlinear.use_cpu_path(q)
    mx.eval(q.parameters())
    return q


def _half(q, dtype):
    """A copy of the CpuQuantizedLinear ``q`` (the same packed weight) with its scales and
    biases cast to ``dtype``."""
    h = _layer(q["scales"].shape[1] * q.group_size, q["weight"].shape[0], 0,
               group_size=q.group_size, bits=q.bits)
    h.weight, h.bias = q.weight, q.bias
    h.scales, h.biases = q.scales.astype(dtype), q.biases.astype(dtype)
    mx.eval(h.parameters())
    return h


def _row(label, r):
    s = r["speedup"]
    print(f"{label:>44} {r['ref']['p50_ms']:9.3f} {r['var']['p50_ms']:9.3f} "
          f"{s['speedup_median']:6.3f}x [{s['speedup_ci_low']:.3f}, {s['speedup_ci_high']:.3f}]",
          flush=True)


def _header(a, b):
    print(f"{'':>44} {a + ' ms':>9} {b + ' ms':>9} {'B/A speed':>9} {'95% CI':>15}")


def scale_dtypes(args):
    print(f"{RULE} affine g{args.group_size}: float32 scales (A) vs half-precision scales (B), "
          f"dequant-cpp+gemm {RULE}")
    _header("A", "B")
    for bits in args.bits:
        for inp, out in SHAPES:
            q = _layer(inp, out, 0, group_size=args.group_size, bits=bits)
            assert q.kernel == qlinear.NAMES["cpp"], q.kernel
            halves = {name: _half(q, dt) for name, dt in HALF.items()}
            for b in args.batch_sizes:
                x = mx.random.normal((b * 128, inp), key=mx.random.key(b))
                mx.eval(x)
                for name, h in halves.items():
                    r = time_alternating(lambda: q(x), lambda: h(x), warmup=3,
                                         rounds=args.rounds, budget_s=args.budget_s)
                    _row(f"{bits}b {inp}->{out} rows {b * 128} {name}", r)


def modes(args):
    print(f"{RULE} microscaling modes (B, dequant-mode-cpp+gemm) vs affine g{args.group_size} "
          f"float32 scales (A, dequant-cpp+gemm) {RULE}")
    _header("A", "B")
    for mode, (gs, bits) in qlinear.MODES.items():
        for inp, out in SHAPES:
            m = _layer(inp, out, 0, group_size=gs, bits=bits, mode=mode)
            assert m.kernel == qlinear.NAMES["mode-cpp"], m.kernel
            for abits in sorted({4, bits}):
                a = _layer(inp, out, 0, group_size=args.group_size, bits=abits)
                for b in args.batch_sizes:
                    x = mx.random.normal((b * 128, inp), key=mx.random.key(b))
                    mx.eval(x)
                    r = time_alternating(lambda: a(x), lambda: m(x), warmup=3,
                                         rounds=args.rounds, budget_s=args.budget_s)
                    _row(f"{mode} vs {abits}b {inp}->{out} rows {b * 128}", r)


def encoder(args):
    from variants.checkpoints.load import load_checkpoint
    from variants.families.quant.build import QuantConfig, quantize_module
    from variants.models import sentiment
    from variants.arch import encoder as enc

    ref = sentiment.build(load_checkpoint()).module
    cfg = QuantConfig(bits=4, group_size=64)
    a = quantize_module(ref, cfg, mode="native")[0]
    b = quantize_module(ref, cfg, mode="native")[0]
    n = 0
    for _, m in b.named_modules():
        if isinstance(m, qlinear.CpuQuantizedLinear):
            m.scales, m.biases = m.scales.astype(mx.float16), m.biases.astype(mx.float16)
            n += 1
    mx.eval(a.parameters(), b.parameters())
    paths = enc.compiled_paths(a), enc.compiled_paths(b)
    print(f"{RULE} quantized MiniLM (4 bits g64, {n} Linears): float32 scales (A) vs float16 "
          f"scales (B); compiled paths {paths[0]} / {paths[1]} {RULE}")
    _header("A", "B")
    vocab = ref.encoder.args.vocab_size
    rng = np.random.default_rng(0)
    for bsz in args.batch_sizes:
        ids = mx.array(rng.integers(1000, vocab, (bsz, args.seq_len)), mx.int32)
        mask = mx.ones_like(ids)
        types = mx.zeros_like(ids)
        r = time_alternating(lambda: a(ids, mask, types), lambda: b(ids, mask, types),
                             warmup=2, rounds=args.rounds, budget_s=6 * args.budget_s)
        _row(f"encoder B={bsz} L={args.seq_len}", r)


def main(argv=None):
    args = configure_parser().parse_args(argv)
    if qlinear.resolve("cpp") != "cpp" or qlinear.mode_kernel() != "mode-cpp":
        print("bench/scale_dtype_speed.py: the compiled kernel is not built here "
              "(python -m variants.runtime.qkernel)", file=sys.stderr)
        return 2
    scale_dtypes(args)
    if not args.no_modes:
        modes(args)
    if not args.no_encoder:
        encoder(args)
    print("B/A speed = median over alternated rounds of A_ms / B_ms (>= 1: B as fast or faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The W8A8 encoder with and without its prepacked weights, alternated in one process.

Our ``w8a8`` engine of bench/peers.py (every MiniLM encoder Linear a native ``Int8Linear``, BERT
layers as ``fused_bert_int8layer``) timed on the same forward twice per round: its fused layers
given their weights' prepacked blobs (oneDNN's matmul primitive, ``int8-matmul-dnnl-prepacked``)
or not (``dnnl_gemm_u8s8s32``, which re-packs the weights every call). Same build, weights and
inputs; only the blobs differ. Rounds alternate which goes first (ABBA); a block is
``--warmup`` untimed forwards then ``--iters`` timed ones (its median is the round's time). The
speed-up is the median per-round ratio plain / prepacked with its 95% percentile-bootstrap CI
over rounds (:func:`metrics.latency.paired_speedup`); the outputs of both are compared too
(they are bit-identical: the same int32 sums).

Measured (docs/w8a8.md; load 7.6-7.8 on the shared 2-core box, 9 rounds): B=1 L=24 1.11x
[0.94, 1.20], B=32 L=128 0.97x [0.91, 1.01]::

    PYTHONPATH=$PWD python bench/w8a8_prepack_ab.py --rounds 9
"""

import argparse
import sys
import time
from pathlib import Path

import variants  # noqa: F401  (preloads OpenBLAS before mlx)
import mlx.core as mx
import numpy as np

from metrics.latency import paired_speedup
from variants.runtime import fused_layer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_workers import w8a8_encoder  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=7, help="alternated rounds per shape")
    p.add_argument("--iters", type=int, default=20, help="timed forwards per block at B=1 "
                   "(B=32: a tenth, at least 2)")
    p.add_argument("--warmup", type=int, default=3, help="untimed forwards per block")
    p.add_argument("--shapes", nargs="+", default=["1x24", "32x128"], help="B x L")
    args = p.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    except ValueError:
        print(f"w8a8_prepack_ab: --shapes takes BxL (e.g. 1x24), got {args.shapes}",
              file=sys.stderr)
        return 2
    from variants.arch.encoder import mean_pool
    from variants.checkpoints.load import load_checkpoint, minilm_path
    from variants.runtime.int8_linear import Int8Linear
    enc = w8a8_encoder(load_checkpoint(minilm_path()).encoder)
    kernels = sorted({m.kernel for _, m in enc.named_modules() if isinstance(m, Int8Linear)})
    if kernels != ["int8-matmul-dnnl-prepacked"]:
        print(f"w8a8_prepack_ab: no prepacked weights here (kernels {kernels}); needs oneDNN's "
              "matmul primitive (apt-get install libdnnl-dev, python -m variants.runtime.qkernel "
              "--force)", file=sys.stderr)
        return 2
    run = fused_layer._run

    def plain(kernel, layer, w, rows, lens, kb, threads, kind="fp32"):
        if kind == "int8":
            w = (*w[:4], [None] * 4)  # no blobs: dnnl_gemm_u8s8s32
        return run(kernel, layer, w, rows, lens, kb, threads, kind)

    rng = np.random.default_rng(0)
    for B, L in shapes:
        ids = mx.array(rng.integers(1000, 20000, (B, L)).astype(np.int32))
        mask, types = mx.ones((B, L), mx.int32), mx.zeros((B, L), mx.int32)
        iters = args.iters if B == 1 else max(2, args.iters // 10)
        times, outs = {"prepacked": [], "plain": []}, {}
        for r in range(args.rounds):
            for mode in ("prepacked", "plain") if r % 2 == 0 else ("plain", "prepacked"):
                fused_layer._run = run if mode == "prepacked" else plain
                try:
                    for _ in range(args.warmup):
                        outs[mode] = mean_pool(enc(ids, mask, types).last_hidden, mask)
                        mx.eval(outs[mode])
                    ts = []
                    for _ in range(iters):
                        t0 = time.perf_counter()
                        mx.eval(mean_pool(enc(ids, mask, types).last_hidden, mask))
                        ts.append((time.perf_counter() - t0) * 1e3)
                finally:
                    fused_layer._run = run
                times[mode].append(float(np.median(ts)))
        s = paired_speedup(times["plain"], times["prepacked"])
        diff = float(mx.max(mx.abs(outs["plain"] - outs["prepacked"])))
        print(f"B={B} L={L}: prepacked {np.median(times['prepacked']):.2f} ms, plain "
              f"{np.median(times['plain']):.2f} ms, plain/prepacked {s['speedup_median']:.3f}x "
              f"[{s['speedup_ci_low']:.3f}, {s['speedup_ci_high']:.3f}], max |diff| {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Low-rank ladder: measured encoder speed-up vs the cost model's ideal, side by side.

For each keep ratio the MiniLM encoder's 36 Linears are factorised (rank = ratio · mn/(m+n) per
layer; speed depends only on the ranks, so plain SVD is used: whitened factors have the same
shapes), then reference and variant are timed in strict alternation (``time_alternating``:
warm-up, ``--rounds`` A/B rounds, ``mx.eval`` inside the timed region) at B=1 (L = ``--seq-len``)
and B=32. Printed per row: p50 of both, the measured speed-up (median of per-round ratios),
the ideal speed-up from :func:`variants.families.lowrank.build.cost_model` at that exact shape (Linear
GEMMs + attention products), and realised / ideal.
"""

import argparse
import sys

import variants  # noqa: F401  (OpenBLAS before mlx)

import mlx.core as mx
import numpy as np

from variants.runtime import device
from variants.families.lowrank import build as lr
from variants.families.lowrank import family as lowrank_family
from variants.checkpoints.load import load_checkpoint
from variants.models import sentiment
from variants.runtime.timing import time_alternating

RULE = "=" * 6


def configure_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ratios", type=float, nargs="+", default=list(lowrank_family.DEFAULT_RATIOS),
                   help="keep ratios of each layer's parameters, in (0, 1]")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32], help="batch sizes")
    p.add_argument("--seq-len", type=int, default=32, help="tokens per text (no padding)")
    p.add_argument("--rounds", type=int, default=10, help="alternated timing rounds")
    p.add_argument("--budget-s", type=float, default=10.0, help="seconds per row at most")
    p.add_argument("--seed", type=int, default=0, help="seeds np.random and mx.random")
    return device.add_arguments(p)


def main(argv=None):
    args = configure_parser().parse_args(argv)
    device.from_args(args)
    np.random.seed(args.seed)
    mx.random.seed(args.seed)
    ck = load_checkpoint(dtype=device.mx_dtype())
    model = sentiment.build(ck)
    enc = model.module.encoder
    cfg_args = enc.args
    print(f"{RULE} low-rank ladder: measured vs ideal encoder speed-up {RULE}")
    print(f"{'ratio':>6} {'B':>3} {'L':>4} {'ref p50 ms':>11} {'var p50 ms':>11} "
          f"{'measured':>9} {'ideal':>7} {'realised/ideal':>15}")
    for ratio in args.ratios:
        try:
            cfg = lowrank_family.LowRankConfig(method="plain", ratio=ratio)
        except ValueError as e:
            print(f"bench/lowrank.py: error: {e}", file=sys.stderr)
            return 2
        var, info = lr.build(model, cfg)
        for b in args.batch_sizes:
            ids = mx.array(np.random.randint(1000, cfg_args.vocab_size, (b, args.seq_len)),
                           mx.int32)
            mask = mx.ones((b, args.seq_len), mx.int32)
            types = mx.zeros_like(ids)
            r = time_alternating(lambda: enc(ids, mask, types).last_hidden,
                                 lambda: var.module.encoder(ids, mask, types).last_hidden,
                                 warmup=1, rounds=args.rounds, budget_s=args.budget_s)
            ideal = lr.cost_model(info["layers"], seq_len=args.seq_len,
                                  hidden_size=cfg_args.hidden_size,
                                  n_layers=cfg_args.num_hidden_layers)["ideal_speedup"]
            s = r["speedup"]["speedup_median"]
            print(f"{ratio:6.2f} {b:3d} {args.seq_len:4d} {r['ref']['p50_ms']:11.2f} "
                  f"{r['var']['p50_ms']:11.2f} {s:8.2f}× {ideal:6.2f}× {s / ideal:15.2f}")
    print("ideal = encoder Linear GEMM + attention-product FLOPs, dense / factorised; "
          "embeddings, LayerNorm, GELU, softmax excluded.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

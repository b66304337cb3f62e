"""Output selection's saving: the full encoder + CLS head vs the last layer at the read
positions only, at L = 64, 128, 512 (no padding), timed in strict alternation.

Usage: .venv/bin/python bench/outsel.py [--lengths 64 128 512 --batch 8 --rounds 10]
       [--checkpoint tests/fixtures/hf/bert] [--marker 3]

Default model: the bundled MiniLM encoder (6 layers, D=384) with a BERT CLS head of seeded
random weights (the saving does not depend on the head's values); ``--checkpoint`` times a
local BERT classifier instead; ``--marker K`` reads K positions (a marker model) instead of
CLS. Prints per L: reference and output-selection medians (ms), the speed-up (median of
per-round ratios, :func:`variants.runtime.timing.time_alternating`, 95% CI), the cost model's ideal and
the largest |logit difference| (float round-off).

Cost model (per-token Linear work, BERT layer = 12 D² per token: q, k, v, o 4 D², FFN 8 D²):
skipping q, o and the FFN for L − P positions of the last of N layers saves
(10/12)·(1 − P/L)/N of it; the attention's L² term shrinks to P·L in that layer (not counted).
"""

import argparse

import variants  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.families.exact.outsel import OutputSelectNet
from variants.checkpoints.load import load_checkpoint
from variants.checkpoints.hf_heads import BertClassifier
from variants.models.classifier import ClassifierNet
from variants.models.marker import MarkerNet
from variants.runtime.timing import time_alternating


def ideal_speedup(n_layers, P, L):
    """1 / (1 − (10/12)(1 − P/L)/N): the cost model's ideal (Linear work only)."""
    return 1.0 / (1.0 - (10 / 12) * (1 - P / L) / n_layers)


def net_of(args):
    ck = load_checkpoint(args.checkpoint)
    if args.marker:
        net = MarkerNet(ck.encoder)
        mx.random.seed(0)
        net.scorer.weight = mx.random.normal(net.scorer.weight.shape) * 0.05
        return net, "marker"
    head = ck.classifier
    if head is None:
        d = ck.encoder.args.hidden_size
        mx.random.seed(0)
        head = BertClassifier(nn.Linear(d, d), nn.Linear(d, 3))
    return ClassifierNet(ck.encoder, head), "cls"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 512])
    p.add_argument("--batch", type=int, default=8, help="rows per call")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds per length")
    p.add_argument("--checkpoint", default=None, help="a local BERT classifier folder")
    p.add_argument("--marker", type=int, default=0, metavar="K",
                   help="read K marker positions instead of CLS")
    args = p.parse_args()
    net, reads = net_of(args)
    sel = OutputSelectNet(net, reads)
    n_layers = len(net.encoder.layers)
    vocab = net.encoder.args.vocab_size
    rng = np.random.default_rng(0)
    print(f"====== output selection ({reads}), B={args.batch}, {n_layers} layers ======")
    print(f"{'L':>5} {'ref ms':>9} {'outsel ms':>10} {'speed-up [95% CI]':>24} {'ideal':>7} "
          f"{'max |Δlogit|':>13}")
    for L in args.lengths:
        ids = rng.integers(1000, min(vocab, 20000), (args.batch, L)).astype(np.int32)
        ids[:, 0] = 101
        a = (mx.array(ids), mx.ones((args.batch, L), mx.int32), mx.zeros((args.batch, L), mx.int32))
        P = 1
        if reads == "marker":
            P = args.marker
            pos = np.sort(rng.choice(np.arange(1, L), (args.batch, P)), axis=1).astype(np.int32)
            a = a + (mx.array(pos),)
        diff = float(np.abs(np.array(net(*a)) - np.array(sel(*a))).max())
        r = time_alternating(lambda: net(*a), lambda: sel(*a), warmup=2, rounds=args.rounds,
                             budget_s=120)
        s = r["speedup"]
        print(f"{L:>5} {r['ref']['p50_ms']:>9.1f} {r['var']['p50_ms']:>10.1f} "
              f"{s['speedup_median']:>8.3f}× [{s['speedup_ci_low']:.3f}, {s['speedup_ci_high']:.3f}] "
              f"{ideal_speedup(n_layers, P, L):>6.3f}× {diff:>13.2e}")


if __name__ == "__main__":
    main()

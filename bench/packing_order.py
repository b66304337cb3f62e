"""Packed batches longest first vs in the batch's own order, side by side in one run.

For batches of real eval texts (random draws of 32, as the sweep times; and the length-sorted
batches of 32 that bench/torch_peer.py's end-to-end run uses) prints:

1. the attention core's positions sum over parts of B_p * L_p^2, longest first / own order
   (:func:`variants.runtime.packing.longest_first`; each part is padded to its own longest text);
2. the forward's time, longest first / own order, alternated round by round in one process
   (the order swapped every round), median and quartiles of the per-round ratios.

Run: ``python bench/packing_order.py [--rounds 12] [--random-batches 8]``.
"""

import argparse
import time

import variants  # noqa: F401  (preloads OpenBLAS before mlx)
import mlx.core as mx
import numpy as np

from variants.datasets import bundled as data
from variants.runtime import packing
from variants.checkpoints.load import load_checkpoint
from variants.arch.encoder import attention_bias, mean_pool


def _own_order(mask):
    return np.arange(np.asarray(mask).shape[0])


def attention_positions(mask, order):
    """sum over the stream parts of (sequences x part length^2) when packed in ``order``."""
    p = packing.plan(mask, attention_bias(mx.array(mask)),
                     packing.balanced_bounds(mask.sum(axis=1)[order], 2), order=order)
    return None if p is None else sum((q.seqs[1] - q.seqs[0]) * q.L ** 2 for q in p.parts)


def measure(rounds=12, n_random=8, n_texts=800, seed=0, warmup=2):
    """Returns {case: {"positions_ratio": [...], "time_ratios": [...]}} (longest first / own);
    ``warmup`` untimed runs of each order (alternated) come before the timed rounds."""
    ck = load_checkpoint()
    enc, tok = ck.encoder, ck.tokenizer
    texts = list(data.sample(data.split_frame(data.load_vader(), "eval"), n_texts,
                             seed=seed)["text"])
    rng = np.random.default_rng(seed)
    by_len = np.argsort([-len(t) for t in texts], kind="stable")
    cases = {f"random batches of 32 (x{n_random})":
             [rng.choice(len(texts), 32, replace=False) for _ in range(n_random)],
             f"length-sorted batches of 32 (x{len(texts) // 32})":
             [by_len[s:s + 32] for s in range(0, len(texts) - 31, 32)]}
    shipped = packing.longest_first
    out = {}
    try:
        for name, idx_lists in cases.items():
            batches = []
            for idx in idx_lists:
                encs, _ = tok.encode([texts[i] for i in idx])
                batches.append(tuple(mx.array(a) for a in tok.batch(encs)))
            pos = []
            for _, mask, _ in batches:
                m = np.array(mask)
                a, b = attention_positions(m, _own_order(m)), attention_positions(m, shipped(m))
                if a:
                    pos.append(b / a)

            def run(order_fn):
                packing.longest_first = order_fn
                mx.eval([mean_pool(enc(i, m, t).last_hidden, m) for i, m, t in batches])
            for fn in (shipped, _own_order) * warmup:  # warm-up, both orders
                run(fn)
            ratios = []
            for r in range(rounds):
                t = {}
                for key, fn in ((("new", shipped), ("old", _own_order)) if r % 2 == 0
                                else (("old", _own_order), ("new", shipped))):
                    t0 = time.perf_counter()
                    run(fn)
                    t[key] = time.perf_counter() - t0
                ratios.append(t["new"] / t["old"])
            out[name] = {"positions_ratio": pos, "time_ratios": ratios}
    finally:
        packing.longest_first = shipped
    return out


def main(rounds=12, n_random=8):
    res = measure(rounds, n_random)
    print("packed longest first / in the batch's own order (2 stream parts)")
    for name, r in res.items():
        pos, tr = np.array(r["positions_ratio"]), np.array(r["time_ratios"])
        print(f"  {name}: attention positions {np.median(pos):.2f}x "
              f"({pos.min():.2f}-{pos.max():.2f}); forward time {np.median(tr):.3f}x "
              f"[IQR {np.percentile(tr, 25):.3f}, {np.percentile(tr, 75):.3f}], {len(tr)} rounds")
    return res


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12, help="alternated rounds per case")
    p.add_argument("--random-batches", type=int, default=8,
                   help="random batches of 32 eval texts in the first case")
    a = p.parse_args()
    main(a.rounds, a.random_batches)

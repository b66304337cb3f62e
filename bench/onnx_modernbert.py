"""ONNX Runtime on the suite's ModernBERT ONNX graph (:mod:`variants.onnx.graph_modernbert`, fp32)
beside the MLX forward it was built from, strictly alternated, in one process.

Model: a ModernBERT parity fixture (default tests/fixtures/hf/modernbert: hidden 64, 6 layers,
window 128). Inputs: random ids, full mask, per (B, L). ORT: ``intra_op_num_threads`` = 2,
``ORT_ENABLE_ALL``, CPU execution provider, otherwise defaults. MLX: the encoder's default
forward (its compiled layer path where built; named in the output) and ``mx.eval``.

Per shape, ``--rounds`` rounds; each round times one block per engine (one untimed call, then
``--iters`` timed calls; the block's median), the order alternating per round. Ratio per round
MLX ms / ORT ms (> 1: ORT faster), summarised by :func:`metrics.latency.paired_speedup` (median
and 95% bootstrap CI). Run: ``PYTHONPATH=. python bench/onnx_modernbert.py [--batch 1 32]
[--seq 128 300] [--fixture modernbert]``.

Measured (AMD EPYC Zen 4, family 25 model 17, AVX-512 VNNI, 2 cores shared with other jobs:
runs started at load < 0.8; ORT 1.32, MLX 0.32.4, MLX on its compiled layers
``fused-mbert-layer-cpp``; ``--rounds 11 --iters 6`` and the default 15 x 10 agree),
MLX / ORT median ratio: B=1 L=128 1.65 [1.53, 1.76] (and 1.67), L=300 1.32 [0.97, 1.44] (1.32);
B=32 L=128 0.73 [0.52, 0.78] (0.79), L=300 0.55 [0.51, 0.57] (0.52). ORT leads at B=1, MLX at
B=32, where this fixture's attention (head_dim 16, 4 heads) outweighs its Linears. Under load
(other jobs on the 2 cores) ORT loses far more than MLX (B=32 L=300 0.36): time it quiet.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import variants  # noqa: E402,F401  (OpenBLAS before MLX)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from metrics.latency import paired_speedup  # noqa: E402
from variants.arch.modernbert import compiled_paths  # noqa: E402
from variants.checkpoints.load import load_checkpoint  # noqa: E402
from variants.onnx.graph_modernbert import encoder_graph  # noqa: E402


def _block(fn, iters):
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(times))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fixture", default="modernbert")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--seq", type=int, nargs="+", default=[128, 300])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    ck = load_checkpoint(os.path.join(HERE, "..", "tests", "fixtures", "hf", a.fixture))
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(encoder_graph(ck.encoder).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    print(f"ORT {ort.__version__}, MLX {mx.__version__}, MLX path: "
          f"{compiled_paths(ck.encoder) or 'mlx-ops'}, fixture {a.fixture}")
    rng = np.random.default_rng(0)
    for B in a.batch:
        for L in a.seq:
            ids = rng.integers(5, ck.args.vocab_size, (B, L))
            mask = np.ones((B, L), np.int64)
            feed = {"input_ids": ids, "attention_mask": mask}
            mi, mm = mx.array(ids.astype(np.int32)), mx.array(mask.astype(np.int32))

            def run_mlx():
                mx.eval(ck.encoder(mi, mm).last_hidden)

            def run_ort():
                sess.run(None, feed)

            t_mlx, t_ort = [], []
            for r in range(a.rounds):
                order = [(run_mlx, t_mlx), (run_ort, t_ort)]
                for fn, sink in (order if r % 2 == 0 else order[::-1]):
                    sink.append(_block(fn, a.iters))
            s = paired_speedup(t_mlx, t_ort)
            print(f"B={B:3d} L={L:4d}  MLX {np.median(t_mlx):8.2f} ms  "
                  f"ORT {np.median(t_ort):8.2f} ms"
                  f"  MLX/ORT median {s['speedup_median']:.2f} "
                  f"[{s['speedup_ci_low']:.2f}, {s['speedup_ci_high']:.2f}]  "
                  f"ORT faster in {s['variant_wins']}/{s['n_rounds']}")


if __name__ == "__main__":
    main()

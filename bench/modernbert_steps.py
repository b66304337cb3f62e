"""What each step of ModernBERT's fast CPU path (variants/arch/modernbert_fast.py) gives, in one run.

Steps (each adds to the previous; all in one process, alternated round by round with the order
rotating, so machine load hits every step alike; per-round ratios against step 0):

0. the plain path as before (``ModernBertEncoder.fast = False``), OpenBLAS at its own thread
   count and MLX's default buffer cache: what a process that never ran MiniLM got;
1. the plain path with the stream settings (one OpenBLAS thread per call, MLX's buffer cache
   raised to 1 GB: :func:`variants.runtime.parallel.streams`);
2. the fast layers on one stream (transposed fused weights, scale folded, GeGLU halves
   contiguous, transposed scores with the compiled exp, rotary tables kept, no window bias
   when the window covers every key);
3. + the work over two streams (B >= 2 by sequences, B = 1 by heads and MLP features);
4. + rotary q and k in one compiled kernel from the fused projection (``rope_qk``);
5. + the windowed blocks' scores transposed with the compiled exp (``windowed_core``; only
   from L >= 2 · window, 256 at base shapes): the MLX fast path;
6. + each layer as one compiled op (:mod:`variants.arch.modernbert_fused`; steps 0-5 run with
   ``VARIANTS_FUSED_LAYER=off``): shipped where the extension is built.

Model: random-init ModernBERT at ModernBERT-base's shapes (bench/peer_workers.py
``make_modernbert``; needs torch + transformers in ``--peer-python``), or ``--model`` a saved one.
Every step's pooled embedding is checked against step 0's (max |diff| printed).
Run: ``python bench/modernbert_steps.py [--model DIR] [--shapes 1x24 1x128 8x128] [--rounds 7]``.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import variants  # noqa: E402,F401  (preloads OpenBLAS before mlx)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from variants.arch import modernbert_fast
from variants.runtime import parallel  # noqa: E402
from variants.arch.encoder import mean_pool  # noqa: E402

STEPS = ("0 plain, BLAS default threads, default cache", "1 plain, 1 BLAS thread, 1 GB cache",
         "2 fast layers, one stream", "3 + two streams", "4 + compiled rotary",
         "5 + fast windowed blocks", "6 + one compiled op per layer (shipped)")


class _OneStream:
    """Stands in for :mod:`variants.runtime.parallel` inside modernbert_fast: one stream."""

    MIN_ROWS = parallel.MIN_ROWS
    bounds = staticmethod(parallel.bounds)

    @staticmethod
    def streams():
        return parallel.streams()[:1]


@contextlib.contextmanager
def step(i, enc, blas_default, cache_default):
    ss = parallel.streams()
    if i == 0:
        parallel._set_blas_threads(blas_default)
        mx.set_cache_limit(cache_default)
    enc.fast = i >= 2
    if i == 2:
        modernbert_fast.parallel = _OneStream
    modernbert_fast.COMPILED_ROPE = i >= 4
    modernbert_fast.FAST_WINDOW = i >= 5
    switch = os.environ.get("VARIANTS_FUSED_LAYER")
    if i < 6:
        os.environ["VARIANTS_FUSED_LAYER"] = "off"
    try:
        yield
    finally:
        if switch is None:
            os.environ.pop("VARIANTS_FUSED_LAYER", None)
        else:
            os.environ["VARIANTS_FUSED_LAYER"] = switch
        modernbert_fast.parallel = parallel
        modernbert_fast.COMPILED_ROPE = modernbert_fast.FAST_WINDOW = True
        enc.fast = True
        if len(ss) > 1:
            parallel._set_blas_threads(1)
        mx.set_cache_limit(max(cache_default, parallel.CACHE_LIMIT_BYTES))


def run(enc, shapes, rounds, iters, block_s):
    import ctypes

    from variants.runtime import blas as _blas
    lib = ctypes.CDLL(_blas.BLAS_INFO["library"]) if _blas.BLAS_INFO.get("library") else None
    blas_default = lib.openblas_get_num_threads() if lib is not None else None
    cache_default = mx.set_cache_limit(0)
    mx.set_cache_limit(cache_default)
    parallel.streams()
    for B, L in shapes:
        vocab = enc.args.vocab_size  # ids past the table would read out of bounds
        ids = mx.array(np.random.default_rng(0).integers(min(1000, vocab // 2), min(30000, vocab),
                                                         (B, L)).astype(np.int32))
        mask = mx.ones((B, L), mx.int32)

        def fwd():
            return mean_pool(enc(ids, mask).last_hidden, mask)
        ref = None
        ms = {i: [] for i in range(len(STEPS))}
        diffs = {}
        for r in range(rounds):
            order = list(range(len(STEPS)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                with step(i, enc, blas_default, cache_default):
                    y = fwd()
                    mx.eval(y)
                    if i == 0 and ref is None:
                        ref = np.array(y)
                    if ref is not None:
                        diffs[i] = max(diffs.get(i, 0.0), float(np.abs(np.array(y) - ref).max()))
                    ts, t_start = [], time.perf_counter()
                    while len(ts) < iters and (not ts or time.perf_counter() - t_start < block_s):
                        t0 = time.perf_counter()
                        mx.eval(fwd())
                        ts.append((time.perf_counter() - t0) * 1e3)
                    ms[i].append(float(np.median(ts)))
        print(f"\nB={B} L={L} ({rounds} alternated rounds; ratio = step 0 time / step time per "
              f"round, median [min, max])")
        for i, name in enumerate(STEPS):
            rat = np.array(ms[0]) / np.array(ms[i])
            print(f"  {name:<45} {np.median(ms[i]):8.1f} ms  x{np.median(rat):.2f} "
                  f"[{rat.min():.2f}, {rat.max():.2f}]  max|diff| {diffs.get(i, 0.0):.1e}",
                  flush=True)


def shape(text):
    """``"BxL"`` -> (B, L) ints >= 1 (argparse type: a bad value is one line, exit 2)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"shape {text!r} is not BxL (e.g. 1x24)")
    return int(parts[0]), int(parts[1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a saved ModernBERT folder (default: build one)")
    p.add_argument("--layers", type=int, default=3, help="layers of the built model")
    p.add_argument("--shapes", nargs="+", type=shape,
                   default=[(1, 24), (1, 128), (1, 512), (8, 24), (8, 128)], help="BxL shapes")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=5, help="timed calls per block at most")
    p.add_argument("--block-s", type=float, default=0.3)
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", sys.executable))
    args = p.parse_args(argv)
    shapes = args.shapes
    from variants.checkpoints.load import load_checkpoint
    with tempfile.TemporaryDirectory(prefix="mbsteps-") as tmp:
        path = args.model
        if path is None:
            path = os.path.join(tmp, "modernbert")
            subprocess.run([args.peer_python, os.path.join(HERE, "peer_workers.py"), "build",
                            json.dumps({"path": path, "layers": args.layers})], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        enc = load_checkpoint(path).encoder
        run(enc, shapes, args.rounds, args.iters, args.block_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())

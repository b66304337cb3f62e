"""MLX vs NumPy fp32 GEMM speed on the shapes MiniLM runs: is MLX's CPU BLAS path fast enough?

Each shape is timed side by side in one run: a warm-up, then ``--trials`` per library in
alternating *blocks* (ABBA order: MLX, NumPy, NumPy, MLX, ...; ``mx.eval`` inside MLX's timed
region), and the medians are compared. Blocks, not single trials, alternate because MLX and
NumPy each load their own OpenBLAS thread pool: switching library every call makes one pool's
spinning workers slow the other's next call several-fold on 2 cores (measured: NumPy's M=32
GEMM went from 0.56 ms to 16 ms right after an MLX call). Each block starts with an untimed call. The
ratio is MLX speed / NumPy speed (NumPy median time / MLX median time); the target is >= 0.8.
Absolute GFLOP/s on a shared machine are noisy; the ratio, measured in alternation, is what
to read.

Run ``VARIANTS_BLAS=none python bench/blas_gemm.py --trials 3`` to see MLX's own reference
BLAS for comparison (expect ratios near 0.01-0.02).
"""

import argparse
import os
import platform
import statistics
import sys
import time

import variants  # must come before `import mlx`: it preloads OpenBLAS (variants/runtime/blas.py)

import mlx.core as mx
import numpy as np

from runs.io import write_json

# (label, M, K, N): A (M, K) @ B (K, N). MiniLM: hidden 384, FFN 1536; B=32 x L=128 -> M=4096.
SHAPES = (
    ("qkv/out proj  B32 L128", 4096, 384, 384),
    ("FFN up        B32 L128", 4096, 384, 1536),
    ("FFN down      B32 L128", 4096, 1536, 384),
    ("_blas.py ref  128x768x3072", 128, 768, 3072),
    ("FFN up        B1  L32", 32, 384, 1536),
)
TARGET_RATIO = 0.8  # MLX speed / NumPy speed
BLAS_ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                 "OMP_NUM_THREADS", "VARIANTS_BLAS")
RULE = "=" * 6


def _numpy_blas():
    """Lines describing the BLAS libraries loaded in the process (threadpoolctl if present)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    if threadpool_info is not None:
        return [f"{d.get('internal_api')} {d.get('version')} arch={d.get('architecture')} "
                f"threads={d.get('num_threads')}  {d.get('filepath')}"
                for d in threadpool_info() if d.get("user_api") == "blas"]
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return [f"numpy build: {blas.get('name')} {blas.get('version')} (install threadpoolctl "
                "for the libraries actually loaded)"]
    except Exception:  # older NumPy: no dict mode
        return ["numpy BLAS: unknown (install threadpoolctl)"]


def _time_mlx(a, b):
    t0 = time.perf_counter()
    mx.eval(a @ b)
    return time.perf_counter() - t0


def _time_numpy(a, b):
    t0 = time.perf_counter()
    a @ b
    return time.perf_counter() - t0


def bench_shape(m, k, n, *, trials, warmup, rng, block=7):
    """Time ``(m, k) @ (k, n)`` fp32 in MLX and NumPy, in alternating ABBA blocks of trials.

    Returns
    -------
    result : dict
        ``mlx_ms`` / ``numpy_ms`` (median), ``mlx_gflops`` / ``numpy_gflops`` (at the median),
        ``ratio`` (MLX speed / NumPy speed), per-trial times in ``mlx_trials_ms`` /
        ``numpy_trials_ms``, and ``max_rel_diff`` between the two products.
    """
    a_np = rng.standard_normal((m, k), dtype=np.float32)
    b_np = rng.standard_normal((k, n), dtype=np.float32)
    a_mx, b_mx = mx.array(a_np), mx.array(b_np)
    mx.eval(a_mx, b_mx)
    c_mx, c_np = np.array(a_mx @ b_mx), a_np @ b_np
    rel = float(np.max(np.abs(c_mx - c_np)) / np.max(np.abs(c_np)))
    for _ in range(warmup):
        _time_mlx(a_mx, b_mx)
        _time_numpy(a_np, b_np)
    t_mlx, t_np = [], []
    runs = {"mlx": (_time_mlx, a_mx, b_mx, t_mlx), "numpy": (_time_numpy, a_np, b_np, t_np)}
    order = ("mlx", "numpy", "numpy", "mlx")
    i = 0
    while len(t_mlx) < trials or len(t_np) < trials:
        fn, a, b, out = runs[order[i % 4]]
        i += 1
        fn(a, b)  # untimed: lets the other library's pool go idle, re-warms this one
        for _ in range(min(block, trials - len(out))):
            out.append(fn(a, b))
    flop = 2.0 * m * k * n
    med_mlx, med_np = statistics.median(t_mlx), statistics.median(t_np)
    return {
        "M": m, "K": k, "N": n,
        "mlx_ms": 1e3 * med_mlx, "numpy_ms": 1e3 * med_np,
        "mlx_gflops": flop / med_mlx / 1e9, "numpy_gflops": flop / med_np / 1e9,
        "ratio": med_np / med_mlx,
        "mlx_trials_ms": [1e3 * t for t in t_mlx], "numpy_trials_ms": [1e3 * t for t in t_np],
        "max_rel_diff": rel,
    }


def blas_gemm(*, trials=21, warmup=3, json=None, seed=0, no_openblas=False):
    """Run the benchmark, print the report, optionally write ``json``; returns the results."""
    if no_openblas:
        print("--no-openblas is a hint, not a switch: OpenBLAS is preloaded at `import variants`,\n"
              "before arguments are parsed. Run\n"
              "    VARIANTS_BLAS=none python bench/blas_gemm.py --trials 3\n"
              "to time MLX's reference BLAS (about 70x slower, hence fewer trials).")
        return None
    if trials < 1 or warmup < 0:
        raise ValueError(f"trials must be >= 1 and warmup >= 0, got trials={trials}, "
                         f"warmup={warmup}")
    rng = np.random.default_rng(seed)
    mx.random.seed(seed)
    env = {v: os.environ[v] for v in BLAS_ENV_VARS if v in os.environ}
    numpy_blas = _numpy_blas()

    print(f"{RULE} BLAS in use {RULE}")
    print(f"{'variants.BLAS_INFO':<20}: {variants.BLAS_INFO['status']}"
          + (f" ({variants.BLAS_INFO['library']})" if variants.BLAS_INFO["library"] else ""))
    for line in numpy_blas:
        print(f"{'loaded BLAS':<20}: {line}")
    for k, v in env.items():
        print(f"{k:<20}: {v}")
    print(f"{'versions':<20}: mlx {mx.__version__}, numpy {np.__version__}, "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs ({platform.machine()})")
    print(f"{'trials':<20}: {trials} per library in alternating ABBA blocks of 7, after {warmup} warm-up, median")

    results = []
    print(f"\n{RULE} fp32 GEMM: A (M,K) @ B (K,N) {RULE}")
    head = (f"{'shape':<27} {'M':>5} {'K':>5} {'N':>5}  {'MLX ms':>9} {'NumPy ms':>9}  "
            f"{'MLX GF/s':>8} {'NumPy GF/s':>10}  {'ratio':>6}  ok")
    print(head)
    print("-" * len(head))
    for label, m, k, n in SHAPES:
        r = bench_shape(m, k, n, trials=trials, warmup=warmup, rng=rng)
        r["shape"] = " ".join(label.split())
        r["ok"] = r["ratio"] >= TARGET_RATIO
        results.append(r)
        print(f"{label:<27} {m:>5} {k:>5} {n:>5}  {r['mlx_ms']:>9.3f} {r['numpy_ms']:>9.3f}  "
              f"{r['mlx_gflops']:>8.1f} {r['numpy_gflops']:>10.1f}  {r['ratio']:>6.3f}  "
              f"{'yes' if r['ok'] else 'NO'}")
        sys.stdout.flush()

    ratios = np.array([r["ratio"] for r in results])
    geo = float(np.exp(np.mean(np.log(ratios))))
    worst = results[int(np.argmin(ratios))]
    print(f"\n{RULE} summary {RULE}")
    print(f"{'ratio geo-mean':<20}: {geo:.3f}")
    print(f"{'ratio min':<20}: {worst['ratio']:.3f} ({worst['shape']})")
    print(f"{'max rel diff':<20}: {max(r['max_rel_diff'] for r in results):.2e} "
          "(MLX vs NumPy product, sanity check)")
    n_ok = sum(r["ok"] for r in results)
    verdict = "PASS" if n_ok == len(results) else "FAIL"
    print(f"{'verdict':<20}: {verdict}: {n_ok}/{len(results)} shapes reach MLX/NumPy speed "
          f">= {TARGET_RATIO}")
    if len(numpy_blas) > 1 and any("threads=1 " not in line for line in numpy_blas):
        print(f"{'note':<20}: two OpenBLAS thread pools are loaded (MLX's and NumPy's); blocks "
              "of trials\n"
              f"{'':<22}alternate so that neither pool's spinning workers slow the other's "
              "calls.")
    if variants.BLAS_INFO["library"] is None:
        print(f"{'note':<20}: MLX runs its reference BLAS here ({variants.BLAS_INFO['status']})")

    out = {"blas_info": dict(variants.BLAS_INFO), "numpy_blas": numpy_blas, "env": env,
           "mlx_version": mx.__version__, "numpy_version": np.__version__,
           "trials": trials, "warmup": warmup, "target_ratio": TARGET_RATIO,
           "ratio_geomean": geo, "verdict": verdict, "shapes": results}
    if json:
        write_json(json, out)
        print(f"{'json':<20}: {json}")
    return out


def configure_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=21,
                        help="timed trials per library and shape (median reported)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed warm-up runs per library and shape")
    parser.add_argument("--json", type=str, default=None,
                        help="write the results to this JSON file (atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random matrices")
    parser.add_argument("--no-openblas", action="store_true", default=False,
                        help="print how to benchmark MLX's reference BLAS (VARIANTS_BLAS=none) "
                             "and exit")
    return parser


def main():
    args = configure_parser().parse_args()
    blas_gemm(**vars(args))


if __name__ == "__main__":
    main()

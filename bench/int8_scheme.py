"""What exact int8 costs on this CPU: the integer GEMM as the W8A8 ops run it against one oneDNN
GEMM and against fp32, at MiniLM's Linear shapes, alternated in one process.

On a CPU without VNNI (AVX2, or AVX-512 without VNNI; ``ONEDNN_MAX_CPU_ISA=AVX2`` makes a newer
one run those kernels) oneDNN's u8 x s8 kernels sum pairs of products in saturating 16-bit
lanes, so the W8A8 ops split the uint8 codes into two 7-bit halves and run two GEMMs
(``qkernel.int8_scheme() == "u8s8-split7"``; see ``variants/runtime/qkernel/int8_prepack.h``).
Three engines per shape, each round in a rotated order, the median of per-round ratios with a
95% percentile-bootstrap CI over rounds:

- ``ours``: ``qkernel.int8_gemm`` (the scheme the W8A8 ops run here; exact);
- ``one``: ``int8_gemm(..., one_gemm=True)``, one oneDNN GEMM, on codes in [0, 127] so it is exact
  too: the speed a 7-bit-activation scheme would get (ONNX Runtime's ``reduce_range`` family of
  fixes), which changes the model on these CPUs only;
- ``fp32``: ``mx.matmul`` of float32 (OpenBLAS where the package loaded it).

Run: ``python bench/int8_scheme.py --rounds 15`` (add ``ONEDNN_MAX_CPU_ISA=AVX2`` in front for the
non-VNNI kernels). Prints one line per shape; ``--json F`` writes them.
"""

import argparse
import json
import sys
import time

import variants  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
import numpy as np

from metrics.latency import paired_speedup
from variants.runtime import qkernel

#: (rows M, in K, out N): MiniLM's q|k|v, intermediate and output GEMMs at B=1 L=24 and a
#: B=32 L=128 half (two MLX streams split the rows)
SHAPES = [(24, 384, 1152), (24, 384, 1536), (24, 1536, 384),
          (2048, 384, 1152), (2048, 384, 1536), (2048, 1536, 384)]


def _time(fn, iters):
    mx.eval(fn())
    t0 = time.perf_counter()
    for _ in range(iters):
        mx.eval(fn())
    return (time.perf_counter() - t0) / iters * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15, help="alternated rounds per shape")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    k = qkernel.load()
    if k is None or not k.has_dnnl() or not hasattr(k, "int8_scheme"):
        print("int8_scheme: the compiled int8 GEMM is not available here (apt-get install "
              "libdnnl-dev, python -m variants.runtime.qkernel --force)", file=sys.stderr)
        return 2
    print(f"oneDNN ISA {k.int8_cpu_isa()}, scheme {k.int8_scheme()}, "
          f"prepacked impl {k.int8_prepack_impl(24, 384, 384)!r}")
    rng = np.random.default_rng(0)
    rows = []
    for m, kk, n in SHAPES:
        a8 = mx.array(rng.integers(0, 256, (m, kk), dtype=np.uint8))
        a7 = mx.array(rng.integers(0, 128, (m, kk), dtype=np.uint8))
        w = mx.array(rng.integers(-127, 128, (n, kk), dtype=np.int8))
        blob = k.int8_prepack(w)
        xf = mx.array(rng.standard_normal((m, kk)).astype(np.float32))
        wf = mx.array(rng.standard_normal((n, kk)).astype(np.float32))
        engines = {"ours": lambda: k.int8_gemm(a8, w, blob),
                   "one": lambda: k.int8_gemm(a7, w, blob, one_gemm=True),
                   "fp32": lambda: xf @ wf.T}
        iters = 20 if m < 512 else 3
        times = {e: [] for e in engines}
        order = list(engines)
        for r in range(args.rounds):
            for e in order[r % 3:] + order[:r % 3]:
                times[e].append(_time(engines[e], iters))
        res = {"m": m, "k": kk, "n": n, **{f"{e}_ms": float(np.median(t)) for e, t in times.items()}}
        for num, den in (("one", "ours"), ("fp32", "ours")):
            s = paired_speedup(times[num], times[den])
            res[f"{den}_vs_{num}"] = [s["speedup_median"], s["speedup_ci_low"], s["speedup_ci_high"]]
        rows.append(res)
        print(f"M={m} K={kk} N={n}: ours {res['ours_ms']:.3f} ms, one GEMM {res['one_ms']:.3f} ms, "
              f"fp32 {res['fp32_ms']:.3f} ms; ours/one {res['ours_vs_one'][0]:.2f}x "
              f"[{res['ours_vs_one'][1]:.2f}, {res['ours_vs_one'][2]:.2f}] (speed), "
              f"ours/fp32 {res['ours_vs_fp32'][0]:.2f}x [{res['ours_vs_fp32'][1]:.2f}, "
              f"{res['ours_vs_fp32'][2]:.2f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"isa": k.int8_cpu_isa(), "scheme": k.int8_scheme(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

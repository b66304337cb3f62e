"""Our MLX forward beside PyTorch and ONNX Runtime (fp32 and dynamic int8) on CPU, one run.

Engines (each framework in its own worker process, bench/peer_workers.py; 2 intra-op threads):
``mlx`` our fp32 reference, ``q8`` / ``q4`` our native quantized encoders (g64,
``quantize_module(..., mode="native")``: weights stay packed, dequantized per call), ``w8a8``
our W8A8 encoder (every layer Linear a native ``Int8Linear``, no SmoothQuant: oneDNN's integer
GEMMs; BERT layers as one compiled op each, ``fused-int8layer-cpp``, ModernBERT layers
``fused-mbert-int8layer-cpp``), ``torch``
PyTorch + transformers fp32, ``ort32`` ONNX Runtime fp32 (``torch.onnx.export``, dynamic batch and
sequence axes), ``ort8`` ONNX Runtime ``quantize_dynamic`` (int8 weights and activations, integer
GEMMs). Models: MiniLM (the bundled all-MiniLM-L6-v2) and ModernBERT random-init at
ModernBERT-base's shapes (hidden 768, 12 heads, intermediate 1152, window 128, global every 3rd;
``--mb-layers`` layers, default 3 = 1 global + 2 local, ModernBERT-base's 1:2 mix; its 22 do not
fit 10 minutes on 2 cores: 6 layers cost ~3x MiniLM's per token), built seeded in transformers,
saved with ``save_pretrained`` and loaded by ``variants.checkpoints.load.load_checkpoint`` so every
engine runs the same weights. Each computes the mean-pooled, L2-normalised embedding of random ids
with a full mask.

Per shape (B, L), ``--rounds`` rounds; in each round every engine runs one block (an untimed call,
skipped once the shape's calls take >= 0.5 s; then up to ``--iters`` timed calls within
``--block-s`` seconds; its median), in an order that rotates per round. Ratios are per round (time
of one / time of the other, same round) and summarised by their median and a 95%
percentile-bootstrap CI (:func:`ratio`); the machine is shared, so read ratios, not absolute
milliseconds. Then the B=1 analysis: time vs number of layers and vs L at B=1 (intercept = fixed
per-call cost, slope = per layer / per token), the graph evaluations per forward and the segment
profile (variants/sweep/profile.py).

Measured here (2 shared cores, MLX 0.32.4, ORT 1.32, torch 2.13, passive pools; default run: MiniLM
282 s at load 2.5-4, ModernBERT 3 layers 284 s at load ~5), MLX/ORT fp32 per-round median: MiniLM
B=1 L=24 / 128 / 512 0.56 / 0.73 / 0.85, B=8 0.76 / 0.92 / 0.93, B=32 L=24 / 128 1.01 / 0.96;
ORT int8 1.26-1.54x its fp32 everywhere, our q8 0.55-1.02x our fp32. B=1 L=24: 3.29 ms per layer
(MLX) vs 1.57 (ORT), intercepts under 1 ms for both: the gap is per layer, not per call (B*L
below ``parallel.MIN_ROWS`` runs on one stream with 1-thread OpenBLAS: one core).
Our W8A8 (``--engines mlx ort32 ort8 w8a8``, B=1/32 x L=24/128, 9 rounds, load 10-12): 2.27x
[1.17, 2.78] our fp32 at B=1 L=24 and 2.91x [2.68, 3.34] at B=32 L=128; 0.72x [0.40, 0.82] and
1.49x [1.31, 1.65] ORT int8's speed. Against the fp32 build with vectorized GELU / exp loops
(``-fno-trapping-math``; load 5-7): 1.97x [1.72, 2.68] and 2.46x [2.36, 2.61]; 0.72x
[0.40, 0.77] and 1.50x [1.47, 1.65] ORT int8's. ModernBERT (3 layers, ``--batch 1 32``, its
layers compiled, load 7-9): 2.86x [2.67, 2.91] our fp32 and 1.44x [1.35, 1.47] ORT int8's at
B=32 L=128, 2.36x [1.51, 5.14] and 0.67x [0.30, 1.73] at B=1 L=24 (docs/w8a8.md).

Needs the ``bench`` extra (torch, transformers, onnx, onnxruntime) in ``--peer-python``'s
environment (default: this interpreter); the package's own interpreter runs the MLX worker.
Run: ``python bench/peers.py [--arch minilm modernbert] [--batch 1 8 32] [--seq 24 128 512]``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from metrics.latency import paired_speedup  # noqa: E402

RULE = "=" * 6
ENGINES = ("mlx", "torch", "ort32", "ort8", "q8", "q4", "w8a8")
WORKER_OF = {"mlx": "mlx", "q8": "mlx", "q4": "mlx", "w8a8": "mlx", "torch": "torch",
             "ort32": "ort", "ort8": "ort"}
#: (numerator, denominator, label): ratio = time(denominator) / time(numerator) per round, so
#: > 1 means the numerator engine is faster.
RATIOS = (("mlx", "torch", "MLX/PyTorch"), ("mlx", "ort32", "MLX/ORT fp32"),
          ("ort8", "ort32", "ORT int8 speed-up"), ("q8", "mlx", "our q8 speed-up"),
          ("q4", "mlx", "our q4 speed-up"), ("w8a8", "mlx", "our W8A8 speed-up"),
          ("w8a8", "ort8", "W8A8/ORT int8"))
MAX_LEN = {"minilm": 512, "modernbert": 8192}
BATCHES = {"minilm": (1, 8, 32), "modernbert": (1, 8)}


def ratio(num_ms, den_ms, *, n_boot=2000, seed=0):
    """Per-round speed ratio of engine ``num`` over ``den``: median of ``den_ms[i] / num_ms[i]``
    (> 1: ``num`` faster) with its 95% percentile-bootstrap CI over rounds
    (:func:`metrics.latency.paired_speedup`; Efron & Tibshirani 1993, ch. 13).

    ``num_ms``, ``den_ms``: array-like (n_rounds,) of ms > 0, paired by round.
    Returns (median, ci_low, ci_high) floats. Raises ValueError on unpaired or non-positive times.
    """
    sp = paired_speedup(den_ms, num_ms, n_boot=n_boot, seed=seed)
    return sp["speedup_median"], sp["speedup_ci_low"], sp["speedup_ci_high"]


def tokens_per_s(B, L, ms):
    """Tokens per second of a (B, L) forward taking ``ms`` milliseconds."""
    return B * L / (ms * 1e-3)


def shape_plan(archs, batches, seqs, max_tokens):
    """[(arch, B, L)] to time: the batch sizes ``batches`` names (None: each arch's own,
    :data:`BATCHES`: MiniLM 1/8/32, ModernBERT 1/8), every L of ``seqs`` within the arch's
    positions (MiniLM 512), dropping shapes with B*L > ``max_tokens`` (0: no cap)."""
    return [(a, B, L) for a in archs for B in (BATCHES[a] if batches is None else batches)
            for L in seqs if L <= MAX_LEN[a] and (not max_tokens or B * L <= max_tokens)]


def line_fit(x, y):
    """Least-squares line y = a + b x; returns (a, b)."""
    b, a = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(a), float(b)


class Worker:
    """A worker process of bench/peer_workers.py answering JSON requests."""

    def __init__(self, python, kind, env=None, **kw):
        self.kind = kind
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."), **(env or {}))
        self.p = subprocess.Popen([python, os.path.join(HERE, "peer_workers.py"), kind,
                                   json.dumps(kw)], text=True, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=env)
        if self.p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{kind} worker failed to start (see its stderr above)")

    def __call__(self, op, **kw):
        self.p.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.kind} worker died during {op} (see its stderr above)")
        return json.loads(line)

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def measure(workers, engines, B, L, rounds, iters, block_s):
    """{engine: [median ms per round]} over alternated rounds (the order rotates each round)."""
    ms = {e: [] for e in engines}
    for r in range(rounds):
        for e in engines[r % len(engines):] + engines[:r % len(engines)]:
            ms[e].append(float(np.median(workers[WORKER_OF[e]](
                "time", engine=e, B=B, L=L, iters=iters, block_s=block_s))))
    return ms


def print_rows(arch, rows, engines):
    labels = {"mlx": "MLX", "torch": "PyTorch", "ort32": "ORT fp32", "ort8": "ORT int8",
              "q8": "our q8", "q4": "our q4", "w8a8": "our W8A8"}
    print(f"\n{RULE} {arch}: tokens/s (median of per-round block medians) {RULE}")
    print(f"  {'B':>3} {'L':>4} " + "".join(f"{labels[e]:>10}" for e in engines))
    for (B, L), ms in rows.items():
        print(f"  {B:>3} {L:>4} " + "".join(f"{tokens_per_s(B, L, np.median(ms[e])):10.0f}"
                                           for e in engines))
    pairs = [p for p in RATIOS if p[0] in engines and p[1] in engines]
    print(f"  ratios (median per-round, [95% CI]; > 1: the first engine faster)")
    print(f"  {'B':>3} {'L':>4} " + "".join(f"{lab:>24}" for _, _, lab in pairs))
    for (B, L), ms in rows.items():
        cells = []
        for a, b, _ in pairs:
            m, lo, hi = ratio(ms[a], ms[b])
            cells.append(f"{m:.2f} [{lo:.2f}, {hi:.2f}]")
        print(f"  {B:>3} {L:>4} " + "".join(f"{c:>24}" for c in cells))


def b1_analysis(arch, workers, rows, n_layers, args):
    """Fixed vs per-layer vs per-token cost at B=1, MLX against ORT fp32."""
    print(f"\n{RULE} {arch}: where B=1 time goes (MLX vs ORT fp32) {RULE}")
    seqs = sorted(L for (B, L) in rows if B == 1)
    if len(seqs) >= 2:
        print("  time vs L at B=1: t = a + b L (least squares over L = "
              f"{', '.join(map(str, seqs))})")
        for e in ("mlx", "ort32"):
            if e in rows[(1, seqs[0])]:
                a, b = line_fit(seqs, [np.median(rows[(1, L)][e]) for L in seqs])
                print(f"    {e:<6} a = {a:7.2f} ms fixed   b = {b * 1e3:7.2f} us/token")
    counts = sorted({1, max(1, n_layers // 2), n_layers})
    L = seqs[0] if seqs else 24
    per = {}
    for r in range(args.rounds_layers):
        for e in (("mlx", "ort32") if r % 2 == 0 else ("ort32", "mlx")):
            res = workers[WORKER_OF[e]]("layers", engine=e, B=1, L=L, counts=counts,
                                        iters=args.iters, block_s=args.block_s)
            per.setdefault(e, []).append([res[str(k)] for k in counts])
    print(f"  time vs layers at B=1 L={L}: t = a + b k over k = {counts} "
          f"(median of {args.rounds_layers} alternated rounds)")
    for e, runs in per.items():
        t = np.median(np.array(runs), axis=0)
        a, b = line_fit(counts, t)
        print(f"    {e:<6} " + "  ".join(f"k={k}: {v:6.2f} ms" for k, v in zip(counts, t))
              + f"   -> a = {a:6.2f} ms outside the layers, b = {b:6.2f} ms per layer")
    ev = workers["mlx"]("evals", B=1, L=L)
    print(f"  MLX graph evaluations per forward at B=1 L={L}: {ev['evals']} "
          f"(compiled calls {ev['compiled_calls']})")
    if arch == "minilm" and args.profile_rounds:
        prof = workers["mlx"]("profile", n_texts=1, rounds=args.profile_rounds)
        seg = prof["segments_ms"]
        print(f"  segment profile, one eval text (B=1, L={prof['seq_len']}), reference forward, "
              f"whole {prof['total_ms']:.2f} ms:")
        print("    " + "  ".join(f"{s} {v:.2f}" for s, v in seg.items() if v > 0.005)
              + f"  unattributed {prof['unattributed_ms']:.2f}")


def configure_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", nargs="+", choices=("minilm", "modernbert"),
                   default=["minilm", "modernbert"], help="models to time")
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="batch sizes for every arch (default: each arch's own, MiniLM 1/8/32, "
                        "ModernBERT 1/8)")
    p.add_argument("--seq", type=int, nargs="+", default=[24, 128, 512], help="sequence lengths")
    p.add_argument("--max-tokens", type=int, default=4096,
                   help="skip shapes with B*L above this (0: none; B=32 L=512 takes ~3 s a "
                        "call per engine here)")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--mb-layers", type=int, default=3,
                   help="ModernBERT layers (base: 22; every 3rd from the first is global)")
    p.add_argument("--rounds", type=int, default=5, help="alternated rounds per shape")
    p.add_argument("--iters", type=int, default=10, help="timed calls per block at most")
    p.add_argument("--block-s", type=float, default=0.25,
                   help="stop a block's timed calls after this many seconds (at least one)")
    p.add_argument("--rounds-layers", type=int, default=3,
                   help="alternated rounds of the B=1 time-vs-layers fit (0: skip the analysis)")
    p.add_argument("--profile-rounds", type=int, default=5, help="segment-profile rounds")
    p.add_argument("--spin", action="store_true",
                   help="let the peers' thread pools spin-wait (their default; fastest on "
                        "dedicated cores, several times slower on shared ones)")
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", sys.executable),
                   help="interpreter with the bench extra (torch, transformers, onnx, "
                        "onnxruntime)")
    return p


def main(argv=None):
    args = configure_parser().parse_args(argv)
    plan = shape_plan(args.arch, args.batch, args.seq, args.max_tokens)
    engines = [e for e in ENGINES if e in args.engines]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        for arch in args.arch:
            shapes = [(B, L) for a, B, L in plan if a == arch]
            if not shapes:
                continue
            if arch == "minilm":
                path = subprocess.run(
                    [sys.executable, "-c", "from variants.checkpoints.load import minilm_path;"
                     "print(minilm_path())"], capture_output=True, text=True,
                    check=True).stdout.strip()
            else:
                path = os.path.join(tmp, "modernbert")
                subprocess.run([args.peer_python, os.path.join(HERE, "peer_workers.py"),
                                "build", json.dumps({"path": path, "layers": args.mb_layers})],
                               check=True, stdout=subprocess.DEVNULL)
            need = {WORKER_OF[e] for e in engines}
            workers = {}
            if "mlx" in need:
                workers["mlx"] = Worker(sys.executable, "mlx", path=path, arch=arch,
                                        quant_bits=[int(e[1:]) for e in engines if e[0] == "q"],
                                        w8a8="w8a8" in engines)
            if "torch" in need:
                # OpenMP's spinning barriers collapse on shared cores (B=1 L=24: 437 ms of CPU
                # with 2 spinning threads at load 5, 52 ms passive); --spin keeps the default
                workers["torch"] = Worker(args.peer_python, "torch", path=path, arch=arch,
                                          env=None if args.spin else {"OMP_WAIT_POLICY":
                                                                      "PASSIVE"})
            if "ort" in need:
                workers["ort"] = Worker(args.peer_python, "ort", path=path, arch=arch,
                                        workdir=tmp, spin=args.spin)
            info = {k: w("info") for k, w in workers.items()}
            what = path if arch == "minilm" else f"{args.mb_layers} layers, random init"
            print(f"{RULE} {arch} ({what}): "
                  f"{json.dumps(info)} {RULE}", flush=True)
            if {"mlx", "torch"} <= set(workers):
                d = np.abs(np.array(workers["mlx"]("embed", B=2, L=64))
                           - np.array(workers["torch"]("embed", B=2, L=64))).max()
                print(f"  MLX vs PyTorch embeddings at B=2 L=64, max |diff|: {d:.2e}")
            if "ort" in workers:
                print(f"  ORT vs PyTorch embeddings at B=2 L=64, max |diff|: "
                      f"{workers['ort']('agree', B=2, L=64)}", flush=True)
            rows = {}
            for B, L in shapes:
                rows[(B, L)] = measure(workers, engines, B, L, args.rounds, args.iters,
                                       args.block_s)
                print(f"  timed B={B} L={L} ({time.perf_counter() - t_start:.0f} s)", flush=True)
            print_rows(arch, rows, engines)
            if args.rounds_layers and {"mlx", "ort32"} <= set(engines):
                n_layers = info["mlx"]["layers"]
                b1_analysis(arch, workers, rows, n_layers, args)
            for w in workers.values():
                w.close()
    print(f"\nwall time {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

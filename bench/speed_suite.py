"""The CPU speed benchmarks in one run: quantized vs fp32, windowed vs masked, MLX vs its peers.

Runs, one after the other, each in its own process (so one cannot warm or starve the next) and
with its output streamed under a header:

1. ``bench/quant_speed.py``: native quantized MiniLM vs the fp32 reference per bit width at B=1
   and B=32, the kernel named on every row;
2. ``bench/modernbert_window.py``: ModernBERT's local attention windowed vs masked at L = 128,
   512, 1024, 2048 with the log-log slope over length;
3. ``bench/peers.py --arch minilm modernbert``: our fp32 and native q8 / q4 beside PyTorch, ONNX
   Runtime fp32 and ONNX Runtime ``quantize_dynamic`` int8 (needs torch and onnxruntime in
   ``--peer-python`` / ``$PEER_PYTHON``; skipped with a line saying so when they are missing).

The defaults trade rounds for wall time so the whole run fits ~15 minutes on 2 cores (each
script's own defaults take ~5 min each); ``--full`` uses each script's defaults. The machine is
shared: read the ratios each script prints (alternated, with bootstrap CIs), not milliseconds.
Ends with the wall time of each part. Run: ``python bench/speed_suite.py [--full] [--only quant
window peers]``.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUICK = {
    "quant": ["--rounds", "7", "--budget-s", "4"],
    "window": ["--rounds", "2", "--forward-rounds", "1", "--crossover"],
    "peers": ["--rounds", "3", "--rounds-layers", "2", "--profile-rounds", "2",
              "--seq", "24", "128"],
}
PARTS = {
    "quant": ("native quantized vs fp32 reference (MiniLM, g64)", ["quant_speed.py"]),
    "window": ("ModernBERT local attention: windowed vs masked", ["modernbert_window.py"]),
    "peers": ("MLX vs PyTorch and ONNX Runtime (fp32, int8)",
              ["peers.py", "--arch", "minilm", "modernbert"]),
}


def peers_available(python):
    """Whether ``python`` imports torch, transformers, onnx and onnxruntime."""
    code = "import torch, transformers, onnx, onnxruntime"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=list(PARTS), default=list(PARTS),
                   help="parts to run (default all three)")
    p.add_argument("--full", action="store_true", help="each script's own (longer) defaults")
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", sys.executable),
                   help="python with torch + onnxruntime for the peers (default $PEER_PYTHON)")
    args = p.parse_args(argv)
    walls, codes = {}, {}
    for part in args.only:
        title, cmd = PARTS[part]
        if part == "peers" and not peers_available(args.peer_python):
            print(f"\n=== {part}: skipped: {args.peer_python} lacks torch/transformers/onnx/"
                  "onnxruntime; pip install -e '.[bench]' or set PEER_PYTHON", flush=True)
            continue
        extra = [] if args.full else QUICK[part]
        if part == "peers":
            extra += ["--peer-python", args.peer_python]
        full = [sys.executable, str(HERE / cmd[0]), *cmd[1:], *extra]
        print(f"\n=== {part}: {title}\n$ {' '.join(full[1:])}", flush=True)
        t0 = time.perf_counter()
        codes[part] = subprocess.run(full).returncode
        walls[part] = time.perf_counter() - t0
    print("\n=== wall time per part: " + ", ".join(f"{k} {v:.0f} s (exit {codes[k]})"
                                                   for k, v in walls.items())
          + f"; total {sum(walls.values()):.0f} s")
    return max(codes.values(), default=0)


if __name__ == "__main__":
    sys.exit(main())

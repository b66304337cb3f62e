"""Native quantized MiniLM vs the fp32 reference on the CPU, per bit width and kernel.

For each bit width (group size ``--group-size``) the MiniLM decision model is quantized in the
native mode (weights stay packed: :class:`variants.runtime.qlinear.CpuQuantizedLinear`) and its
forward (token ids -> logits, ``mx.eval`` inside the timed region) is timed against the fp32
reference in strict alternation (``time_alternating``: warm-up, ``--rounds`` A/B rounds) at
B=1 (``--seq-len-1`` tokens, no padding) and B=32 (random lengths in [L/4, L], padded to
``--seq-len``, as real texts are: the packed path). Random token ids (seeded). Printed per row:
p50 of both, the speed-up (median of per-round ratios ref/var, bootstrap 95% CI), the kernel,
and the call's own peak memory (peak minus active before the call) of both: the variant's
includes its temporary fp32 weight buffers.

``--kernels`` times each dequantizer (``cpp``: the compiled MLX extension
:mod:`variants.runtime.qkernel`, ``dequant-cpp+gemm``, named ``unpack+gemm`` where it is not built;
``unpack``: ``mx.compile``'d bit-unpacking chain;
``dequantize``: ``mx.dequantize``; ``native``: ``mx.quantized_matmul``, timed at B=1 only: at
B=32 it takes seconds per call on the CPU). ``--split-rows`` sets
:data:`variants.runtime.qlinear.SPLIT_ROWS`. Run: ``python bench/quant_speed.py`` (~5 min on 2 cores).
"""

import argparse
import sys

import variants  # noqa: F401  (OpenBLAS before mlx)

import mlx.core as mx
import numpy as np

from variants.runtime import device
from variants.arch import encoder
from variants.runtime import qlinear
from variants.families.quant.build import BITS, QuantConfig, quantize_module
from variants.checkpoints.load import load_checkpoint
from variants.models import sentiment
from variants.runtime.timing import time_alternating

RULE = "=" * 6
MB = 1 << 20


def configure_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", type=int, nargs="+", default=list(BITS), help="bit widths")
    p.add_argument("--group-size", type=int, default=64, help="weights per group")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32], help="batch sizes")
    p.add_argument("--seq-len", type=int, default=48, help="padded length at B > 1")
    p.add_argument("--seq-len-1", type=int, default=24, help="tokens at B = 1")
    p.add_argument("--kernels", nargs="+", default=["cpp", "unpack"],
                   choices=["cpp", "unpack", "dequantize", "native"], help="kernels to time")
    p.add_argument("--tile", type=int, default=qlinear.TILE,
                   help="output rows per dequantize + GEMM step of the cpp kernel (0: whole)")
    p.add_argument("--split-rows", type=int, default=qlinear.SPLIT_ROWS,
                   help="split a Linear's output features over the streams below this many "
                        "rows (0: never)")
    p.add_argument("--rounds", type=int, default=15, help="alternated timing rounds")
    p.add_argument("--budget-s", type=float, default=8.0, help="seconds per row at most")
    p.add_argument("--seed", type=int, default=0, help="seeds the token ids and lengths")
    return device.add_arguments(p)


def _batch(b, seq_len, vocab, rng):
    """(ids, mask) int32 (b, L): random ids; B > 1 with random lengths in [L/4, L]."""
    ids = rng.integers(1000, vocab, (b, seq_len))
    lengths = np.full(b, seq_len) if b == 1 else rng.integers(seq_len // 4, seq_len + 1, b)
    lengths[0] = seq_len  # the batch is padded to its longest
    mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32)
    return mx.array(ids * mask, mx.int32), mx.array(mask)


def main(argv=None):
    args = configure_parser().parse_args(argv)
    device.from_args(args)
    rng = np.random.default_rng(args.seed)
    model = sentiment.build(load_checkpoint(dtype=device.mx_dtype()))
    ref = model.module
    vocab = ref.encoder.args.vocab_size
    batches = {b: _batch(b, args.seq_len_1 if b == 1 else args.seq_len, vocab, rng)
               for b in args.batch_sizes}
    print(f"{RULE} native quantized MiniLM vs fp32 reference (g{args.group_size}, "
          f"device {mx.default_device()}, split below {args.split_rows} rows) {RULE}")
    print(f"{'bits':>4} {'B':>3} {'L':>3} {'kernel':>34} {'ref p50 ms':>10} {'var p50 ms':>10} "
          f"{'speed-up':>8} {'95% CI':>13} {'ref MB':>7} {'var MB':>7}")
    saved, saved_split, saved_tile = dict(qlinear.KERNELS), qlinear.SPLIT_ROWS, qlinear.TILE
    qlinear.SPLIT_ROWS, qlinear.TILE = args.split_rows, args.tile
    try:
        for bits in args.bits:
            try:
                cfg = QuantConfig(bits=bits, group_size=args.group_size)
            except ValueError as e:
                print(f"bench/quant_speed.py: error: {e}", file=sys.stderr)
                return 2
            var, _ = quantize_module(ref, cfg, mode="native")
            mx.eval(var.parameters())
            for kernel in args.kernels:
                if kernel == "native":
                    var_k = quantize_module(ref, cfg, mode="native")[0]
                    for _, m in var_k.named_modules():
                        if isinstance(m, qlinear.CpuQuantizedLinear):
                            m.__class__ = qlinear.nn.QuantizedLinear
                    mx.eval(var_k.parameters())
                else:
                    var_k = var
                    qlinear.KERNELS[bits] = kernel
                # + fused-qlayer-cpp when the layers run as one compiled op (variants.runtime.fused_layer)
                name = ", ".join(qlinear.kernels(var_k) + [n for n in (
                    encoder.compiled_paths(var_k),) if n])
                for b, (ids, mask) in batches.items():
                    types = mx.zeros_like(ids)
                    if kernel == "native" and b > 1:
                        continue
                    r = time_alternating(lambda: ref(ids, mask, types), lambda: var_k(ids, mask, types),
                                         warmup=2, rounds=args.rounds, budget_s=args.budget_s)
                    s = r["speedup"]
                    print(f"{bits:4d} {b:3d} {ids.shape[1]:3d} {name:>34} "
                          f"{r['ref']['p50_ms']:10.2f} {r['var']['p50_ms']:10.2f} "
                          f"{s['speedup_median']:7.2f}x "
                          f"[{s['speedup_ci_low']:.2f}, {s['speedup_ci_high']:.2f}] "
                          f"{r['ref_peak_over_active_bytes'] / MB:7.1f} "
                          f"{r['var_peak_over_active_bytes'] / MB:7.1f}", flush=True)
    finally:
        qlinear.KERNELS.update(saved)
        qlinear.SPLIT_ROWS, qlinear.TILE = saved_split, saved_tile
    print("speed-up = median over rounds of ref_ms / var_ms; MB = the call's own peak memory "
          "(peak - active before the call): the variant's includes the per-call fp32 weight "
          "buffers (dequantized per call, never kept).")
    return 0


if __name__ == "__main__":
    sys.exit(main())

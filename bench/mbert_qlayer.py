"""A quantized ModernBERT before and after its layers run as one compiled op
(variants/arch/modernbert_fused_q.py), each against the fp32 reference, alternated in one process.

Model: random-init ModernBERT at ModernBERT-base's shapes (bench/peer_workers.make_modernbert,
built once by ``--peer-python``'s transformers into ``--model`` unless it is there; ``--layers``
layers, default 3 = 1 global + 2 local), loaded by ``variants.checkpoints.load.load_checkpoint`` and
quantized as the sweep's native variants (``quantize_module(..., mode="native")``, g64).
Engines: ``fp32`` the reference (its layers through fused_mbert_layer), ``qN`` the quantized
encoder through fused_mbert_qlayer (after), ``qN-plain`` the same encoder with that op switched
off (before: its plain MLX path, each Linear a ``dequant-cpp+gemm`` call). Per shape, ``--rounds``
rounds, each engine one block (an untimed call, then up to ``--iters`` timed calls within
``--block-s`` s; the median) in an order that rotates per round; printed: per engine the median
ms, and the per-round ratio fp32 time / engine time (the speed-up against the reference; < 1
slower) with its 95% bootstrap CI (bench/peers.ratio).

Run: ``python bench/mbert_qlayer.py [--shapes 1x24 1x128 8x128] [--bits 8 4]``.
"""

import argparse
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)


def build_model(folder, layers, python):
    """The checkpoint folder, made by ``python`` (transformers) unless it holds a config."""
    if not os.path.exists(os.path.join(folder, "config.json")):
        code = ("import sys; sys.path.insert(0, %r); from peer_workers import make_modernbert; "
                "make_modernbert(%r, %d)" % (HERE, folder, layers))
        subprocess.run([python, "-c", code], check=True)
    return folder


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=["1x24", "1x128", "8x128"], help="BxL")
    p.add_argument("--bits", nargs="+", type=int, default=[8, 4])
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--block-s", type=float, default=1.5)
    p.add_argument("--model", default="/tmp/mbert_qlayer_model")
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", sys.executable))
    args = p.parse_args(argv)

    import variants  # noqa: F401  (preloads OpenBLAS before mlx)
    import mlx.core as mx
    from peer_workers import _ids, block
    from peers import ratio

    from variants.arch import modernbert_fused_q
    from variants.sweep import timing as sweep_timing
    from variants.families.quant.build import QuantConfig, quantize_module
    from variants.checkpoints.load import load_checkpoint
    from variants.arch.encoder import mean_pool

    ck = load_checkpoint(build_model(args.model, args.layers, args.peer_python))
    encs = {"fp32": (ck.encoder, True)}
    for bits in args.bits:
        q, _ = quantize_module(ck.encoder, QuantConfig(bits=bits, group_size=64), mode="native")
        mx.eval(q.parameters())
        encs[f"q{bits}"] = (q, True)
        encs[f"q{bits}-plain"] = (q, False)
    kernel = modernbert_fused_q._kernel

    def run(name, B, L):
        enc, on = encs[name]
        ids = mx.array(_ids(B, L, ck.args.vocab_size).astype(np.int32))
        mask = mx.ones((B, L), mx.int32)
        modernbert_fused_q._kernel = kernel if on else (lambda: None)
        try:
            return block(lambda: mx.eval(mean_pool(enc(ids, mask).last_hidden, mask)),
                         args.iters, args.block_s, (name, B, L))
        finally:
            modernbert_fused_q._kernel = kernel

    class M:
        module = None
    for name, (enc, on) in encs.items():
        M.module = enc
        modernbert_fused_q._kernel = kernel if on else (lambda: None)
        print(f"{name}: {sweep_timing.kernel(M)}")
        modernbert_fused_q._kernel = kernel
    names = list(encs)
    for shape in args.shapes:
        B, L = (int(v) for v in shape.split("x"))
        ms = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                ms[n].append(float(np.median(run(n, B, L))))
        print(f"B={B} L={L} ({args.rounds} rounds, {args.layers} layers)")
        for n in names:
            line = f"  {n:9s} median {np.median(ms[n]):8.1f} ms"
            if n != "fp32":
                med, lo, hi = ratio(ms[n], ms["fp32"])
                line += f"   speed-up vs fp32 {med:.2f} [{lo:.2f}, {hi:.2f}]"
            print(line, flush=True)


if __name__ == "__main__":
    main()

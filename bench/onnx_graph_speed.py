"""The suite's own ONNX graph (variants/onnx/graph_bert.py) run by ONNX Runtime beside the MLX
forward it was built from, in one process, strict alternation (issue #43, item 2).

Engines: ``mlx`` the MLX reference encoder (``encoder(ids, mask, types).last_hidden``,
evaluated); ``ort`` its fp32 graph; ``w8a8-u8u8`` / ``w8a8-u8s8`` the W8A8 variant's graph
(no SmoothQuant) with the weight stored for MatMulInteger as ``wq + 128`` with a scalar zero
point 128 (u8 x u8, the default: exact on every x86 CPU) or as int8 (u8 x s8: saturates 16-bit
pair sums on AVX2 without VNNI). ONNX Runtime: CPUExecutionProvider, ``intra_op_num_threads``
(default 2), ORT_ENABLE_ALL. Inputs: real review texts' tokens packed into full rows of L
tokens (no padding).

Each pair (a, b) runs ``--reps`` rounds of one call of a then one of b (after ``--warmup``
untimed rounds); the ratio of each round (time a / time b) is summarised by its median and
its 10th-90th percentiles. Usage::

    PYTHONPATH=. python bench/onnx_graph_speed.py --batch 1 32 --length 64 --reps 40
"""

import argparse
import platform
import statistics
import time

import variants  # noqa: F401  (OpenBLAS before MLX)
import mlx.core as mx
import numpy as np
import onnxruntime as ort

from variants.checkpoints.load import load_checkpoint
from variants.datasets import bundled as data
from variants.families.w8a8 import build as w8a8
from variants.families.w8a8.family import W8A8Config
from variants.models import sentiment
from variants.onnx.graph_bert import encoder_graph


def full_rows(tok, batch, length):
    """(ids, mask, types) int32 (batch, length): review texts' word pieces packed into rows of
    ``length`` tokens ([CLS] ... [SEP]), mask all ones."""
    texts = [str(t) for t in data.load_vader()["text"][:400]]
    pieces = [i for e in tok.encode(texts)[0] for i in list(e.ids)[1:-1]]
    ids = np.array(tok.batch(tok.encode(["x"])[0])[0])[0]
    cls, sep = int(ids[0]), int(ids[-1])
    rows = [[cls] + pieces[r * (length - 2):(r + 1) * (length - 2)] + [sep] for r in range(batch)]
    ids = np.array(rows, np.int32)
    return ids, np.ones_like(ids), np.zeros_like(ids)


def session(proto, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def alternate(fa, fb, reps, warmup):
    """Per-round ratios time(fa) / time(fb), each round one call of each, a first."""
    for _ in range(warmup):
        fa(), fb()
    ratios, ta, tb = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fa()
        t1 = time.perf_counter()
        fb()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
        ratios.append((t1 - t0) / (t2 - t1))
    q = np.quantile(ratios, [0.1, 0.9])
    return statistics.median(ratios), q, statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    ck = load_checkpoint()
    model = sentiment.build(ck)
    enc = model.module.encoder
    w8, _ = w8a8.build(model, W8A8Config(), mode="simulated")
    s32 = session(encoder_graph(enc), args.threads)
    su8 = session(encoder_graph(w8.module.encoder, int8="u8u8"), args.threads)
    ss8 = session(encoder_graph(w8.module.encoder, int8="u8s8"), args.threads)
    print(f"cpu {platform.processor() or platform.machine()}, ORT {ort.__version__}, MLX "
          f"{mx.__version__}, threads {args.threads}, L={args.length}")
    for b in args.batch:
        ids, mask, types = full_rows(ck.tokenizer, b, args.length)
        feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64),
                 "token_type_ids": types.astype(np.int64)}
        mids, mmask, mtypes = mx.array(ids), mx.array(mask), mx.array(types)
        f_mlx = lambda: mx.eval(enc(mids, mmask, mtypes).last_hidden)  # noqa: E731
        f_ort = lambda: s32.run(None, feeds)  # noqa: E731
        u8 = su8.run(None, feeds)[0]
        s8 = ss8.run(None, feeds)[0]
        for name, fa, fb in (("mlx / ort fp32", f_mlx, f_ort),
                             ("w8a8-u8u8 / w8a8-u8s8", lambda: su8.run(None, feeds),
                              lambda: ss8.run(None, feeds)),
                             ("w8a8-u8u8 / ort fp32", lambda: su8.run(None, feeds), f_ort)):
            med, (lo, hi), ma, mb = alternate(fa, fb, args.reps, args.warmup)
            print(f"B={b:3d} {name:24s} median ratio {med:.3f} [p10 {lo:.3f}, p90 {hi:.3f}]  "
                  f"medians {ma:.2f} ms / {mb:.2f} ms")
        print(f"B={b:3d} u8u8 vs u8s8 outputs: max |diff| {np.abs(u8 - s8).max():.3g}")


if __name__ == "__main__":
    main()

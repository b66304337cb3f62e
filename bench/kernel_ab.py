"""Two builds of the compiled kernel in one process: this tree's sources against an older
commit's, alternated on the same encoder forward.

The older commit's ``variants/runtime/qkernel`` sources (``variants/qkernel`` before the move)
are ``git archive``-d into a temporary tree and built there
(:func:`variants.runtime.qkernel.build`, the same digest-keyed cache: a build that exists is
reused), then both ``_qkernel`` modules are loaded side by side and
``variants.runtime.qkernel._state["module"]`` is switched between them before each timed
block, so the Python side, the weights and their cached derived arrays are the same objects for
both. Rounds alternate which build goes first (ABBA); a block is one untimed call then
``--iters`` timed calls (its median is the round's time). The speed-up is the median per-round
ratio base / this with its 95% percentile-bootstrap CI over rounds
(:func:`metrics.latency.paired_speedup`). The outputs of the two builds are compared too
(max |diff| of the mean-pooled embeddings).

Engines: ``fp32`` the bundled MiniLM reference (``fused-layer-cpp``), ``q8`` its native q8 g64
copy (``fused-qlayer-cpp``).

Measured (load 5-8 on the shared 2-core box; base c63609f, this tree's ``-fno-trapping-math``
on the fused fp32 / quantized layers): fp32 1.22x [0.97, 1.42] at B=1 L=24 and 1.15x
[0.84, 1.35] at B=32 L=128 (docs/w8a8.md)::

    PYTHONPATH=$PWD python bench/kernel_ab.py --base c63609f --rounds 9 --iters 2
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import variants  # noqa: F401  (preloads OpenBLAS before mlx)
import mlx.core as mx
import numpy as np

from metrics.latency import paired_speedup
from variants.runtime import qkernel

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ((1, 24), (32, 128))


def base_build(commit, tmp):
    """Path of the built ``_qkernel`` of ``commit``'s sources (built into the shared cache)."""
    tree = Path(tmp) / "base"
    tree.mkdir()
    for sub in ("variants/runtime/qkernel", "variants/qkernel"):  # the layout moved once
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", commit, sub],
                              capture_output=True)
        if arch.returncode == 0:
            break
    else:
        raise SystemExit(f"kernel_ab: {commit} has no variants/runtime/qkernel nor "
                         "variants/qkernel")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=arch.stdout, check=True)
    pkg = sub.rsplit("/", 1)[0]
    for d in {"variants", pkg}:
        (tree / d / "__init__.py").write_text("")
    code = (f"import sys; sys.path.insert(0, sys.argv[1]); from {pkg.replace('/', '.')} "
            "import qkernel; p, why = qkernel.build(); print(p or ''); "
            "print(why or '', file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code, str(tree)], capture_output=True,
                         text=True, cwd=tmp)
    path = out.stdout.strip()
    if not path:
        raise SystemExit(f"kernel_ab: base build failed: {out.stderr.strip()}")
    return path


def encoders(engines):
    from variants.families.quant.build import QuantConfig, quantize_module
    from variants.checkpoints.load import load_checkpoint
    ck = load_checkpoint()
    encs = {}
    if "fp32" in engines:
        encs["fp32"] = ck.encoder
    if "q8" in engines:
        q, _ = quantize_module(ck.encoder, QuantConfig(bits=8, group_size=64), mode="native")
        mx.eval(q.parameters())
        encs["q8"] = q
    return encs, ck.args.vocab_size


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the older commit (its variants/qkernel)")
    p.add_argument("--engines", nargs="+", choices=("fp32", "q8"), default=["fp32"])
    p.add_argument("--rounds", type=int, default=7, help="alternated rounds per shape")
    p.add_argument("--iters", type=int, default=3, help="timed calls per block")
    args = p.parse_args(argv)
    from variants.arch.encoder import mean_pool
    import time
    this = qkernel.load()
    if this is None:
        raise SystemExit(f"kernel_ab: this tree's kernel unavailable ({qkernel.why_unavailable()})")
    with tempfile.TemporaryDirectory(prefix="kernel-ab-") as tmp:
        base, why = qkernel._import(base_build(args.base, tmp))
    if base is None:
        raise SystemExit(f"kernel_ab: {why}")
    builds = {"base": base, "this": this}
    encs, vocab = encoders(args.engines)
    rng = np.random.default_rng(0)
    for name, enc in encs.items():
        for B, L in SHAPES:
            ids = mx.array(rng.integers(1000, 30000, (B, L)).astype(np.int32))
            mask, types = mx.ones((B, L), mx.int32), mx.zeros((B, L), mx.int32)

            def call():
                out = mean_pool(enc(ids, mask, types).last_hidden, mask)
                mx.eval(out)
                return out

            emb = {}
            for b, mod in builds.items():
                qkernel._state["module"] = mod
                emb[b] = np.array(call())
            ms = {b: [] for b in builds}
            for r in range(args.rounds):
                for b in (("base", "this") if r % 2 == 0 else ("this", "base")):
                    qkernel._state["module"] = builds[b]
                    call()
                    t = []
                    for _ in range(args.iters):
                        t0 = time.perf_counter()
                        call()
                        t.append((time.perf_counter() - t0) * 1e3)
                    ms[b].append(float(np.median(t)))
            sp = paired_speedup(ms["base"], ms["this"])
            print(f"{name} B={B} L={L}: base {np.median(ms['base']):.1f} ms, this "
                  f"{np.median(ms['this']):.1f} ms, speed-up {sp['speedup_median']:.2f}x "
                  f"[{sp['speedup_ci_low']:.2f}, {sp['speedup_ci_high']:.2f}] "
                  f"({sp['variant_wins']}/{sp['n_rounds']} rounds faster); "
                  f"max |diff| {np.abs(emb['base'] - emb['this']).max():.2e}", flush=True)
    qkernel._state["module"] = this
    return 0


if __name__ == "__main__":
    sys.exit(main())

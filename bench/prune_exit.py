"""Ideal (cost model) vs measured speed-up of token pruning over (a, ρ) and early exit over rules.

Usage: .venv/bin/python bench/prune_exit.py [--n-fit 300 --n-calibration 120 --rounds 5]

Reference and variant are timed in strict alternation (variants.runtime.timing.time_alternating) on the
sweep's timing batches (B=1: the median-length calibration text; B=32: 32 calibration texts).
Early-exit heads are fitted on the fit split, thresholds on the calibration split.
"""

import argparse

import variants  # noqa: F401  (OpenBLAS before mlx)
from variants.datasets import bundled as data
from variants.families.exit import build as early_exit, family as exit_family
from variants.families.prune import build as prune, family as prune_family
from variants.checkpoints.load import load_checkpoint
from variants.models import sentiment
from variants.runtime.timing import time_alternating


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-fit", type=int, default=300, help="fit examples (head + exit heads)")
    p.add_argument("--n-calibration", type=int, default=120, help="calibration examples")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per batch size")
    p.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3], help="pruning layers a")
    p.add_argument("--keep-ratios", type=float, nargs="+", default=[0.7, 0.5, 0.3], help="ρ")
    p.add_argument("--targets", type=float, nargs="+", default=[0.99, 0.95],
                   help="early-exit calibration agreement targets")
    args = p.parse_args()
    ck = load_checkpoint()
    fr = data.load_vader()
    fit = sentiment.make_taskset(data.sample(data.split_frame(fr, "fit"), args.n_fit, seed=0))
    cal = sentiment.make_taskset(data.sample(data.split_frame(fr, "calibration"),
                                             args.n_calibration, seed=0))
    ref = sentiment.build(ck)
    ref.fit_head(fit)
    ref.calibrate(cal)
    batches, _ = ref.prepare(cal, batch_size=1)
    lengths = [b.n_tokens for b in batches]
    timing = {1: batches[sorted(range(len(lengths)), key=lengths.__getitem__)[len(lengths) // 2]],
              32: ref.prepare(cal.subset(list(range(min(32, len(cal))))), batch_size=32)[0][0]}
    configs = [("prune", prune, prune_family.PruneConfig(after_layer=a, keep_ratio=r), {})
               for a in args.layers for r in args.keep_ratios]
    configs += [("exit", early_exit, exit_family.ExitConfig(rule, target=t), {"fit": fit})
                for rule in early_exit.RULES for t in args.targets]
    print("====== ideal vs measured speed-up (median of per-round ratios) ======")
    print(f"{'variant':<24} {'ideal':>7} " + " ".join(f"{'B=' + str(b):>14}" for b in timing))
    for fam, mod, cfg, kw in configs:
        variant, info = mod.build(ref, cfg, calibration=cal, **kw)
        cells = []
        for b, batch in timing.items():
            r = time_alternating(lambda: ref.forward(batch), lambda: variant.forward(batch),
                                 warmup=1, rounds=args.rounds, budget_s=30)
            cells.append(f"{r['speedup']['speedup_median']:>6.2f}× (L={batch.input_ids.shape[1]:>3})")
        print(f"{cfg.name:<24} {info['ideal_speedup']:>6.2f}× " + " ".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()

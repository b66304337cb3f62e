"""What AWQ's input scale costs at run time: a native quantized MiniLM with and without
:class:`variants.arch.input_scaled.InputScaledLinear` on its encoder Linears, side by side.

The same packed weights (round-to-nearest at ``--bits``, group ``--group-size``) run twice:
plain (the compiled whole-layer kernel where it applies) and with every encoder Linear wrapped
in an input scale (what an AWQ or DWQ variant carries where its alpha > 0: one multiply of the
input per channel, and the layer then runs Linear by Linear). The scale's values do not change
the time; they are 1 + 1e-3. Strict A/B alternation (``time_alternating``) at B=1
(``--seq-len-1`` tokens) and B=32 (random lengths in [L/4, L] padded to ``--seq-len``), random
token ids (seeded). Printed: p50 of both and the speed-up of the wrapped model against the
plain one (median of per-round ratios, bootstrap 95% CI; < 1 = the input scale costs).
Run: ``python bench/input_scale_cost.py`` (~2 min on 2 cores).
"""

import argparse
import sys

import variants  # noqa: F401  (OpenBLAS before mlx)

import mlx.core as mx
import numpy as np

from variants.arch import encoder
from variants.arch.activations import set_module, target_linears
from variants.arch.input_scaled import InputScaledLinear
from variants.checkpoints.load import load_checkpoint
from variants.families.quant.build import QuantConfig, quantize_module
from variants.models import sentiment
from variants.runtime import qlinear
from variants.runtime.timing import time_alternating


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", type=int, default=4, help="bit width")
    p.add_argument("--group-size", type=int, default=64, help="weights per group")
    p.add_argument("--seq-len", type=int, default=48, help="padded length at B = 32")
    p.add_argument("--seq-len-1", type=int, default=24, help="tokens at B = 1")
    p.add_argument("--rounds", type=int, default=15, help="alternated timing rounds")
    p.add_argument("--budget-s", type=float, default=20.0, help="seconds per row at most")
    p.add_argument("--seed", type=int, default=0, help="seeds the token ids and lengths")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    ref = sentiment.build(load_checkpoint()).module
    cfg = QuantConfig(bits=args.bits, group_size=args.group_size)
    plain, _ = quantize_module(ref, cfg, mode="native")
    scaled, _ = quantize_module(ref, cfg, mode="native")
    mods = dict(scaled.named_modules())
    for path in target_linears(ref):  # the reference's paths (the packed layers are not nn.Linear)
        n = mods[path].weight.shape[1] * 32 // args.bits  # packed: 32 / bits codes per uint32
        set_module(scaled, path, InputScaledLinear(mods[path], mx.full((n,), 1.001)))
    assert isinstance(scaled.encoder.layers[0].attention.query, InputScaledLinear)
    mx.eval(plain.parameters(), scaled.parameters())
    vocab = ref.encoder.args.vocab_size
    print(f"input scale on every encoder Linear, q{args.bits}-g{args.group_size}, "
          f"device {mx.default_device()}")
    print(f"  plain: {', '.join(qlinear.kernels(plain) + [encoder.compiled_paths(plain) or ''])}")
    print(f"  input-scaled: {', '.join(qlinear.kernels(scaled) + [encoder.compiled_paths(scaled) or ''])}")
    print(f"{'B':>3} {'L':>3} {'plain p50 ms':>12} {'scaled p50 ms':>13} {'speed-up':>8} "
          f"{'95% CI':>13}")
    for b, L in ((1, args.seq_len_1), (32, args.seq_len)):
        ids = rng.integers(1000, vocab, (b, L))
        lengths = np.full(b, L) if b == 1 else rng.integers(L // 4, L + 1, b)
        lengths[0] = L
        mask = (np.arange(L)[None, :] < lengths[:, None]).astype(np.int32)
        ids, mask = mx.array(ids * mask, mx.int32), mx.array(mask)
        types = mx.zeros_like(ids)
        r = time_alternating(lambda: plain(ids, mask, types), lambda: scaled(ids, mask, types),
                             warmup=2, rounds=args.rounds, budget_s=args.budget_s)
        s = r["speedup"]
        print(f"{b:3d} {L:3d} {r['ref']['p50_ms']:12.2f} {r['var']['p50_ms']:13.2f} "
              f"{s['speedup_median']:7.2f}x [{s['speedup_ci_low']:.2f}, "
              f"{s['speedup_ci_high']:.2f}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

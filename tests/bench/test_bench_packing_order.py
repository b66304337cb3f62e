"""bench/packing_order.py runs both orders on real eval texts and restores the shipped order."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import packing_order  # noqa: E402

from variants.runtime import packing  # noqa: E402


def test_packing_order_bench_runs_and_restores_the_shipped_order(checkpoint):
    shipped = packing.longest_first
    res = packing_order.measure(rounds=1, n_random=3, n_texts=64, warmup=0)
    assert packing.longest_first is shipped
    rnd, srt = res.values()
    assert len(rnd["time_ratios"]) == 1 and np.isfinite(rnd["time_ratios"]).all()
    # random draws mix long and short texts: longest first pads the attention layout less
    assert 0 < np.median(rnd["positions_ratio"]) < 1
    assert all(0 < r <= 1.0 + 1e-9 for r in srt["positions_ratio"])


def test_attention_positions_by_hand():
    mask = (np.arange(8)[None] < np.array([[2], [8], [3], [7]])).astype(np.int32)
    # own order, 20 tokens cut nearest 10 (after 10): 2 8 | 3 7 -> 2 x 8^2 + 2 x 7^2
    assert packing_order.attention_positions(mask, np.arange(4)) == 2 * 64 + 2 * 49
    # longest first 8 7 3 2, prefixes 8 15 18: 8 is nearest 10 -> 8 | 7 3 2
    assert packing_order.attention_positions(mask, packing.longest_first(mask)) == 64 + 3 * 49

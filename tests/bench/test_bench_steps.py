"""bench/encoder_steps.py runs every step on the real model and each step keeps the numbers."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import encoder_steps  # noqa: E402

from variants.arch import encoder
from variants.runtime import fast_ops  # noqa: E402


@pytest.mark.parametrize("batch_size,seq_len", [(2, 16), (1, 40)])  # (1, 40): B=1 head split
def test_every_step_runs_and_matches_step_zero(checkpoint, batch_size, seq_len):
    rows = encoder_steps.measure(batch_size=batch_size, seq_len=seq_len, rounds=1)
    assert [r["step"] for r in rows] == list(encoder_steps.STEPS)
    assert all(r["ms"] > 0 for r in rows)
    assert max(r["max_abs_diff_vs_0"] for r in rows) < 1e-5
    # the shipped state is restored afterwards
    assert fast_ops.softmax_parts is encoder_steps._SHIPPED["parts"]
    assert encoder.Attention.folded is encoder_steps._SHIPPED["folded"]
    assert encoder.Attention.core is encoder_steps._SHIPPED["core"]
    assert encoder.TransformerLayer.mlp_weights is encoder_steps._SHIPPED["mlp"]
    assert np.isfinite([r["tokens_per_s"] for r in rows]).all()

"""bench/modernbert_steps.py on the tiny fixture checkpoint: every step runs, prints its time and
ratio, and computes the plain path's embedding (max |diff| to step 0 within round-off); the
module switches it flips are restored afterwards."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
import modernbert_steps as bench  # noqa: E402

from variants.arch import modernbert_fast
from variants.runtime import parallel  # noqa: E402
from variants.checkpoints.load import load_checkpoint  # noqa: E402

HF = Path(__file__).parents[1] / "fixtures" / "hf"


def test_every_step_runs_and_matches_step_0(capsys):
    enc = load_checkpoint(HF / "modernbert_g2").encoder
    bench.run(enc, [(1, 40), (2, 140)], rounds=2, iters=1, block_s=0.0)
    out = capsys.readouterr().out
    for B, L in ((1, 40), (2, 140)):
        assert f"B={B} L={L}" in out
    lines = [ln for ln in out.splitlines() if "max|diff|" in ln]
    assert len(lines) == 2 * len(bench.STEPS)
    diffs = [float(re.search(r"max\|diff\| (\S+)", ln).group(1)) for ln in lines]
    assert max(diffs) <= 1e-5
    assert all(" x1.00 [1.00, 1.00]" in ln for ln in lines[::len(bench.STEPS)])  # step 0 vs itself
    assert enc.fast and modernbert_fast.parallel is parallel
    assert modernbert_fast.COMPILED_ROPE and modernbert_fast.FAST_WINDOW


def test_shapes_parse(capsys):
    assert bench.shape("8x128") == (8, 128)
    with pytest.raises(SystemExit) as e:
        bench.main(["--shapes", "1y24"])
    assert e.value.code == 2 and "'1y24' is not BxL" in capsys.readouterr().err

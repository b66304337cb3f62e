"""bench/w8a8_prepack_ab.py: a tiny run prints both timings and bit-identical outputs, restores
the fused layer's runner, and refuses a malformed shape."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import w8a8_prepack_ab  # noqa: E402

from variants.runtime import fused_layer, qkernel  # noqa: E402


def test_bad_shape_is_refused(capsys):
    assert w8a8_prepack_ab.main(["--shapes", "1by24"]) == 2
    assert "--shapes takes BxL" in capsys.readouterr().err


def test_tiny_run_prints_equal_outputs_and_restores(capsys, checkpoint):
    k = qkernel.load()
    if k is None or not k.has_dnnl() or not k.has_prepack():
        pytest.skip("oneDNN's prepacked int8 matmul unavailable here")
    run = fused_layer._run
    assert w8a8_prepack_ab.main(["--rounds", "2", "--iters", "1", "--warmup", "1",
                                 "--shapes", "1x5"]) == 0
    assert fused_layer._run is run
    out = capsys.readouterr().out
    assert "B=1 L=5: prepacked" in out and "max |diff| 0.0e+00" in out

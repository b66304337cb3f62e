"""bench/peers.py: the per-round ratio and its CI on known numbers, the shape plan and argument
defaults, the alternation order; the real run (MLX beside ONNX Runtime) only where the bench extra
is importable. No timing assertions."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402


def test_ratio_is_the_median_per_round_ratio_with_a_bootstrap_interval():
    # per-round ratios den/num = 2, 2, 3, 2, 4: median 2; a bootstrap median of 5 draws is 4
    # with probability P(Bin(5, 0.2) >= 3) = 0.058 > 0.025 and 2 with probability 0.68, so the
    # 95% percentile interval is [2, 4]
    m, lo, hi = peers.ratio([10, 10, 10, 10, 10], [20, 20, 30, 20, 40])
    assert (m, lo, hi) == (2.0, 2.0, 4.0)
    # constant ratio: the interval collapses; the slower numerator gives a ratio below 1
    assert peers.ratio([4.0, 8.0, 2.0], [1.0, 2.0, 0.5]) == (0.25, 0.25, 0.25)


def test_ratio_refuses_unpaired_rounds():
    with pytest.raises(ValueError, match="one time per alternated round"):
        peers.ratio([1.0, 2.0], [1.0])


def test_tokens_per_s_and_line_fit():
    assert peers.tokens_per_s(8, 128, 256.0) == pytest.approx(4000.0)
    a, b = peers.line_fit([24, 128, 512], [3 + 0.02 * x for x in (24, 128, 512)])
    assert a == pytest.approx(3.0) and b == pytest.approx(0.02)


def test_default_plan_fits_each_model_and_the_token_cap():
    args = peers.configure_parser().parse_args([])
    assert args.arch == ["minilm", "modernbert"] and args.batch is None
    assert args.seq == [24, 128, 512] and args.mb_layers == 3 and not args.spin
    assert args.engines == ["mlx", "torch", "ort32", "ort8", "q8", "q4", "w8a8"]
    plan = peers.shape_plan(args.arch, args.batch, args.seq, args.max_tokens)
    mini = [(1, 24), (1, 128), (1, 512), (8, 24), (8, 128), (8, 512), (32, 24), (32, 128)]
    modern = [(1, 24), (1, 128), (1, 512), (8, 24), (8, 128), (8, 512)]
    assert plan == [("minilm", *s) for s in mini] + [("modernbert", *s) for s in modern]
    # no cap: MiniLM B=32 L=512 comes back; L=1024 only for ModernBERT (MiniLM has 512
    # positions); ModernBERT runs B=32 only when asked
    plan = peers.shape_plan(["minilm", "modernbert"], [32, 1], [512, 1024], 0)
    assert plan == [("minilm", 32, 512), ("minilm", 1, 512), ("modernbert", 32, 512),
                    ("modernbert", 32, 1024), ("modernbert", 1, 512), ("modernbert", 1, 1024)]


def test_measure_rotates_the_engine_order_and_keeps_rounds_paired():
    calls = []

    class Fake:
        def __call__(self, op, engine, B, L, iters, block_s):
            calls.append(engine)
            return [1.0, 3.0, 2.0] if engine == "mlx" else [4.0]

    fake = Fake()
    ms = peers.measure({"mlx": fake, "ort": fake}, ["mlx", "ort32", "ort8"], 1, 24, 4, 5, 0.1)
    assert calls == ["mlx", "ort32", "ort8", "ort32", "ort8", "mlx", "ort8", "mlx", "ort32",
                     "mlx", "ort32", "ort8"]
    assert ms == {"mlx": [2.0] * 4, "ort32": [4.0] * 4, "ort8": [4.0] * 4}


def _peer_python():
    python = os.environ.get("PEER_PYTHON", sys.executable)
    ok = subprocess.run([python, "-c", "import onnxruntime, onnx, torch, transformers"],
                        capture_output=True).returncode == 0
    return python if ok else None


@pytest.mark.slow
def test_a_tiny_real_run_prints_every_engine():
    python = _peer_python()
    if python is None:
        pytest.skip("needs the bench extra (pip install -e '.[bench]': torch, transformers, "
                    "onnx, onnxruntime) in this interpreter or in PEER_PYTHON")
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers.py"), "--arch", "minilm", "--batch", "1",
         "--seq", "16", "32", "--rounds", "2", "--iters", "1", "--rounds-layers", "0",
         "--peer-python", python], capture_output=True, text=True, check=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    assert "ORT fp32" in out and "our q4" in out and "MLX/ORT fp32" in out
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith("1 ")]
    assert len(rows) == 4  # two lengths, tokens/s and ratio rows
    assert all(float(v) > 0 for v in rows[0][2:8])


def test_block_warms_up_unless_the_previous_block_was_slow():
    import peer_workers
    calls = []
    out = peer_workers.block(lambda: calls.append(1), 3, 10.0, key=("x", 1, 24))
    assert len(out) == 3 and len(calls) == 4  # one untimed call first
    peer_workers._LAST[("x", 1, 24)] = peer_workers.WARM_BELOW_MS  # a slow shape: no warm-up
    calls.clear()
    peer_workers.block(lambda: calls.append(1), 2, 10.0, key=("x", 1, 24))
    assert len(calls) == 2
    calls.clear()
    assert len(peer_workers.block(lambda: calls.append(1), 5, 0.0)) == 1  # budget spent: one
    assert len(calls) == 2

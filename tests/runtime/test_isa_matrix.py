"""The int8 and compiled-kernel tests on every CPU's code path, on any machine.

oneDNN honours ``ONEDNN_MAX_CPU_ISA`` (read once per process), so a child process capped at
``AVX2`` or ``AVX512_CORE`` runs the u8 x s8 kernels of a CPU without VNNI (whose 16-bit pair
sums saturate; the W8A8 ops split the codes there: ``int8_scheme() == "u8s8-split7"``), and
``VARIANTS_KERNEL_ISA=baseline`` makes the compiled fp32 / int8 layer loops run their build for
the baseline x86-64 ISA (:mod:`variants.runtime.qkernel`). This module runs, in child
processes:

- the int8 test files (:data:`INT8_TESTS`: int8 GEMMs bit for bit against NumPy int64, the W8A8
  Linear and fused BERT / ModernBERT int8 layers against the MLX path and the simulated layer,
  the w8a8 family) with oneDNN capped at AVX2 and at AVX-512 without VNNI (the machine's best
  ISA is the in-process run of the same files);
- the compiled-kernel test files (:data:`KERNEL_TESTS`) with the baseline loops and oneDNN at
  AVX2;
- one W8A8 MiniLM forward per ISA (``isa_logits.py``): the same pooled embeddings, bit for bit,
  on AVX2, AVX-512 without VNNI and the best ISA here (the integer sums are exact everywhere and
  the fp32 parts run the same AVX2+FMA loops), and within W8A8's code-step round-off with the
  baseline loops.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: other CPUs' code paths (~45 s of child processes): .ci/run runs them with the cross-CPU search
#: (pytest -m crosscpu); the README's default test run leaves them out
pytestmark = pytest.mark.crosscpu
INT8_TESTS = ["tests/runtime/test_int8_prepack.py", "tests/runtime/test_w8a8_fused.py",
              "tests/arch/test_modernbert_fused_i8.py", "tests/families/test_w8a8.py",
              "tests/families/test_families_archs.py::test_w8a8_runs_on_every_architecture"]
KERNEL_TESTS = ["tests/runtime/test_qkernel.py", "tests/runtime/test_fused_layer.py",
                "tests/arch/test_modernbert_fused.py", "tests/runtime/test_int8_prepack.py",
                "tests/runtime/test_w8a8_fused.py", "tests/arch/test_modernbert_fused_i8.py"]
CAPS = {"avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
        "avx512-no-vnni": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
        "baseline-loops": {"ONEDNN_MAX_CPU_ISA": "AVX2", "VARIANTS_KERNEL_ISA": "baseline"}}


@pytest.fixture(scope="module")
def k8():
    from variants.runtime import qkernel

    mod = qkernel.load()
    if mod is None or not mod.has_dnnl() or not hasattr(mod, "int8_scheme"):
        pytest.skip("the compiled int8 GEMM is unavailable here (apt-get install libdnnl-dev, "
                    "then python -m variants.runtime.qkernel --force)")
    return mod


def _env(cap):
    """The child's environment: this process's, with ``cap``'s settings in place of the same
    settings it had (``best``: this process's own, so a whole run already capped or on the
    baseline loops compares like with like)."""
    drop = ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", *CAPS.get(cap, {}))
    if "ONEDNN_MAX_CPU_ISA" in drop:
        drop += ("DNNL_MAX_CPU_ISA",)  # oneDNN's older name for it
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(CAPS.get(cap, {}), PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _pytest(cap, files):
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-x", *files], cwd=ROOT, env=_env(cap), capture_output=True,
                          text=True, timeout=600)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
    assert done.returncode == 0, f"{cap}: {' '.join(files)}\n{tail}"
    assert " passed" in tail and "skipped" not in tail.split("\n")[-1], tail  # ran, not skipped
    return tail


@pytest.mark.parametrize("cap", ["avx2", "avx512-no-vnni"])
def test_int8_tests_pass_on_the_kernels_of_a_cpu_without_vnni(k8, cap):
    _pytest(cap, INT8_TESTS)


def test_kernel_tests_pass_on_the_baseline_loops(k8):
    _pytest("baseline-loops", KERNEL_TESTS)


@pytest.fixture(scope="module")
def embeddings(k8, tmp_path_factory):
    """{cap: npz} of isa_logits.py under each cap and under this process's own setting (cap
    ``best``: the machine's best ISA in the README's test run)."""
    out = {}
    for cap in ("best", *CAPS):
        path = tmp_path_factory.mktemp("isa") / f"{cap}.npz"
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("isa_logits.py")),
                               str(path)], cwd=ROOT, env=_env(cap), capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        out[cap] = np.load(path)
    return out


def test_w8a8_model_is_the_same_on_every_isa(k8, embeddings):
    best = embeddings["best"]
    assert str(best["isa"]) == k8.int8_cpu_isa() and str(best["scheme"]) == k8.int8_scheme()
    for cap in ("avx2", "avx512-no-vnni"):
        e = embeddings[cap]
        assert str(e["scheme"]) == "u8s8-split7", (cap, str(e["isa"]))
        assert "dnnl" in str(e["kernel"])  # the compiled integer GEMM, not the simulated path
        # exact integer sums and the same fp32 loops: the same model, bit for bit
        np.testing.assert_array_equal(e["emb"], best["emb"])
    assert np.abs(best["emb"]).max() > 0.05  # real embeddings


def test_baseline_loops_differ_by_round_off_and_code_steps_only(embeddings):
    """The baseline build of the layer loops rounds differently (no FMA): most rows equal to
    round-off; a row where that moved an activation code across a rounding step differs by a
    code step, far under the W8A8 error itself (measured: 9 of 24 rows, max 0.007 against
    embeddings of magnitude 0.2)."""
    a, b = embeddings["baseline-loops"]["emb"], embeddings["best"]["emb"]
    row = np.abs(a - b).max(axis=1)
    assert np.median(row) <= 1e-5 and row.max() <= 0.05 * np.abs(b).max() * 4, row

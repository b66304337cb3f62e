"""The compiled CPU kernel for quantized Linears: build it once, load it, or say why not.

``qkernel.cpp`` (next to this file) is an MLX C++ extension (MLX's "Custom Extensions in MLX":
two primitives with CPU evaluation, nanobind bindings, built with CMake against the headers and
CMake config the ``mlx`` wheel ships):

- ``dequantize(w, scales, biases, group_size, bits)``: the fp32 weight (out, in), bit-identical
  to ``mx.dequantize`` (affine mode, bits 2/3/4/6/8), unpacked by loops compiled for AVX2 and
  for the baseline x86-64 ISA (chosen at run time by the CPU; no ``-march=native``);
- ``qlinear(x, w, scales, biases, bias, group_size, bits, tile)``: ``x @ W.T + bias`` with W
  dequantized into one temporary fp32 buffer (``tile`` <= 0) or ``tile`` output rows at a time,
  each multiplied by ``cblas_sgemm`` (OpenBLAS when :mod:`variants.runtime.blas` loaded it). The buffer
  comes from MLX's allocator: it counts in ``mx.get_peak_memory()``. Scales and biases may be
  float32, float16 or bfloat16 (widened exactly: ``float32(scale) * q + float32(bias)``);
- ``dequantize_mode(w, scales, mode)``: the fp32 weight of MLX's microscaling modes ``mxfp4``,
  ``mxfp8``, ``nvfp4`` (``qmodes.cpp``), equal to ``mx.dequantize(..., mode=mode,
  dtype=mx.float32)``.

:func:`load` returns the built module or None. The build (``cmake`` + a C++17 compiler +
the ``nanobind`` package, ~30 s on 2 cores) runs at set-up (``scripts/setup.sh`` runs
``python -m variants.runtime.qkernel``) or else lazily on first use, into
``$VARIANTS_KERNEL_CACHE`` (default ``~/.cache/mlx-variants/qkernel``), one folder per digest
of the sources, MLX, nanobind and Python versions. When a tool is missing or the build fails,
one line goes to stderr (with the build log's path), the failure is remembered for that digest,
and callers use the pure-MLX path (:mod:`variants.runtime.qlinear`: the same results).
``VARIANTS_QKERNEL=off`` disables the kernel (A/B measurements, tests of the fallback).
``VARIANTS_KERNEL_ISA=baseline`` makes a whole process run the loops built for the baseline
x86-64 ISA where the CPU has AVX2 (``allow_avx2(False)`` and ``fused_allow_avx2(False)`` at
load): the code path of a CPU without AVX2, on any machine (tests run both). The integer GEMMs
are oneDNN's: ``ONEDNN_MAX_CPU_ISA`` (e.g. ``AVX2``, ``AVX512_CORE``) caps those.
"""

import fcntl
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("qkernel.cpp", "fused_layer.cpp", "fused_qlayer.cpp", "fused_mbert_layer.cpp",
           "fused_mbert_qlayer.cpp", "fused_mbert.h", "fused_layer.h", "fused_common.h",
           "panel_gemm.h", "int8_linear.cpp", "int8_prepack.h", "int8_prepack.cpp",
           "fused_int8_layer.cpp", "fused_int8.h", "fused_mbert_int8layer.cpp",
           "fused_mbert_ops.h", "qmodes.cpp", "scale_widen.h", "CMakeLists.txt")
#: oneDNN's header: whether it is installed is part of a build's key (installing libdnnl-dev
#: later rebuilds the kernel with the W8A8 integer GEMMs)
DNNL_HEADERS = ("/usr/include/oneapi/dnnl/dnnl.h", "/usr/local/include/oneapi/dnnl/dnnl.h")
ENV_CACHE, ENV_SWITCH = "VARIANTS_KERNEL_CACHE", "VARIANTS_QKERNEL"
#: ``baseline``: the loops built for the baseline ISA only (module docstring); ``auto`` (default)
ENV_ISA = "VARIANTS_KERNEL_ISA"
#: nanobind must match the ABI MLX 0.32.4 was built with (nanobind internals v22)
NANOBIND = "nanobind==3.1.0"

_state = {"module": None, "tried": False, "why": None}


def cache_root():
    """The kernel cache folder (``$VARIANTS_KERNEL_CACHE`` or ``~/.cache/mlx-variants/qkernel``)."""
    env = os.environ.get(ENV_CACHE, "").strip()
    return Path(env) if env else Path.home() / ".cache" / "mlx-variants" / "qkernel"


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def key():
    """16 hex digits naming one build: the sources, MLX's and nanobind's versions, Python's
    version and the platform."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((HERE / name).read_bytes())
    h.update(repr((_version("mlx"), _version("nanobind"), sys.version_info[:2],
                   platform.machine(), sys.platform,
                   any(os.path.exists(p) for p in DNNL_HEADERS))).encode())
    return h.hexdigest()[:16]


def _target(folder):
    return folder / f"_qkernel{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def missing_tools():
    """What the build needs and this machine lacks (``[]`` when nothing)."""
    lack = [t for t in ("cmake",) if shutil.which(t) is None]
    if not any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "g++", "clang++")):
        lack.append("a C++ compiler (g++ or clang++)")
    if importlib.util.find_spec("nanobind") is None:
        lack.append(f"the nanobind package (pip install '{NANOBIND}')")
    if importlib.util.find_spec("mlx") is None:
        lack.append("mlx")
    return lack


def build(force=False):
    """Build the extension into its cache folder unless it is there (or failed before, unless
    ``force``). Returns (path or None, reason or None); never raises for a failed build, nor
    for a cache folder that cannot be created or written (``$VARIANTS_KERNEL_CACHE`` naming a
    file, a read-only place)."""
    try:
        return _build(force)
    except OSError as e:
        where = getattr(e, "filename", None) or cache_root()
        return None, (f"kernel cache {where} unusable ({e.strerror or e}); point "
                      f"${ENV_CACHE} at a writable folder")


def _build(force):
    folder = cache_root() / key()
    target, failed = _target(folder), folder / "FAILED"
    if target.exists() and not force:
        return target, None
    if failed.exists() and not force:
        return None, failed.read_text().strip()
    lack = missing_tools()
    if lack:
        return None, "missing " + ", ".join(lack)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait for it
        if target.exists() and not force:
            return target, None
        import nanobind
        import mlx

        mlx_root = Path(list(mlx.__path__)[-1])
        log = folder / "build.log"
        with tempfile.TemporaryDirectory(dir=folder) as tmp, open(log, "w") as out:
            cmds = [["cmake", "-S", str(HERE), "-B", tmp, f"-DPython_EXECUTABLE={sys.executable}",
                     f"-Dnanobind_ROOT={nanobind.cmake_dir()}", f"-DMLX_ROOT={mlx_root}",
                     f"-DMLX_DIR={mlx_root / 'share' / 'cmake' / 'MLX'}"],
                    ["cmake", "--build", tmp, "-j", str(min(os.cpu_count() or 1, 4))]]
            for cmd in cmds:
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
                if rc != 0:
                    why = f"build failed ({cmd[0]} {cmd[1]} exit {rc}; log: {log})"
                    failed.write_text(why + "\n")
                    return None, why
            built = _target(Path(tmp))
            if not built.exists():
                why = f"build produced no {built.name} (log: {log})"
                failed.write_text(why + "\n")
                return None, why
            tmp_target = folder / (built.name + ".tmp")
            shutil.copy2(built, tmp_target)
            os.replace(tmp_target, target)  # atomic: a reader sees the whole file or none
        failed.unlink(missing_ok=True)
    return target, None


def _import(path):
    """(module, None) of the built file at ``path``, or (None, why) when it cannot be loaded
    (a truncated or foreign file in the cache: the fix is a forced rebuild)."""
    try:
        spec = importlib.util.spec_from_file_location("variants.runtime.qkernel._qkernel", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod, None
    except (ImportError, OSError) as e:
        return None, f"cannot load {path}: {e}; rebuild it with python -m variants.runtime.qkernel --force"


def enabled():
    """False when ``VARIANTS_QKERNEL`` is ``off`` / ``0`` / ``false``, or inside
    :func:`variants.runtime.plain.plain`."""
    from variants.runtime import plain

    if plain.active():
        return False
    from variants.runtime import env

    return env.switch_on(ENV_SWITCH)


def load():
    """The built extension module, building it first if needed; None when it is disabled or
    cannot be built or loaded (one line on stderr, once per process, saying why)."""
    if not enabled():
        return None
    if _state["tried"]:
        return _state["module"]
    _state["tried"] = True
    path, why = build()
    if path is not None:
        mod, why = _import(path)
        if mod is not None:
            from variants.runtime import env

            if env.choice(ENV_ISA) == "baseline":
                mod.allow_avx2(False)
                mod.fused_allow_avx2(False)
            _state["module"] = mod
            return mod
    _state["why"] = why
    print(f"variants: quantized CPU kernel unavailable ({why}); using the MLX unpacking path "
          f"(same results)", file=sys.stderr)
    return None


def why_unavailable():
    """The reason :func:`load` returned None (None when loaded or not tried)."""
    return _state["why"]


def main(argv=None):
    """``python -m variants.runtime.qkernel [--force]``: build now; exit 0 when built, 1 otherwise."""
    argv = sys.argv[1:] if argv is None else argv
    path, why = build(force="--force" in argv)
    if path is not None:
        _, why = _import(path)
        path = None if why else path
    if path is None:
        print(f"qkernel: not built: {why}; quantized Linears use the MLX path", file=sys.stderr)
        return 1
    print(f"qkernel: ok ({path})")
    return 0

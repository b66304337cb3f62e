"""Load an optimised BLAS (OpenBLAS) into the process before MLX is imported.

MLX's Linux CPU wheel links the reference (netlib) BLAS: a 128x768 @ 768x3072 fp32 matmul takes
about 245 ms with it and about 3.5 ms once an OpenBLAS is loaded with ``RTLD_GLOBAL`` *before*
``import mlx``, because the dynamic linker then resolves ``cblas_sgemm`` to OpenBLAS first.

Set ``VARIANTS_BLAS=/path/to/libopenblas.so`` to choose the library, or ``VARIANTS_BLAS=none``
to keep MLX's own BLAS (for A/B measurements).
"""

import ctypes
import ctypes.util
import glob
import os
import sys
import warnings

INSTALL_HINT = "sudo apt-get install -y libopenblas0-pthread"

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

# What happened, recorded in every run's metadata (run.json); "error" is added when the library
# VARIANTS_BLAS names cannot be loaded (``variants`` then exits 2 with it, before any work).
BLAS_INFO = {"library": None, "status": "not attempted"}


def _has_cblas_sgemm(lib):
    try:
        lib.cblas_sgemm
    except AttributeError:
        return False
    return True


def _find_candidates():
    found = [p for p in _CANDIDATES if os.path.exists(p)]
    found += sorted(glob.glob("/usr/lib/*/openblas*/libopenblas*.so*"))
    name = ctypes.util.find_library("openblas")
    if name:
        found.append(name)
    return list(dict.fromkeys(found))


def load_openblas():
    """Load OpenBLAS globally so MLX's ``cblas_*`` calls resolve to it.

    Returns
    -------
    info : dict
        ``{"library": path or None, "status": str}``; also stored in ``BLAS_INFO``.

    Warns
    -----
    UserWarning
        On Linux when no usable OpenBLAS is found (with the command that installs one), or when
        MLX was imported before this ran (the preload then has no effect). A library named by
        ``VARIANTS_BLAS`` that cannot be loaded (or has no ``cblas_sgemm``) is not a warning but
        ``info["error"]``, one line naming the fix: the ``variants`` command exits 2 with it.
    """
    if BLAS_INFO["status"] != "not attempted":
        return BLAS_INFO
    if not sys.platform.startswith("linux"):
        BLAS_INFO.update(status="platform BLAS (not Linux: nothing to load)")
        return BLAS_INFO
    choice = os.environ.get("VARIANTS_BLAS", "").strip()
    if choice.lower() == "none":
        BLAS_INFO.update(status="disabled by VARIANTS_BLAS=none: MLX's reference BLAS")
        return BLAS_INFO
    if "mlx.core" in sys.modules:
        warnings.warn(
            "mlx was imported before variants: OpenBLAS cannot take over MLX's BLAS calls. "
            "Import variants first.",
            stacklevel=3,
        )
    candidates = [choice] if choice else _find_candidates()
    for path in candidates:
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        if _has_cblas_sgemm(lib):
            BLAS_INFO.update(library=os.path.realpath(path), status="OpenBLAS preloaded")
            return BLAS_INFO
    if choice:  # a library the user named that cannot be used: the command line refuses to run
        BLAS_INFO.update(error=f"VARIANTS_BLAS={choice!r} cannot be loaded as a BLAS with "
                               "cblas_sgemm; set it to an OpenBLAS such as "
                               f"{_CANDIDATES[0]}, or to none for MLX's own BLAS")
    BLAS_INFO.update(status="reference BLAS (no OpenBLAS found)")
    if choice:
        return BLAS_INFO
    warnings.warn(
        "No OpenBLAS found: MLX will use its reference BLAS and matmuls run ~70x slower. "
        f"Install one with: {INSTALL_HINT}",
        stacklevel=3,
    )
    return BLAS_INFO

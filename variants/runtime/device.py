"""The device a run computes on: ``--device cpu|gpu`` (default: the ``VARIANTS_DEVICE``
environment variable, else ``cpu``) and ``--dtype float32|float16|bfloat16``, chosen once at the
start (:func:`use`), recorded in run.json and joined to every cache key (:func:`key_part`,
through :meth:`variants.models.decision.DecisionModel.cache_key`).

``gpu`` is MLX's Metal backend on macOS (built into the ``mlx`` wheel) or its CUDA backend on
Linux (``pip install "mlx[cuda13]==0.32.4"``). float16/bfloat16 are allowed only there: MLX's CPU
backend has no BLAS path for them (its half-precision matmuls run element by element).

The CPU-only fast paths ask :func:`is_cpu` whether to run: stream splitting
(:func:`variants.runtime.parallel.streams`), the dequantize + GEMM quantized Linear
(:func:`variants.runtime.qlinear.on_cpu`) and the GEMV layer norm (:func:`variants.runtime.fast_ops.layer_norm`).
"""


import mlx.core as mx

from metrics._checks import short_repr

ENV = "VARIANTS_DEVICE"
DEVICES = ("cpu", "gpu")
DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_DEVICE, DEFAULT_DTYPE = "cpu", "float32"
INSTALL = {"linux": 'pip install "mlx[cuda13]==0.32.4" (CUDA 13 driver needed)',
           "darwin": "Metal is built into the mlx wheel on Apple silicon macOS 14+; "
                     "reinstall mlx there"}

_state = {"dtype": DEFAULT_DTYPE}


class DeviceError(ValueError):
    """A bad or unavailable ``--device`` / ``--dtype``; the message names what was found and
    the fix (one line)."""


def requested(flag=None):
    """The device name asked for: ``flag`` (``--device``), else ``$VARIANTS_DEVICE``, else
    ``cpu``. Raises DeviceError for any other name than ``cpu`` / ``gpu``."""
    if flag is None:
        from variants.runtime import env

        try:
            return env.choice(ENV)
        except env.EnvError as e:
            raise DeviceError(str(e)) from None
    if flag not in DEVICES:
        raise DeviceError(f"--device {short_repr(flag)} is not a device; choose cpu or gpu "
                          "(e.g. --device cpu)")
    return flag


def backend():
    """The GPU backend MLX has here: "metal", "cuda" or None (no GPU backend)."""
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return None


def found():
    """What MLX reports here, for the refusal: Metal, CUDA, the default device."""
    cuda = getattr(mx, "cuda", None)
    has_cuda = "absent" if cuda is None else str(cuda.is_available())
    return (f"mx.metal.is_available()={mx.metal.is_available()}, "
            f"mx.cuda.is_available()={has_cuda}, mx.default_device()={mx.default_device()}, "
            f"mlx {mx.__version__}")


def check(name, dtype=DEFAULT_DTYPE):
    """Refuse a device/dtype pair that cannot run here (before anything is written).

    Raises
    ------
    DeviceError
        ``dtype`` not one of DTYPES; float16/bfloat16 on the CPU; ``gpu`` without a GPU backend
        (the message says what MLX found and the install command)."""
    if dtype not in DTYPES:
        raise DeviceError(f"--dtype {short_repr(dtype)} is not supported; choose one of "
                          f"{', '.join(DTYPES)}")
    if name == "cpu" and dtype != "float32":
        raise DeviceError(f"--dtype {dtype} needs --device gpu: MLX's CPU backend has no BLAS "
                          "path for float16/bfloat16 matmuls; use --dtype float32 on cpu")
    if name == "gpu" and backend() is None:
        import sys

        hint = INSTALL.get(sys.platform, INSTALL["linux"])
        raise DeviceError(f"--device gpu: no GPU backend in MLX here ({found()}); install "
                          f"one: {hint}, or use --device cpu")


def use(name, dtype=DEFAULT_DTYPE):
    """Check (:func:`check`), then make ``name`` MLX's default device for the process and record
    ``dtype`` for :func:`key_part`. Returns ``name``."""
    check(name, dtype)
    mx.set_default_device(mx.gpu if name == "gpu" else mx.cpu)
    _state["dtype"] = dtype
    return name


def current():
    """"cpu" or "gpu": MLX's default device now."""
    return "cpu" if is_cpu() else "gpu"


def is_cpu():
    """Whether MLX's default device is the CPU: the CPU-only fast paths run only then."""
    return mx.default_device().type == mx.cpu


def mx_dtype(name=None):
    """The ``mx.Dtype`` of a DTYPES name (default: the one :func:`use` recorded)."""
    return getattr(mx, name or _state["dtype"])


def key_part():
    """The device part of every cache key and of run.json: ``{"device": "cpu"|"gpu",
    "backend": None|"metal"|"cuda", "dtype": str}`` (the backend only on a GPU: Metal and CUDA
    kernels round differently)."""
    name = current()
    return {"device": name, "backend": None if name == "cpu" else backend(),
            "dtype": _state["dtype"]}


def add_arguments(parser):
    """Add ``--device`` and ``--dtype`` (as ``variants sweep`` has them) to a benchmark's
    argparse ``parser``; :func:`from_args` applies them."""
    parser.add_argument("--device", default=None, metavar="cpu|gpu",
                        help=f"where MLX computes (None = ${ENV}, else cpu)")
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, metavar="|".join(DTYPES),
                        help="parameter dtype (float16/bfloat16 only on gpu)")
    return parser


def from_args(args):
    """:func:`use` the parsed ``--device`` / ``--dtype``; a bad or unavailable one prints its
    one-line DeviceError and exits 2 (nothing run). Returns the device name."""
    import sys

    try:
        return use(requested(args.device), args.dtype)
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

"""Run the encoder on two MLX CPU streams, so element-wise work uses both cores.

MLX's CPU backend runs each element-wise kernel (softmax, GELU, layer norm, adds) on one thread:
the stream's worker. Only the GEMMs (OpenBLAS) use several cores. On a 2-core machine half the
forward therefore ran on one core. Each MLX stream has its own worker thread, so the encoder
(:class:`variants.arch.encoder.BertEncoder`) splits its work over :func:`streams`, with OpenBLAS set
to one thread per GEMM call so the streams' GEMMs do not oversubscribe the cores:

- B >= 2: the batch, by sequences; each part runs the whole layer stack on its own stream and
  the parts are joined once at the end (packed parts when the batch has padding,
  :mod:`variants.runtime.packing`);
- B = 1: each layer's heads and MLP features (tensor parallelism), summed before each norm;
- a direct ``layer(x, bias)`` call (prune and exit variants, hidden states): the batch halves,
  or for B = 1 the query positions, joined after the layer.

Measured in bench/encoder_steps.py and bench/torch_peer.py (docs/peer-benchmarks.md: "MLX vs PyTorch").

``VARIANTS_STREAMS=1`` switches the split off (one stream, OpenBLAS threads left as they are);
``VARIANTS_STREAMS=N`` asks for N streams (default: 2 when the machine has >= 2 cores and MLX's
default device is the CPU). :func:`single_stream` turns it off inside a ``with`` block (activation
capture, per-segment profiling).
"""

import contextlib
import ctypes
import os
import threading

import mlx.core as mx

from variants.runtime import blas as _blas

# Splitting costs two graph branches and a concatenation; below this many rows (B*L) a half is
# too small to pay for it.
MIN_ROWS = 32

# MLX keeps at most 32 MB of freed buffers for reuse by default here; an encoder batch's
# activations are 1-25 MB each, so without more room every step's buffers come back from the OS
# as fresh pages (thousands of page faults per forward). Only raised, never lowered.
CACHE_LIMIT_BYTES = 1 << 30

_state = {"streams": None, "blas_threads": None, "mlx_default_cache_limit": None}
_local = threading.local()


def _requested():
    raw = os.environ.get("VARIANTS_STREAMS", "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            from metrics._checks import short_repr

            raise ValueError(f"VARIANTS_STREAMS must be a whole number >= 1, got "
                             f"{short_repr(raw)}; unset it for the default") from None
        from variants.runtime.env import MAX_STREAMS

        if not 1 <= n <= MAX_STREAMS:
            raise ValueError(f"VARIANTS_STREAMS must be from 1 to {MAX_STREAMS}, got {n}; use 1 "
                             "to switch the two-stream split off")
        return n
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def _set_blas_threads(n):
    path = _blas.BLAS_INFO.get("library")
    if not path:
        return None
    try:
        fn = ctypes.CDLL(path).openblas_set_num_threads
    except (OSError, AttributeError):
        return None
    fn(ctypes.c_int(n))
    return n


def streams():
    """The CPU streams layers split over (a list; length 1 means no split).

    Created once per process. When more than one, OpenBLAS is set to one thread per GEMM call.
    On the CPU, MLX's buffer cache limit is raised to ``CACHE_LIMIT_BYTES`` at the same time.
    """
    from variants.runtime import device

    on_cpu = device.is_cpu()
    if _state["streams"] is not None and _state.get("streams_on_cpu", True) != on_cpu:
        _state["streams"] = None  # the default device changed (--device): no CPU streams on a GPU
    if _state["streams"] is None:
        _state["streams_on_cpu"] = on_cpu
        if on_cpu:
            old = mx.set_cache_limit(CACHE_LIMIT_BYTES)
            _state["mlx_default_cache_limit"] = old
            if old > CACHE_LIMIT_BYTES:
                mx.set_cache_limit(old)
        n = _requested() if on_cpu else 1
        s = [mx.default_stream(mx.default_device())]
        if n > 1:
            s += [mx.new_stream(mx.cpu) for _ in range(n - 1)]
            _state["blas_threads"] = _set_blas_threads(1)
        _state["streams"] = _local.base = _local.streams = s  # this thread's own
    ss = _thread_streams(_state["streams"])
    if getattr(_local, "off", 0):
        return ss[:1]
    return ss


def _thread_streams(first):
    """This thread's own streams, as many as ``first`` (the first caller's): MLX's streams
    belong to the thread that made them (MLX 0.32: another thread's stream raises "There is no
    Stream(cpu, N) in current thread"), so each thread splits over streams of its own (known
    by the thread itself: Python reuses a finished thread's ident)."""
    if getattr(_local, "base", None) is not first:
        _local.base = first
        _local.streams = [mx.default_stream(mx.default_device())] + [
            mx.new_stream(mx.cpu) for _ in range(len(first) - 1)]
    return _local.streams


def info():
    """What the split does in this process, for run metadata: ``{"streams",
    "blas_threads_per_call", "mlx_default_cache_limit", "cache_limit"}`` (bytes)."""
    n = len(streams())
    old = _state["mlx_default_cache_limit"]
    return {"streams": n, "blas_threads_per_call": _state["blas_threads"],
            "mlx_default_cache_limit": old,
            "cache_limit": None if old is None else max(old, CACHE_LIMIT_BYTES)}


def whole_batches():
    """True inside :func:`single_stream`: the encoder then also keeps batches padded (no
    packing, :mod:`variants.runtime.packing`), so per-Linear hooks see whole (B, L, D) inputs."""
    return bool(getattr(_local, "off", 0))


@contextlib.contextmanager
def single_stream():
    """Within the block, :func:`streams` returns one stream (no split) on this thread, and the
    encoder runs whole padded (B, L) batches (:func:`whole_batches`)."""
    _local.off = getattr(_local, "off", 0) + 1
    try:
        yield
    finally:
        _local.off -= 1


def bounds(n, k):
    """Split ``range(n)`` into ``k`` contiguous near-equal parts: a list of (start, stop)."""
    cuts = [round(i * n / k) for i in range(k + 1)]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def validate_env():
    """Check ``VARIANTS_STREAMS`` now (before a sweep writes anything); returns the stream count
    it asks for. Raises ValueError naming the variable and the fix when it is not a whole
    number >= 1."""
    return _requested()

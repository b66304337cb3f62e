"""Three memory numbers, never mixed: MLX's allocator peak, MLX's buffer cache and the process's
resident set.

- **allocator peak** (``mx.get_peak_memory``): the most bytes MLX's arrays held at once since the
  last ``mx.reset_peak_memory``; every live array counts (weights of every model loaded).
- **cache** (``mx.get_cache_memory``): bytes MLX keeps allocated for reuse after arrays are freed;
  not in the peak, but held by the process. It grows with everything the process ran (over 1 GB
  after a sweep's quality forwards), so the timing harness empties it before each measurement
  (:func:`variants.runtime.warmth.clear_buffer_cache`); only then is it that measurement's own.
- **process RSS** (``psutil.Process().memory_info().rss``): the resident set of the whole process
  as the operating system sees it: the interpreter, every imported library (NumPy, OpenBLAS,
  pandas...), tokenizer, MLX arrays and cache. It is what a user's machine must provide.

A forward of MiniLM at B=32 here: allocator peak ~155 MB, cache ~38 MB, RSS ~470 MB (cache and RSS
re-measured with one model loaded: 37.9 MB and 472 MB, MLX 0.32.4, a 2-core Xeon), so a report
that gives only the first understates what serving costs.
"""

import mlx.core as mx
from mlx.utils import tree_flatten
import psutil

_PROCESS = psutil.Process()


def process_rss_bytes():
    """Resident set size of this process now, bytes (int)."""
    return int(_PROCESS.memory_info().rss)


def process_peak_rss_bytes():
    """This process's peak resident set so far, bytes (int): ``VmHWM`` of /proc/self/status
    (reset by exec, unlike ``ru_maxrss``, which a spawned child inherits from its parent);
    ``ru_maxrss`` where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def snapshot():
    """{"peak_bytes", "cache_bytes", "active_bytes", "rss_bytes"}: MLX's allocator peak (since
    the last reset), cache and active bytes, and the process RSS, now (ints, bytes)."""
    return {"peak_bytes": int(mx.get_peak_memory()), "cache_bytes": int(mx.get_cache_memory()),
            "active_bytes": int(mx.get_active_memory()), "rss_bytes": process_rss_bytes()}


def model_bytes(model):
    """Bytes of a DecisionModel's parameters as stored (quantized layers: packed weights +
    scales + biases; fp32 elsewhere). An array the module tree reaches twice is stored once and
    counted once (the student family's student shares the teacher's embeddings and head). A
    module holding its weights outside MLX says how many bytes in an int ``external_bytes``
    attribute (an ONNX Runtime encoder: its graph file, :mod:`variants.onnx.session`); those
    are added."""
    arrays = {id(v): v for _, v in tree_flatten(model.module.parameters())}
    external = sum(m.external_bytes for _, m in model.module.named_modules()
                   if isinstance(getattr(m, "external_bytes", None), int))
    return int(sum(v.nbytes for v in arrays.values())) + int(external)

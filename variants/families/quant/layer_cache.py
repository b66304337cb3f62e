"""The per-layer cache of the learned quantizers (AWQ, GPTQ): one Linear's learned tensors, keyed
by everything that Linear's learning reads.

AWQ and GPTQ learn each Linear on its own: the result is a function of the layer's weight W, its
width and group size, the method and its settings, and the statistics of its input site (the
Gram matrix Σ x xᵀ, Σ |x| and the token count). Those statistics are collected once on the
**fp32 reference** (:func:`variants.arch.activations.cached_collect`: every Linear sees the
reference's activations, not those of an already-quantized prefix), so a layer's result does not
depend on how the other layers are quantized. Two bit maps that give a Linear the same width
therefore share its entry: a search that walks many maps learns each (layer, width) once.

Entries are ``cache_dir/quant/layers/<method>-<key>.npz`` (codes, scales, biases, the AWQ input
scale when there is one, and the layer's report row with its learning seconds). The key hashes
the bytes of W and of the site's statistics (SHA-256), so an entry is never read for inputs it
was not learned from. DWQ trains all layers together and is cached whole
(:mod:`variants.families.quant.learned`).
"""

import hashlib
import json
from pathlib import Path

import numpy as np

VERSION = 1


def _digest(*parts):
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, np.ndarray):
            a = np.ascontiguousarray(p)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes())
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"|")
    return h.hexdigest()


def site_fingerprint(stats):
    """SHA-256 (hex) of one input site's :class:`~variants.arch.activations.LinearStats`
    (gram, abs_sum, count): what AWQ and GPTQ read of the activations."""
    return _digest(np.asarray(stats.gram), np.asarray(stats.abs_sum), int(stats.count))


def layer_key(W, site, method, settings, bits, group_size):
    """The cache key (hex) of one Linear's learning: its weight ``W`` (o, n) (float32 bytes),
    the ``site`` fingerprint (:func:`site_fingerprint`), ``method``, its ``settings`` (dict),
    ``bits``, ``group_size`` and this module's version."""
    return _digest(np.asarray(W, np.float32), site, method, settings, int(bits), int(group_size),
                   VERSION)


def path_of(cache_dir, method, key):
    """``cache_dir/quant/layers/<method>-<key>.npz``."""
    return Path(cache_dir) / "quant" / "layers" / f"{method}-{key[:32]}.npz"


def load(cache_dir, method, key):
    """``((codes, scales, biases, input_scale|None), row)`` of the entry, or None when there is
    none (or it cannot be read: it is then learned again and overwritten)."""
    path = path_of(cache_dir, method, key)
    if not path.exists():
        return None
    try:
        with np.load(path) as z:
            if str(z["key"]) != key:
                return None
            row = json.loads(str(z["row"]))
            inv = z["input_scale"] if "input_scale" in z else None
            return (z["codes"], z["scales"], z["biases"], inv), row
    except (OSError, KeyError, ValueError):
        return None


def save(cache_dir, method, key, tensors, row):
    """Write one entry: ``tensors`` (codes, scales, biases, input_scale|None) and ``row``
    (JSON-able: the layer's report row)."""
    from runs.io import write_npz

    codes, scales, biases, inv = tensors
    arrays = {"key": np.array(key), "row": np.array(json.dumps(row)), "codes": codes,
              "scales": scales, "biases": biases}
    if inv is not None:
        arrays["input_scale"] = inv
    path = path_of(cache_dir, method, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_npz(path, arrays)

"""The exact family's builder: de-duplication, a result cache, output selection (MLX).

- ``dedup``: within one ``forward(batch)`` the rows with equal keys
  (:func:`variants.families.exact.keys.row_keys`) run once, as one smaller batch of the unique
  rows (same padded length: the longest row is among them), and their logits are gathered back
  to every original row. A batch without duplicates runs unchanged (bit-identical logits); with
  duplicates the smaller batch may round differently (float round-off, measured ~1e-7).
- ``cache``: the same, plus an in-memory LRU across calls (:class:`ResultCache`) keyed by the
  model fingerprint (:func:`namespace_of`: weights, dtype, device, execution config, model
  config) and the row key; only the unique misses of a call run. A hit returns logits computed
  in another batch (other padding / batch size): float round-off.
- ``outsel``: :mod:`variants.families.exact.outsel` (last layer at the read positions only).
- ``null-control``: the null control, the reference's ``forward`` called inside
  :func:`variants.runtime.plain.plain` (the compiled layers and kernels off): the reference on a
  second compute path, float round-off.

The variant is the reference ``DecisionModel`` with its class swapped for a subclass whose
``forward`` does the above around the reference's own ``forward`` (any decision model: its
``option_index``, ``extra`` arrays and forward are reused as they are).
"""

import hashlib

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from variants.arch import compute_path
from variants.runtime import device, parallel
from variants.families.exact.keys import ResultCache, dedup, row_keys
from variants.models.decision import PreparedBatch


def namespace_of(model):
    """16-byte digest of what makes a model's logits: every parameter (name, shape, dtype and
    bytes: the checkpoint revision and fitted head as loaded), the device and dtype
    (:func:`variants.runtime.device.key_part`), the execution config (stream count, whole-batch mode)
    and the model's :meth:`config` (temperatures excluded: the cache holds raw logits)."""
    h = hashlib.blake2b(digest_size=16)
    for name, v in tree_flatten(model.module.parameters()):
        a = np.array(v.astype(mx.float32)) if v.dtype == mx.bfloat16 else np.array(v)
        h.update(repr((name, a.shape, str(v.dtype))).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    cfg = {k: v for k, v in model.config().items() if k != "temperatures"}
    h.update(repr((type(model).__qualname__, sorted(cfg.items(), key=str), device.key_part(),
                   compute_path.key_part(),
                   len(parallel.streams()), parallel.whole_batches())).encode())
    return h.digest()


def take_rows(batch, rows):
    """The :class:`PreparedBatch` of ``rows`` (int array) of ``batch`` (same padded length)."""
    r = mx.array(np.asarray(rows, np.int32))
    sub = PreparedBatch(np.asarray(batch.index)[rows], batch.input_ids[r],
                        batch.attention_mask[r], batch.token_type_ids[r], batch.option_index[r],
                        0, {k: v[r] for k, v in batch.extra.items()})
    sub.n_tokens = int(np.array(sub.attention_mask).sum())
    return sub


def batch_arrays(batch):
    """{name: np.ndarray} of everything a row key covers (:func:`row_keys`)."""
    out = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
           "token_type_ids": batch.token_type_ids, "option_index": batch.option_index}
    out.update({f"extra.{k}": v for k, v in batch.extra.items()})
    return {k: np.array(v) for k, v in out.items()}


class ExactMixin:
    """``forward`` with de-duplication (and, when ``exact_cache`` is set, the result cache)
    around the decision model's own ``forward``. ``exact_stats``: cumulative ``calls``,
    ``rows`` (N), ``unique`` (U, per call summed), ``cache_hits`` (rows found in the cache),
    ``computed`` (rows run through the model)."""

    exact_cache = None
    exact_namespace = b""

    def exact_reset(self, clear_cache=True):
        """Zero the counters (and empty the cache)."""
        self.exact_stats = dict(calls=0, rows=0, unique=0, cache_hits=0, computed=0)
        if clear_cache and self.exact_cache is not None:
            self.exact_cache.clear()

    def forward(self, batch):
        keys = row_keys(batch_arrays(batch), self.exact_namespace)
        first, inverse = dedup(keys)
        st = self.exact_stats
        st["calls"] += 1
        st["rows"] += len(keys)
        st["unique"] += len(first)
        base = super().forward
        if self.exact_cache is None:
            st["computed"] += len(first)
            if len(first) == len(keys):
                return base(batch)  # nothing repeated: the reference's own call, bit-identical
            return base(take_rows(batch, first))[mx.array(inverse.astype(np.int32))]
        cache = self.exact_cache
        found = {}
        for r in first:
            row = cache.get(keys[r])
            if row is not None:
                found[keys[r]] = row
        st["cache_hits"] += sum(keys[r] in found for r in range(len(keys)))
        miss = np.array([r for r in first if keys[r] not in found], np.int64)
        st["computed"] += len(miss)
        if len(miss):
            sub = batch if len(miss) == len(keys) else take_rows(batch, miss)
            logits = np.array(base(sub).astype(mx.float32))
            for r, row in zip(miss, logits):
                found[keys[r]] = row
                cache.put(keys[r], row)
        return mx.array(np.stack([found[k] for k in keys]))


_CLASSES = {}
_NULL_CLASSES = {}


class NullMixin:
    """``forward`` of the reference on the plain MLX path (:mod:`variants.runtime.plain`),
    evaluated inside the block."""

    def forward(self, batch):
        from variants.runtime import plain

        with plain.plain():
            out = super().forward(batch)
            mx.eval(out)
        return out


def null_model(reference):
    """A copy of ``reference`` (same module, tokenizer, temperatures) whose forward runs on the
    plain MLX path: the null control."""
    cls = type(reference)
    if cls not in _NULL_CLASSES:
        _NULL_CLASSES[cls] = type(f"Null{cls.__name__}", (NullMixin, cls), {})
    var = reference.replace_module(reference.module)
    var.__class__ = _NULL_CLASSES[cls]
    return var


def exact_model(reference, cache_size=None):
    """A copy of ``reference`` (same module, tokenizer, temperatures) whose forward de-duplicates
    rows, and with ``cache_size`` also caches them across calls (LRU of that many rows)."""
    cls = type(reference)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Exact{cls.__name__}", (ExactMixin, cls), {})
    var = reference.replace_module(reference.module)
    var.__class__ = _CLASSES[cls]
    var.exact_namespace = namespace_of(reference)
    var.exact_cache = None if cache_size is None else ResultCache(cache_size)
    var.exact_reset()
    return var


class MissPath:
    """A cache variant as the common alternated timing sees it: its cache emptied at the start
    of every ``raw_logits`` call (inside the timed region; an OrderedDict clear), so repeating
    one request times the miss path, not hits. Every other attribute is the variant's."""

    def __init__(self, variant):
        self._variant = variant

    def __getattr__(self, name):
        return getattr(self._variant, name)

    def raw_logits(self, *args, **kwargs):
        self._variant.exact_cache.clear()
        return self._variant.raw_logits(*args, **kwargs)


def timed_variant(variant, cfg):
    """What the common timing calls: :class:`MissPath` for a cache variant, else ``variant``."""
    return MissPath(variant) if cfg.kind == "cache" else variant


def check_model(module, cfgs):
    """Reject configs the model cannot take (only ``outsel`` has limits:
    :func:`variants.families.exact.outsel.reads_of`)."""
    if any(c.kind == "outsel" for c in cfgs):
        from variants.families.exact.outsel import reads_of

        reads_of(module)


def build(reference, cfg, mode="simulated"):
    """The variant of ``cfg`` (an ExactConfig) and its build.json dict.

    Returns
    -------
    variant : DecisionModel
    info : dict
        ``kind``, ``exactness`` (what the logits equal), ``cache_size``, ``model_bytes``,
        ``namespace`` (hex of the cache's model fingerprint), for outsel ``reads`` and
        ``n_layers``.

    Raises
    ------
    ValueError
        ``outsel`` on a module whose output reads every position (mean pooling) or on an
        encoder without the query-subset layer call.
    """
    info = {"kind": cfg.kind, "cache_size": cfg.cache_size, "mode": "exact (mode not applicable)",
            "model_bytes": int(sum(v.nbytes for _, v in
                                   tree_flatten(reference.module.parameters()))),
            "bits_per_weight": 32.0, "bits_per_weight_note": "fp32 weights (not changed)"}
    if cfg.kind == "outsel":
        from variants.families.exact.outsel import OutputSelectNet, reads_of

        reads = reads_of(reference.module)
        var = reference.replace_module(OutputSelectNet(reference.module, reads))
        info.update(reads=reads, n_layers=len(reference.module.encoder.layers),
                    exactness="float round-off: the last layer's query, attention output and "
                              "MLP run on the read positions only (smaller matrix products)")
        return var, info
    if cfg.kind == "null-control":
        info["exactness"] = ("float round-off: the reference's own weights on the plain MLX path "
                             "(compiled layers and kernels off); the null control")
        return null_model(reference), info
    var = exact_model(reference, cfg.cache_size if cfg.kind == "cache" else None)
    info["namespace"] = var.exact_namespace.hex()
    info["exactness"] = (
        "bit-identical for a batch without repeats (the reference's own call); float round-off "
        "where a smaller batch of the unique rows runs" if cfg.kind == "dedup" else
        "float round-off: a hit returns logits computed in another batch (other padding and "
        "batch size); misses as dedup")
    return var, info

"""Activation statistics of Linear inputs (XᵀX in float64 and mean |x|) over a calibration split.

The second-moment matrix G = Σ_t x_t x_tᵀ over real (unpadded) tokens t is what activation-aware
compression minimises against: ‖(W − Ŵ) X‖_F² = tr((W − Ŵ) G (W − Ŵ)ᵀ) (SVD-LLM, Wang et al.
2024, §3.1); mean |x| per channel is ASVD's scaling statistic (Yuan et al. 2023, §3.2).
"""

import copy
import hashlib
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from threadpoolctl import threadpool_limits

from variants.runtime import parallel
from runs.io import write_npz

STATS_VERSION = 1  # bump when the accumulation changes: part of the cache key


@dataclass
class LinearStats:
    """Statistics of one Linear input site.

    ``gram`` (n, n) float64: Σ_t x_t x_tᵀ over real tokens; ``abs_sum`` (n,) float64: Σ_t |x_t|;
    ``count``: number of tokens t. Several Linears reading the same tensor (query, key, value)
    share one site.
    """

    gram: np.ndarray
    abs_sum: np.ndarray
    count: int

    @property
    def second_moment(self):
        """(n, n) float64 E[x xᵀ] = gram / count."""
        return self.gram / max(self.count, 1)

    @property
    def mean_abs(self):
        """(n,) float64 E|x| per input channel."""
        return self.abs_sum / max(self.count, 1)


def input_site(path):
    """The site whose input ``path`` reads: query/key/value of one attention block share theirs."""
    head, _, last = path.rpartition(".")
    if last in ("query", "key", "value") and head.endswith("attention"):
        return f"{head}.qkv"
    return path


def _get(root, path):
    node = root
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else getattr(node, part)
    return node


def set_module(root, path, new):
    """Replace the submodule at dotted ``path`` (list items by index) of ``root`` in place."""
    parent_path, _, last = path.rpartition(".")
    parent = _get(root, parent_path) if parent_path else root
    if isinstance(parent, list):
        parent[int(last)] = new
    else:
        setattr(parent, last, new)


class _Recorder(nn.Module):
    """Wraps an nn.Linear: records its input's statistics, then applies it unchanged."""

    def __init__(self, linear, site, sink):
        super().__init__()
        self.linear = linear
        self._site = site
        self._sink = sink

    def __call__(self, x):
        self._sink.record(self._site, x)
        return self.linear(x)


class _MaskGrabber(nn.Module):
    """Top-level wrapper: remembers the (B, L) attention mask of each module call."""

    def __init__(self, inner, sink):
        super().__init__()
        self.inner = inner
        self._sink = sink

    def __call__(self, input_ids, attention_mask, *args, **kwargs):
        self._sink.mask = np.array(attention_mask).astype(bool)
        self._sink.seen_this_call = set()
        return self.inner(input_ids, attention_mask, *args, **kwargs)


class _Sink:
    def __init__(self):
        self.mask = None
        self.seen_this_call = set()
        self.stats = {}

    def record(self, site, x):
        if site in self.seen_this_call:  # key/value after query: the same tensor
            return
        self.seen_this_call.add(site)
        a = np.array(x.astype(mx.float32), dtype=np.float64)
        if self.mask is None or a.shape[:-1] != self.mask.shape:
            raise ValueError(f"activation capture at {site}: input of shape {a.shape} does not "
                             f"match the attention mask {None if self.mask is None else self.mask.shape}; "
                             "the model's module must be called as module(input_ids, attention_mask, ...)")
        rows = a[self.mask]  # (T, n): real tokens only, padding would bias XᵀX
        s = self.stats.get(site)
        if s is None:
            n = rows.shape[-1]
            s = self.stats[site] = LinearStats(np.zeros((n, n)), np.zeros(n), 0)
        # one BLAS thread: NumPy's and MLX's OpenBLAS pools contend on few cores
        with threadpool_limits(1, user_api="blas"):
            s.gram += rows.T @ rows
        s.abs_sum += np.abs(rows).sum(axis=0)
        s.count += rows.shape[0]


def target_linears(module, *, prefix="encoder.layers."):
    """Paths of the nn.Linear layers under ``prefix`` (the encoder's; embeddings and head
    excluded), layer by layer in forward order: BERT/RoBERTa ``attention.query/key/value/out``,
    ``intermediate``, ``output``; ModernBERT ``attn.Wqkv`` (q|k|v fused: one input site),
    ``attn.Wo``, ``mlp.Wi`` (input|gate), ``mlp.Wo``."""
    paths = [p for p, m in module.named_modules()
             if type(m) is nn.Linear and p.startswith(prefix)]
    order = {"query": 0, "key": 1, "value": 2, "out": 3, "intermediate": 4, "output": 5,
             "Wqkv": 0, "Wi": 1, "Wo": 3}
    return sorted(paths, key=lambda p: [(int(t), 0) if t.isdigit() else (order.get(t, 9), t)
                                        for t in p.split(".")])


def module_fingerprint(module):
    """Hex SHA-256 (16) over every parameter's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name, v in sorted(tree_flatten(module.parameters()), key=lambda kv: kv[0]):
        a = np.array(v)
        h.update(f"{name}|{a.dtype}|{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def collect(model, taskset, *, paths=None, batch_size=32):
    """Accumulate input statistics of ``paths`` over ``taskset``, masking padded positions.

    Parameters
    ----------
    model : variants.models.decision.DecisionModel
        Its ``forward`` must call ``model.module(input_ids, attention_mask, ...)`` (both shipped
        models do). The model and its module are not modified.
    taskset : variants.datasets.tasks.TaskSet
        The calibration split.
    paths : list of str, optional
        Linear paths to record; default :func:`target_linears`.
    batch_size : int, default=32

    Returns
    -------
    dict {site: LinearStats}
        One entry per :func:`input_site` of ``paths``.

    Raises
    ------
    ValueError
        No calibration data (empty or None ``taskset``), a path that is not an nn.Linear, a call
        whose shapes do not match the attention mask, or non-finite activations.
    """
    if taskset is None or len(taskset) == 0:
        raise ValueError("no calibration data: activation statistics need a non-empty "
                         "calibration TaskSet (e.g. --n-calibration 800)")
    paths = target_linears(model.module) if paths is None else list(paths)
    if not paths:
        raise ValueError("no Linear layer to record: paths is empty")
    sink = _Sink()
    inner = copy.deepcopy(model.module)
    mods = dict(inner.named_modules())
    for p in paths:
        if type(mods.get(p)) is not nn.Linear:
            raise ValueError(f"{p!r} is not an nn.Linear of the model's module")
        set_module(inner, p, _Recorder(mods[p], input_site(p), sink))
    recording = model.replace_module(_MaskGrabber(inner, sink))
    batches, _ = recording.prepare(taskset, batch_size)
    with parallel.single_stream():  # the recorder needs whole (B, L) batches, not halves
        for b in batches:
            mx.eval(recording.forward(b))
    for site, s in sink.stats.items():
        if not (np.isfinite(s.gram).all() and np.isfinite(s.abs_sum).all()):
            raise ValueError(f"activation statistics at {site} are not finite")
    missing = {input_site(p) for p in paths} - set(sink.stats)
    if missing:
        raise ValueError(f"layers {sorted(missing)} were never called by model.forward")
    return sink.stats


def stats_key(model, taskset, batch_size=32):
    """Cache key: module weights, calibration data, batch size, version, model config and
    tokenizer settings (:meth:`variants.models.decision.DecisionModel.cache_key`)."""
    return model.cache_key(module_fingerprint(model.module), taskset.fingerprint(), batch_size,
                           "float64", STATS_VERSION)


def save_stats(path, stats):
    """Write ``stats`` ({site: LinearStats}) atomically to an .npz file."""
    arrays = {}
    for site, s in stats.items():
        arrays[f"{site}|gram"] = s.gram
        arrays[f"{site}|abs_sum"] = s.abs_sum
        arrays[f"{site}|count"] = np.array(s.count, np.int64)
    return write_npz(path, arrays)


def load_stats(path, sites=None):
    """Read what :func:`save_stats` wrote ({site: LinearStats}); ``sites`` must all be there.
    Raises ``runs.readers.CorruptFileError`` naming the file when it is not valid."""
    from runs.npz_readers import read_activation_stats

    return {site: LinearStats(g, a, c)
            for site, (g, a, c) in read_activation_stats(path, sites).items()}


def cached_collect(model, taskset, *, cache_dir=None, batch_size=32, log=None):
    """:func:`collect`, read from / written to ``cache_dir/activations/<model>-<key>.npz``."""
    if taskset is None or len(taskset) == 0:
        return collect(model, taskset)  # raises the "no calibration data" error
    if cache_dir is None:
        return collect(model, taskset, batch_size=batch_size)
    from pathlib import Path

    path = Path(cache_dir) / "activations" / f"{model.name}-{stats_key(model, taskset, batch_size)}.npz"
    if path.exists():
        if log:
            log(f"activation statistics loaded from {path}")
        return load_stats(path, {input_site(p) for p in target_linears(model.module)})
    stats = collect(model, taskset, batch_size=batch_size)
    save_stats(path, stats)
    if log:
        log(f"activation statistics cached in {path}")
    return stats

"""Exact savings on repeated work: row keys, in-call de-duplication and an LRU result cache.

No MLX here (NumPy + hashlib), so the accounting is testable on hand-made arrays.

A *row key* identifies one prepared input row by everything the model reads of it: the token
ids, the attention mask and the token types up to the row's last real token (trailing padding
dropped: masked keys add exactly 0 to attention, so the padded length changes the logits only by
float round-off), every per-row array of width ≠ L (``option_index`` (K,), a marker model's
``marker_pos`` (K,)) in full, and the option count K (the temperature bucket). Two rows that
differ in any of these, e.g. only in the mask or only in a marker position, get different keys.
"""

import hashlib
from collections import OrderedDict

import numpy as np

TOKEN_ARRAYS = ("input_ids", "attention_mask", "token_type_ids")


def row_keys(arrays, namespace=b""):
    """One key (bytes, 20-byte BLAKE2b digest) per row of a prepared batch.

    Parameters
    ----------
    arrays : dict {name: np.ndarray}
        ``input_ids``, ``attention_mask``, ``token_type_ids`` (B, L) and ``option_index``
        (B, K) are required; any other entry (a PreparedBatch's ``extra``, e.g. ``marker_pos``
        (B, K)) is keyed in full by name.
    namespace : bytes
        Prefix of every key (the model fingerprint of :func:`namespace_of`).

    Returns
    -------
    list of bytes, length B.

    Raises
    ------
    ValueError
        A required array is missing or arrays disagree on B.
    """
    missing = [n for n in TOKEN_ARRAYS + ("option_index",) if n not in arrays]
    if missing:
        raise ValueError(f"row_keys needs {', '.join(missing)}")
    arrs = {n: np.ascontiguousarray(np.asarray(a)) for n, a in sorted(arrays.items())}
    B = arrs["input_ids"].shape[0]
    if any(a.shape[0] != B for a in arrs.values()):
        raise ValueError(f"prepared arrays disagree on the batch size: "
                         f"{ {n: a.shape for n, a in arrs.items()} }")
    mask = arrs["attention_mask"]
    real = mask != 0
    # up to the last real token (a row of padding only keeps length 0)
    n_keep = np.where(real.any(axis=1), mask.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)
    k = (arrs["option_index"] >= 0).sum(axis=1)
    keys = []
    for r in range(B):
        h = hashlib.blake2b(namespace, digest_size=20)
        h.update(b"K%d;n%d;" % (k[r], n_keep[r]))
        for name, a in arrs.items():
            row = a[r, :n_keep[r]] if name in TOKEN_ARRAYS else a[r]
            h.update(name.encode() + repr((row.shape, row.dtype.str)).encode())
            h.update(row.tobytes())
        keys.append(h.digest())
    return keys


def dedup(keys):
    """The first row of each distinct key and the map back.

    Returns
    -------
    first : np.ndarray (U,) int64
        Row of the first occurrence of each distinct key, in order of first occurrence.
    inverse : np.ndarray (B,) int64
        ``first[inverse[r]]`` holds the same key as row ``r``: outputs of the U unique rows,
        indexed by ``inverse``, give every original row its own output, in order.
    """
    seen, first, inverse = {}, [], []
    for r, k in enumerate(keys):
        if k not in seen:
            seen[k] = len(first)
            first.append(r)
        inverse.append(seen[k])
    return np.array(first, np.int64), np.array(inverse, np.int64)


class ResultCache:
    """An in-memory LRU map key -> one row's raw logits (np.ndarray (K,) float32).

    Counters (cumulative): ``lookups``, ``hits`` (found), ``stores``, ``evictions``.

    Parameters
    ----------
    maxsize : int >= 1
        Entries kept; the least recently used (looked up or stored) is evicted first.

    Raises
    ------
    ValueError
        ``maxsize`` < 1.
    """

    def __init__(self, maxsize):
        if int(maxsize) != maxsize or maxsize < 1:
            raise ValueError(f"cache size {maxsize!r} must be an integer >= 1; pass e.g. "
                             "--cache-sizes 4096")
        self.maxsize = int(maxsize)
        self._data = OrderedDict()
        self.lookups = self.hits = self.stores = self.evictions = 0

    def __len__(self):
        return len(self._data)

    def get(self, key):
        """The stored row, marked most recently used, or None (a miss)."""
        self.lookups += 1
        row = self._data.get(key)
        if row is not None:
            self._data.move_to_end(key)
            self.hits += 1
        return row

    def put(self, key, row):
        """Store ``row`` under ``key`` (most recently used); evict beyond ``maxsize``."""
        self._data[key] = row
        self._data.move_to_end(key)
        self.stores += 1
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)
            self.evictions += 1

    def clear(self):
        """Drop every entry (counters kept)."""
        self._data.clear()

    def counters(self):
        return {"lookups": self.lookups, "hits": self.hits, "stores": self.stores,
                "evictions": self.evictions, "size": len(self._data), "maxsize": self.maxsize}

"""Deterministic splits of the VADER items (fit / calibration / eval by id hash) and seeded,
domain-stratified samples of a split. The corpus reader is :mod:`variants.datasets.bundled`."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from variants.datasets.labels import _domain_order

SPLITS = ("fit", "calibration", "eval")
SPLIT_FRACTIONS = {"fit": 0.6, "calibration": 0.2, "eval": 0.2}


def _unit_hash(keys, salt: str = "") -> np.ndarray:
    """Map each string to a float64 in [0, 1) via the first 8 bytes of its sha256."""
    out = np.empty(len(keys), dtype=np.float64)
    for i, key in enumerate(keys):
        digest = hashlib.sha256(f"{salt}{key}".encode("utf-8")).digest()
        out[i] = int.from_bytes(digest[:8], "big") / 2.0**64
    return out


def _check_frame(df: pd.DataFrame, required: tuple[str, ...]) -> None:
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df must be a pandas DataFrame, got {type(df).__name__}.")
    missing = [name for name in required if name not in df.columns]
    if missing:
        raise ValueError(f"df lacks column(s) {missing}; pass a frame from load_vader().")


def assign_split(ids) -> np.ndarray:
    """Split name of each id, from the sha256 of the id alone (stable, order-independent).

    Parameters
    ----------
    ids : array-like of str, shape (n_items,)

    Returns
    -------
    splits : ndarray of object (str) of shape (n_items,)
        ``"fit"`` if ``u < 0.6``, ``"calibration"`` if ``u < 0.8``, else ``"eval"``, where
        ``u`` is the first 8 bytes of ``sha256(id.encode("utf-8"))`` read big-endian / 2**64.
    """
    u = _unit_hash([str(i) for i in ids])
    bounds = np.cumsum([SPLIT_FRACTIONS[name] for name in SPLITS])[:-1]
    return np.asarray(SPLITS, dtype=object)[np.searchsorted(bounds, u, side="right")]


def split_frame(df: pd.DataFrame, split: str) -> pd.DataFrame:
    """Rows of ``df`` in one split (fit 0.6 / calibration 0.2 / eval 0.2 by id hash).

    Parameters
    ----------
    df : pandas.DataFrame with an ``id`` column
    split : {'fit', 'calibration', 'eval'}

    Returns
    -------
    part : pandas.DataFrame
        The matching rows in their input order, index reset.

    Raises
    ------
    ValueError
        If ``split`` is not in ``SPLITS`` or ``df`` has no ``id`` column.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    _check_frame(df, ("id",))
    mask = assign_split(df["id"].to_numpy()) == split
    return df.loc[mask].reset_index(drop=True)


def _allocate(counts: np.ndarray, n: int) -> np.ndarray:
    """Largest-remainder allocation of ``n`` over strata proportional to ``counts``."""
    quota = n * counts / counts.sum()
    take = np.floor(quota).astype(np.int64)
    order = np.argsort(-(quota - take), kind="stable")  # ties: earlier stratum first
    take[order[: n - take.sum()]] += 1
    return np.minimum(take, counts)


def sample(df: pd.DataFrame, n: int, *, seed: int = 0) -> pd.DataFrame:
    """Deterministic subsample of at most ``n`` rows, stratified by domain in proportion.

    Each domain gets its largest-remainder share of ``n``; inside a domain the rows with the
    smallest ``sha256(f"{seed}:{id}")`` are kept, so the choice does not depend on row order
    and a larger ``n`` keeps every row a smaller ``n`` chose (for the same per-domain share).

    Parameters
    ----------
    df : pandas.DataFrame with ``id`` and ``domain`` columns
    n : int
        Maximum number of rows, ``n >= 0``. ``n >= len(df)`` returns every row.
    seed : int, default=0
        Salt of the hash; a different seed picks a different subsample.

    Returns
    -------
    subsample : pandas.DataFrame of min(n, len(df)) rows, sorted by ``id``, index reset.

    Raises
    ------
    ValueError
        If ``n`` is negative or not an integer, or ``df`` lacks ``id``/``domain``.
    """
    _check_frame(df, ("id", "domain"))
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}.")
    if n >= len(df):
        return df.sort_values("id", kind="stable").reset_index(drop=True)
    domains = np.asarray(sorted(df["domain"].unique(), key=_domain_order))
    counts = np.asarray([(df["domain"] == d).sum() for d in domains], dtype=np.int64)
    take = _allocate(counts, int(n))
    key = _unit_hash(df["id"].astype(str).to_numpy(), salt=f"{seed}:")
    keep = np.zeros(len(df), dtype=bool)
    for domain, k in zip(domains, take):
        rows = np.flatnonzero(df["domain"].to_numpy() == domain)
        keep[rows[np.argsort(key[rows], kind="stable")[:k]]] = True
    return df.loc[keep].sort_values("id", kind="stable").reset_index(drop=True)


def check_sample_size(df: pd.DataFrame, n: int, *, split: str, flag: str) -> None:
    """Refuse a sample size larger than the split, before :func:`sample` would quietly return
    every row while the caller records ``n``.

    Parameters
    ----------
    df : pandas.DataFrame
        The split's rows (``split_frame(load_vader(), split)``).
    n : int
        Requested examples.
    split : str
        Split name for the message, e.g. ``"eval"``.
    flag : str
        Command-line flag that set ``n``, e.g. ``"--n-eval"``.

    Raises
    ------
    ValueError
        ``n > len(df)``; one line naming the flag, the requested and the available count and
        the fix, e.g. "--n-eval 1000000 is more than the 4784 examples of the eval split; pass
        --n-eval 4784 or less".
    """
    if n > len(df):
        raise ValueError(f"{flag} {n} is more than the {len(df)} examples of the {split} split; "
                         f"pass {flag} {len(df)} or less")

"""Real labelled text: the VADER human-rated sentiment corpora, deterministic splits and labels.

The corpora are the four rated sets of Hutto & Gilbert (2014), vendored byte-for-byte under
``data/vader/`` (see ``data/README.md``). Every item carries the integer score of each human
rater (-4..4), so a label and a human label distribution can be derived with the same bins.

References
----------
.. [1] C.J. Hutto and E. Gilbert, "VADER: A Parsimonious Rule-based Model for Sentiment Analysis
   of Social Media Text", ICWSM 2014, Sec. "Ground Truth in Multiple Domain Contexts".
"""

from __future__ import annotations

import functools
import hashlib
import html
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from metrics._checks import short_repr

DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "vader"
REGENERATE_HINT = "run `python data/regenerate_vader.py` from the repository root to restore it"

# domain -> file stem in the VADER release; the order here is the order of DOMAINS and of rows.
VADER_CORPORA = {
    "tweet": "tweets",
    "movie": "movieReviewSnippets",
    "product": "amazonReviewSnippets",
    "news": "nytEditorialSnippets",
}
DOMAINS = tuple(VADER_CORPORA)
RATING_MIN, RATING_MAX = -4, 4

SPLITS = ("fit", "calibration", "eval")
SPLIT_FRACTIONS = {"fit": 0.6, "calibration": 0.2, "eval": 0.2}

# Full bin edges on the rating scale [-4, 4]. Interior edges <= 0 belong to the bin above them
# ([a, b) below zero), interior edges > 0 to the bin below them ((a, b] above zero), so the
# neutral bin [-0.5, 0.5] is closed and the bins are symmetric; for 2 classes 0 is positive.
SENTIMENT_BINS = {
    2: (-4.0, 0.0, 4.0),
    3: (-4.0, -0.5, 0.5, 4.0),
    5: (-4.0, -2.0, -0.5, 0.5, 2.0, 4.0),
}
SENTIMENT_OPTIONS = {
    2: ("negative", "positive"),
    3: ("negative", "neutral", "positive"),
    5: ("very negative", "negative", "neutral", "positive", "very positive"),
}

_COLUMNS = ("id", "domain", "text", "mean_rating", "rater_scores", "groundtruth_mean")
_SCORES_RE = re.compile(r"\[\s*-?\d+(?:\s*,\s*-?\d+)*\s*\]")
_MEAN_TOLERANCE = 1e-6  # the anonDataRatings mean is printed to 9-10 decimals


def _vader_files(data_dir: Path) -> list[Path]:
    return [
        data_dir / f"{stem}_{kind}.txt"
        for stem in VADER_CORPORA.values()
        for kind in ("GroundTruth", "anonDataRatings")
    ]


def _read_lines(path: Path) -> list[tuple[int, str]]:
    """Decode a VADER file (UTF-8, optional BOM, CRLF) into ``(line_number, line)`` pairs."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"VADER file {path} is missing; {REGENERATE_HINT}.") from None
    except OSError as err:
        raise ValueError(f"VADER file {path} cannot be read ({err}); {REGENERATE_HINT}.") from err
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line_number = raw.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"VADER file {path} line {line_number} is not valid UTF-8 ({err.reason} at byte "
            f"{err.start}); the file is corrupted, {REGENERATE_HINT}."
        ) from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()  # the trailing newline (if any) and trailing blank lines
    if not lines:
        raise ValueError(f"VADER file {path} is empty; {REGENERATE_HINT}.")
    return list(enumerate(lines, start=1))


def _malformed(path: Path, line_number: int, problem: str) -> ValueError:
    return ValueError(
        f"VADER file {path} line {line_number} is malformed: {problem}; "
        f"the file is corrupted or edited, {REGENERATE_HINT}."
    )


def _parse_rating(value: str, path: Path, line_number: int, what: str) -> float:
    try:
        rating = float(value)
    except ValueError:
        raise _malformed(path, line_number, f"{what} {short_repr(value)} is not a number") from None
    if not RATING_MIN <= rating <= RATING_MAX:  # also rejects NaN
        raise _malformed(path, line_number, f"{what} {rating} is outside [-4, 4]")
    return rating


def _clean_text(text: str) -> str:
    """Undo HTML escaping (the NYT file is escaped twice: ``&amp;amp;``) and trim whitespace."""
    for _ in range(3):
        unescaped = html.unescape(text)
        if unescaped == text:
            break
        text = unescaped
    return text.strip()


def _parse_groundtruth(path: Path) -> dict[str, tuple[float, str]]:
    rows: dict[str, tuple[float, str]] = {}
    for line_number, line in _read_lines(path):
        fields = line.split("\t", 2)
        if len(fields) != 3:
            raise _malformed(
                path, line_number, f"expected 3 tab-separated fields, got {len(fields)}"
            )
        raw_id, mean, text = fields[0].strip(), fields[1], _clean_text(fields[2])
        if not raw_id:
            raise _malformed(path, line_number, "empty id")
        if raw_id in rows:
            raise _malformed(path, line_number, f"duplicate id {short_repr(raw_id)}")
        if not text:
            raise _malformed(path, line_number, "empty text")
        rows[raw_id] = (_parse_rating(mean, path, line_number, "mean rating"), text)
    return rows


def _parse_ratings(path: Path) -> dict[str, tuple[float, tuple[int, ...]]]:
    rows: dict[str, tuple[float, tuple[int, ...]]] = {}
    for line_number, line in _read_lines(path):
        fields = line.split("\t")
        if len(fields) != 4:
            raise _malformed(
                path, line_number, f"expected 4 tab-separated fields, got {len(fields)}"
            )
        raw_id, mean, _sd, scores_text = (field.strip() for field in fields)
        if not raw_id:
            raise _malformed(path, line_number, "empty id")
        if raw_id in rows:
            raise _malformed(path, line_number, f"duplicate id {short_repr(raw_id)}")
        if not _SCORES_RE.fullmatch(scores_text):
            raise _malformed(
                path, line_number, f"rater scores {scores_text[:40]!r} are not a list of integers"
            )
        scores = tuple(map(int, scores_text.strip("[] ").split(",")))
        if min(scores) < RATING_MIN or max(scores) > RATING_MAX:
            raise _malformed(path, line_number, "a rater score is outside the integers -4..4")
        mean_rating = _parse_rating(mean, path, line_number, "mean rating")
        scores_mean = sum(scores) / len(scores)
        if abs(scores_mean - mean_rating) > _MEAN_TOLERANCE:
            raise _malformed(
                path,
                line_number,
                f"mean rating {mean_rating} differs from the mean of its rater scores "
                f"{scores_mean:.9f}",
            )
        rows[raw_id] = (mean_rating, scores)
    return rows


@functools.lru_cache(maxsize=4)
def _load_cached(data_dir: str, _signature: tuple) -> pd.DataFrame:
    """Parse all corpora; ``_signature`` (sizes and mtimes) invalidates the cache on edits."""
    columns: dict[str, list] = {name: [] for name in _COLUMNS}
    for domain, stem in VADER_CORPORA.items():
        gt_path = Path(data_dir) / f"{stem}_GroundTruth.txt"
        ratings_path = Path(data_dir) / f"{stem}_anonDataRatings.txt"
        groundtruth = _parse_groundtruth(gt_path)
        ratings = _parse_ratings(ratings_path)
        if groundtruth.keys() != ratings.keys():
            only_gt = sorted(groundtruth.keys() - ratings.keys())[:3]
            only_ratings = sorted(ratings.keys() - groundtruth.keys())[:3]
            raise ValueError(
                f"VADER files {gt_path} and {ratings_path} list different ids (only in the "
                f"first: {only_gt}, only in the second: {only_ratings}); {REGENERATE_HINT}."
            )
        for raw_id, (gt_mean, text) in groundtruth.items():  # GroundTruth file order
            mean_rating, scores = ratings[raw_id]
            columns["id"].append(f"{domain}:{raw_id}")
            columns["domain"].append(domain)
            columns["text"].append(text)
            columns["mean_rating"].append(mean_rating)
            columns["rater_scores"].append(scores)
            columns["groundtruth_mean"].append(gt_mean)
    frame = pd.DataFrame(
        {
            "id": pd.Series(columns["id"], dtype=object),
            "domain": pd.Series(columns["domain"], dtype=object),
            "text": pd.Series(columns["text"], dtype=object),
            "mean_rating": np.asarray(columns["mean_rating"], dtype=np.float64),
            "rater_scores": pd.Series(columns["rater_scores"], dtype=object),
            "groundtruth_mean": np.asarray(columns["groundtruth_mean"], dtype=np.float64),
        }
    )
    return frame


def load_vader(data_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """Load the four VADER corpora as one frame, one row per rated text.

    Parameters
    ----------
    data_dir : path-like, default=None
        Folder holding the eight ``*_GroundTruth.txt`` / ``*_anonDataRatings.txt`` files.
        ``None`` means the repository's ``data/vader``.

    Returns
    -------
    frame : pandas.DataFrame of shape (n_items, 6)
        Rows in ``DOMAINS`` order, then file order; a fresh copy on every call. Columns:

        - ``id`` : str, ``"{domain}:{raw_id}"``, unique (e.g. ``"tweet:2"``, ``"news:1_1"``).
        - ``domain`` : str, one of ``DOMAINS``.
        - ``text`` : str, HTML entities unescaped, BOM/CR and surrounding whitespace removed.
        - ``mean_rating`` : float64 in [-4, 4], the mean of ``rater_scores`` (the label source).
        - ``rater_scores`` : object, ``tuple[int, ...]`` of each rater's score in -4..4.
        - ``groundtruth_mean`` : float64, the mean printed in ``*_GroundTruth.txt``; equal to
          ``mean_rating`` except for 199 tweets (see ``data/README.md``). Not a label.

    Raises
    ------
    FileNotFoundError
        If the folder or one of the eight files is missing.
    ValueError
        If a file is empty, unreadable, not UTF-8, has a malformed line, or the two files of
        a corpus disagree on ids or on a rater mean. Messages name the file, the line and the
        fix.

    References
    ----------
    Hutto & Gilbert (2014), ICWSM; the files' format is described in ``data/vader/_README_.txt``.
    """
    path = Path(DEFAULT_DATA_DIR if data_dir is None else data_dir).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"VADER data folder {path} does not exist; {REGENERATE_HINT}.")
    signature = []
    for file in _vader_files(path):
        try:
            stat = file.stat()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"VADER file {file} is missing; {REGENERATE_HINT}."
            ) from None
        signature.append((file.name, stat.st_size, stat.st_mtime_ns))
    return _load_cached(str(path), tuple(signature)).copy()


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


def _domain_order(domain: str) -> tuple[int, str]:
    return (DOMAINS.index(domain) if domain in DOMAINS else len(DOMAINS), str(domain))


def _check_n_classes(n_classes: int) -> tuple[float, ...]:
    if n_classes not in SENTIMENT_BINS:
        raise ValueError(
            f"n_classes must be one of {sorted(SENTIMENT_BINS)}, got {n_classes!r}."
        )
    return SENTIMENT_BINS[n_classes]


def _bin(values: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    """Class index of each value: edges <= 0 open upward ([a, b)), edges > 0 downward ((a, b])."""
    label = np.zeros(values.shape, dtype=np.int64)
    for edge in edges[1:-1]:
        label += (values >= edge) if edge <= 0 else (values > edge)
    return label


def sentiment_label(mean_rating, n_classes: int) -> np.ndarray:
    """Sentiment class of each mean rating, binned by ``SENTIMENT_BINS[n_classes]``.

    Bins (names in ``SENTIMENT_OPTIONS[n_classes]``):

    - 2: negative ``< 0``, positive ``>= 0`` (an exact 0 counts as positive).
    - 3: negative ``< -0.5``, neutral ``[-0.5, 0.5]``, positive ``> 0.5``.
    - 5: very negative ``[-4, -2)``, negative ``[-2, -0.5)``, neutral ``[-0.5, 0.5]``,
      positive ``(0.5, 2]``, very positive ``(2, 4]``.

    Parameters
    ----------
    mean_rating : array-like of float of shape (n_items,)
        Ratings on the VADER scale [-4, 4].
    n_classes : {2, 3, 5}

    Returns
    -------
    labels : ndarray of int64 of shape (n_items,), values in ``0..n_classes-1``.

    Raises
    ------
    ValueError
        If ``n_classes`` is not 2, 3 or 5, or a rating is not finite or outside [-4, 4].

    Examples
    --------
    >>> sentiment_label([-2.0, -0.5, 0.0, 0.51, 2.01], 5).tolist()
    [1, 2, 2, 3, 4]
    """
    edges = _check_n_classes(n_classes)
    values = np.asarray(mean_rating, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"mean_rating must be 1-D, got shape {values.shape}.")
    if not np.all((values >= RATING_MIN) & (values <= RATING_MAX)):
        raise ValueError("mean_rating has values outside [-4, 4] (or NaN).")
    return _bin(values, edges)


def rater_distribution(rater_scores, n_classes: int) -> np.ndarray:
    """Share of each item's raters in each sentiment class, with the bins of `sentiment_label`.

    Parameters
    ----------
    rater_scores : sequence of sequence of int, length n_items
        Each item's rater scores, integers in -4..4 (the ``rater_scores`` column).
    n_classes : {2, 3, 5}

    Returns
    -------
    distribution : ndarray of float32 of shape (n_items, n_classes)
        Rows sum to 1. With integer scores: 3 classes put 0 in neutral; 5 classes map
        -4,-3 / -2,-1 / 0 / 1,2 / 3,4 to the five classes; 2 classes put 0 in positive.

    Raises
    ------
    ValueError
        If ``n_classes`` is not 2, 3 or 5, an item has no scores, or a score is not an
        integer in -4..4.

    Examples
    --------
    >>> rater_distribution([(-1, 0, 0, 3)], 3).tolist()
    [[0.25, 0.5, 0.25]]
    """
    edges = _check_n_classes(n_classes)
    lengths = np.fromiter((len(s) for s in rater_scores), dtype=np.int64)
    if lengths.size and lengths.min() == 0:
        raise ValueError(
            f"rater_scores item {int(np.argmin(lengths))} is empty; every item needs raters."
        )
    flat = np.asarray(
        [score for scores in rater_scores for score in scores], dtype=np.float64
    )
    if not np.all(np.isin(flat, np.arange(RATING_MIN, RATING_MAX + 1))):
        raise ValueError("rater_scores has values that are not integers in -4..4.")
    counts = np.zeros((lengths.size, n_classes), dtype=np.float64)
    rows = np.repeat(np.arange(lengths.size), lengths)
    np.add.at(counts, (rows, _bin(flat, edges)), 1.0)
    return (counts / np.maximum(lengths, 1)[:, None]).astype(np.float32)


def domain_label(domain) -> np.ndarray:
    """Index of each domain in ``DOMAINS`` (the 4-option domain task; no rater distribution).

    Parameters
    ----------
    domain : array-like of str of shape (n_items,)

    Returns
    -------
    labels : ndarray of int64 of shape (n_items,), values in 0..3.

    Raises
    ------
    ValueError
        If a value is not one of ``DOMAINS``.
    """
    values = np.asarray(domain, dtype=object)
    lookup = {name: i for i, name in enumerate(DOMAINS)}
    unknown = sorted({str(v) for v in values if v not in lookup})
    if unknown:
        raise ValueError(f"domain has values {unknown[:5]} not in DOMAINS {DOMAINS}.")
    return np.fromiter((lookup[v] for v in values), dtype=np.int64, count=values.size)

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
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from metrics._checks import short_repr
from runs.texts import clean_text
# the corpus' labels and splits, importable from here as before
from variants.datasets.labels import (DOMAINS, RATING_MAX, RATING_MIN, SENTIMENT_BINS,
                                      SENTIMENT_OPTIONS, VADER_CORPORA, domain_label,
                                      rater_distribution, sentiment_label)
from variants.datasets.splits import (SPLIT_FRACTIONS, SPLITS, assign_split, check_sample_size,
                                      sample, split_frame)

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "vader"
REGENERATE_HINT = "run `python data/regenerate_vader.py` from the repository root to restore it"

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


def _parse_groundtruth(path: Path) -> dict[str, tuple[float, str]]:
    rows: dict[str, tuple[float, str]] = {}
    for line_number, line in _read_lines(path):
        fields = line.split("\t", 2)
        if len(fields) != 3:
            raise _malformed(
                path, line_number, f"expected 3 tab-separated fields, got {len(fields)}"
            )
        raw_id, mean, text = fields[0].strip(), fields[1], clean_text(fields[2])
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

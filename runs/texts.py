"""Example texts for the worst-examples listings of the reports (no MLX, no model code).

The ids of the bundled data are ``<domain>:<raw id>`` of the VADER corpora (Hutto & Gilbert,
ICWSM 2014) vendored under ``data/vader/``. Only the text column of the four
``*_GroundTruth.txt`` files is read here (UTF-8 with optional BOM, CRLF, tab-separated
``id  mean  text``; HTML entities unescaped up to three times, whitespace trimmed), with
:func:`clean_text`, the one text cleaning ``variants.datasets.bundled.load_vader`` uses too (it also
validates the rating files).
"""

import html
from functools import lru_cache
from pathlib import Path

#: The vendored VADER corpora (repository ``data/vader``).
VADER_DIR = Path(__file__).resolve().parent.parent / "data" / "vader"
#: domain -> file stem in the VADER release (as ``variants.datasets.bundled.VADER_CORPORA``).
VADER_CORPORA = {"tweet": "tweets", "movie": "movieReviewSnippets",
                 "product": "amazonReviewSnippets", "news": "nytEditorialSnippets"}


def clean_text(text):
    """Undo HTML escaping (the NYT file is escaped twice: ``&amp;amp;``) and trim whitespace."""
    for _ in range(3):
        unescaped = html.unescape(text)
        if unescaped == text:
            break
        text = unescaped
    return text.strip()


@lru_cache(maxsize=2)
def _vader_texts(folder=VADER_DIR):
    """{id: text} of every GroundTruth line. Raises OSError / ValueError on unreadable files."""
    out = {}
    for domain, stem in VADER_CORPORA.items():
        raw = (Path(folder) / f"{stem}_GroundTruth.txt").read_bytes().decode("utf-8-sig")
        for line in raw.split("\n"):
            fields = line.rstrip("\r").split("\t", 2)
            if len(fields) == 3 and fields[0].strip():
                out.setdefault(f"{domain}:{fields[0].strip()}", clean_text(fields[2]))
    return out


def example_texts(ids):
    """Text of each example id from the bundled VADER data (ids it lacks are left out).

    Ids of multiple-choice questions may carry a suffix after the VADER id (``tweet:2#domain``);
    the VADER id before the first ``#``, ``|`` or ``/`` is used. Returns {} if the data cannot be
    read.

    Parameters
    ----------
    ids : iterable of str

    Returns
    -------
    dict of str -> str
    """
    try:
        texts = _vader_texts()
    except (OSError, ValueError):
        return {}
    out = {}
    for i in map(str, ids):
        if i in texts:
            out[i] = texts[i]
            continue
        for sep in ("#", "|", "/"):
            head = i.split(sep)[0]
            if head in texts:
                out[i] = texts[head]
                break
    return out

"""Tests for variants.datasets.bundled: the vendored VADER corpora, splits, samples and labels."""

import doctest
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from variants.datasets import bundled as D

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "vader"
DOMAIN_COUNTS = {"tweet": 4200, "movie": 10605, "product": 3708, "news": 5190}
SPLIT_COUNTS = {"fit": 14253, "calibration": 4666, "eval": 4784}


@pytest.fixture(scope="module")
def vader():
    return D.load_vader()


@pytest.fixture
def data_copy(tmp_path):
    """A writable copy of the eight corpus files."""
    for name in (p.name for p in D._vader_files(DATA_DIR)):
        shutil.copyfile(DATA_DIR / name, tmp_path / name)
    return tmp_path


def test_vendored_files_match_sha256sums():
    lines = (DATA_DIR / "SHA256SUMS").read_text().splitlines()
    sums = dict(reversed(line.split(maxsplit=1)) for line in lines)
    assert {p.name for p in D._vader_files(DATA_DIR)} <= set(sums)
    for name, digest in sums.items():
        assert hashlib.sha256((DATA_DIR / name).read_bytes()).hexdigest() == digest, name


def test_frame_shape_columns_and_dtypes(vader):
    assert len(vader) == 23703
    assert vader["domain"].value_counts().to_dict() == DOMAIN_COUNTS
    assert list(vader.columns[:5]) == ["id", "domain", "text", "mean_rating", "rater_scores"]
    assert vader["id"].is_unique
    assert vader["mean_rating"].dtype == np.float64
    assert vader["mean_rating"].between(-4, 4).all()
    assert tuple(vader["domain"].unique()) == D.DOMAINS
    scores = vader["rater_scores"]
    assert scores.map(lambda s: type(s) is tuple and all(type(x) is int for x in s)).all()
    assert scores.map(len).groupby(vader["domain"]).min().to_dict() == {
        "movie": 15, "news": 20, "product": 20, "tweet": 20
    }
    means = scores.map(np.mean).to_numpy()
    np.testing.assert_allclose(means, vader["mean_rating"].to_numpy(), atol=1e-6)


def test_known_items(vader):
    row = vader.set_index("id").loc["news:1_1"]
    assert row["domain"] == "news"
    assert row["text"].startswith("On Dec. 19, around noon, New York City's Union Square")
    assert row["mean_rating"] == 0.4
    assert row["rater_scores"] == (0, 0, 1, 0, 2, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0)

    tweet = vader.set_index("id").loc["tweet:2"]
    assert tweet["text"] == "Yay. Another good phone interview."
    assert len(tweet["rater_scores"]) == 99 and sum(tweet["rater_scores"]) == 224
    assert tweet["mean_rating"] == pytest.approx(224 / 99)
    assert tweet["groundtruth_mean"] == pytest.approx(1.443298969)  # not the label

    product = vader.set_index("id").loc["product:1_1"]  # its ratings file starts with a BOM
    assert product["mean_rating"] == -0.9
    assert product["text"] == "troubleshooting ad-2500 and ad-2600 no picture scrolling b/w."


def test_text_is_cleaned(vader):
    text = vader.set_index("id")["text"]
    assert text["tweet:588"] == "OMGOMGOMGOMG! all smiles. and crossing fingers :D   <3333333333"
    assert text["news:29_4"].endswith("Hirschl & Adler gallery.")  # escaped twice in the file
    assert not text.str.contains(r"&(?:amp|lt|gt|quot);|\r|\ufeff").any()
    assert (text == text.str.strip()).all()


def test_groundtruth_mean_mismatches_are_the_documented_199_tweets(vader):
    """Pins the tweets_GroundTruth / tweets_anonDataRatings disagreement in data/README.md."""
    differs = (vader["mean_rating"] - vader["groundtruth_mean"]).abs() > 1e-6
    assert differs.sum() == 199
    assert set(vader.loc[differs, "domain"]) == {"tweet"}
    assert vader.loc[differs, "rater_scores"].map(len).min() > 20


def test_load_returns_a_fresh_copy(vader):
    first = D.load_vader()
    first.loc[0, "text"] = "changed"
    assert D.load_vader().loc[0, "text"] != "changed"


def test_splits_fractions_counts_and_disjoint(vader):
    parts = {name: D.split_frame(vader, name) for name in D.SPLITS}
    assert {name: len(p) for name, p in parts.items()} == SPLIT_COUNTS
    for name, part in parts.items():
        assert abs(len(part) / len(vader) - D.SPLIT_FRACTIONS[name]) < 0.02
    ids = [set(p["id"]) for p in parts.values()]
    assert sum(map(len, ids)) == len(vader) and len(set.union(*ids)) == len(vader)


def test_splits_are_stable_under_row_shuffling(vader):
    shuffled = vader.sample(frac=1.0, random_state=1)
    for name in D.SPLITS:
        assert set(D.split_frame(shuffled, name)["id"]) == set(D.split_frame(vader, name)["id"])
    assert D.assign_split(["tweet:1", "movie:1", "news:1_1"]).tolist() == [
        D.assign_split([i])[0] for i in ["tweet:1", "movie:1", "news:1_1"]
    ]


def test_sample_is_deterministic_stratified_and_sorted(vader):
    small = D.sample(vader, 100)
    assert len(small) == 100
    assert small["domain"].value_counts().to_dict() == {
        "movie": 45, "news": 22, "tweet": 18, "product": 15
    }
    assert small["id"].is_monotonic_increasing
    shuffled = vader.sample(frac=1.0, random_state=3)
    pd.testing.assert_frame_equal(small, D.sample(shuffled, 100))
    other = D.sample(vader, 100, seed=1)
    assert set(other["id"]) != set(small["id"])
    assert len(D.sample(vader, 10**6)) == len(vader)
    assert len(D.sample(vader, 0)) == 0


def test_check_sample_size_refuses_more_than_the_split(vader):
    ev = D.split_frame(vader, "eval")
    assert len(ev) == 4784
    D.check_sample_size(ev, 4784, split="eval", flag="--n-eval")  # all of it is fine
    with pytest.raises(ValueError) as e:
        D.check_sample_size(ev, 4785, split="eval", flag="--n-eval")
    assert str(e.value) == ("--n-eval 4785 is more than the 4784 examples of the eval split; "
                            "pass --n-eval 4784 or less")


@pytest.mark.parametrize(
    "n_classes, expected",
    [
        (2, [0, 0, 0, 1, 1, 1, 1, 1]),
        (3, [0, 1, 1, 1, 1, 2, 2, 2]),
        (5, [1, 2, 2, 2, 2, 3, 3, 4]),
    ],
)
def test_sentiment_label_bin_edges(n_classes, expected):
    values = [-2.0, -0.5, -0.49, 0.0, 0.5, 0.51, 2.0, 2.01]
    labels = D.sentiment_label(values, n_classes)
    assert labels.dtype == np.int64
    assert labels.tolist() == expected
    assert len(D.SENTIMENT_OPTIONS[n_classes]) == n_classes == len(D.SENTIMENT_BINS[n_classes]) - 1
    assert D.sentiment_label([-4.0, -2.01, 4.0], n_classes).tolist() == [0, 0, n_classes - 1]


def test_rater_distribution_hand_computed():
    scores = [(-4, -2, -1, 0, 0, 1, 3, 4), (0,)]
    d3 = D.rater_distribution(scores, 3)
    assert d3.dtype == np.float32 and d3.shape == (2, 3)
    np.testing.assert_allclose(d3, [[3 / 8, 2 / 8, 3 / 8], [0, 1, 0]])
    np.testing.assert_allclose(D.rater_distribution(scores, 2), [[3 / 8, 5 / 8], [0, 1]])
    np.testing.assert_allclose(
        D.rater_distribution(scores, 5), [[1 / 8, 2 / 8, 2 / 8, 1 / 8, 2 / 8], [0, 0, 1, 0, 0]]
    )


@pytest.mark.parametrize("n_classes", [2, 3, 5])
def test_integer_scores_bin_like_their_labels(vader, n_classes):
    """A single rater's score gets the label its value would get as a mean."""
    grid = list(range(-4, 5))
    one_hot = D.rater_distribution([(s,) for s in grid], n_classes)
    assert one_hot.argmax(axis=1).tolist() == D.sentiment_label(grid, n_classes).tolist()
    dist = D.rater_distribution(vader["rater_scores"].head(500), n_classes)
    np.testing.assert_allclose(dist.sum(axis=1), 1.0, rtol=1e-6)


def test_domain_label():
    labels = D.domain_label(["news", "tweet", "product", "movie"])
    assert labels.dtype == np.int64 and labels.tolist() == [3, 0, 2, 1]
    with pytest.raises(ValueError, match="not in DOMAINS"):
        D.domain_label(["tweet", "blog"])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda df: D.sentiment_label([0.0], 4), "n_classes must be one of"),
        (lambda df: D.sentiment_label([4.5], 3), r"outside \[-4, 4\]"),
        (lambda df: D.sentiment_label([float("nan")], 3), "NaN"),
        (lambda df: D.rater_distribution([(0,), ()], 3), "item 1 is empty"),
        (lambda df: D.rater_distribution([(5,)], 3), "integers in -4..4"),
        (lambda df: D.split_frame(df, "test"), "split must be one of"),
        (lambda df: D.split_frame(df.drop(columns="id"), "fit"), r"lacks column\(s\) \['id'\]"),
        (lambda df: D.sample(df, -1), "non-negative integer"),
        (lambda df: D.sample(df, 2.5), "non-negative integer"),
    ],
)
def test_argument_errors(vader, call, match):
    with pytest.raises(ValueError, match=match):
        call(vader)


def test_missing_folder_and_file(tmp_path, data_copy):
    with pytest.raises(FileNotFoundError, match=r"does not exist.*regenerate_vader\.py"):
        D.load_vader(tmp_path / "nowhere")
    (data_copy / "movieReviewSnippets_anonDataRatings.txt").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"movieReviewSnippets_anonDataRatings\.txt is missing.*regen"
    ):
        D.load_vader(data_copy)


def _edit_line(path: Path, line_number: int, new: bytes) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[line_number - 1] = new
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize(
    "file, edit, match",
    [
        ("tweets_GroundTruth.txt", None, r"tweets_GroundTruth\.txt is empty.*regenerate_vader"),
        ("nytEditorialSnippets_GroundTruth.txt", (3, b"1_3\t0.4\r"),
         r"nytEditorialSnippets_GroundTruth\.txt line 3 is malformed: expected 3 .*got 2"),
        ("tweets_GroundTruth.txt", (5, b"5\tpositive\tgreat\r"),
         r"line 5 is malformed: mean rating 'positive' is not a number"),
        ("tweets_anonDataRatings.txt", (7, b"7\t1.0\t0.5\t[1, 1, x]\r"),
         r"tweets_anonDataRatings\.txt line 7 is malformed: rater scores .* not a list"),
        ("amazonReviewSnippets_anonDataRatings.txt", (2, b"1_2\t1.0\t0.5\t[1, 1, 9]\r"),
         r"line 2 is malformed: a rater score is outside"),
        ("movieReviewSnippets_anonDataRatings.txt", (4, b"4\t1.0\t0.5\t[1, 2, 3]\r"),
         r"line 4 is malformed: mean rating 1.0 differs from the mean of its rater scores"),
        ("movieReviewSnippets_GroundTruth.txt", (9, b"8\t1.0\tdup\r"),
         r"line 9 is malformed: duplicate id '8'"),
        ("tweets_GroundTruth.txt", (11, b"11\t0.1\t\xff\xfe bad bytes\r"),
         r"tweets_GroundTruth\.txt line 11 is not valid UTF-8"),
        ("tweets_GroundTruth.txt", (4200, b"99999\t0.2\tnew id"),
         r"list different ids \(only in the first: \['99999'\]"),
    ],
)
def test_corrupt_file_errors_name_file_line_and_fix(data_copy, file, edit, match):
    path = data_copy / file
    if edit is None:
        path.write_bytes(b"")
    else:
        _edit_line(path, *edit)
    with pytest.raises(ValueError, match=match) as excinfo:
        D.load_vader(data_copy)
    assert "regenerate_vader.py" in str(excinfo.value)


def test_doctests():
    failures, _ = doctest.testmod(D, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert failures == 0

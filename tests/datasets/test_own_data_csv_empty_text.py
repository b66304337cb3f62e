"""A one-column CSV keeps its empty and whitespace-only texts, as JSONL and Parquet do.

``pandas.DataFrame.to_csv`` (and Python's ``csv.writer``) writes an empty text in a one-column
file as the line ``""`` and a blank text as the blank itself; read back, those are rows like any
other, not blank lines to skip. Only a line with no cell at all is a blank line there; in a file
of several columns a line of blanks is still skipped as before.
"""

import json

import pandas as pd
import pytest

from variants.datasets.own import read_data

OPTS = ["negative", "positive"]
TEXTS = ["good", "", "   ", "bad", "\t", "meh", ""]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_every_format_keeps_every_text_of_a_one_column_file(tmp_path, fmt):
    path = tmp_path / f"d.{fmt}"
    frame = pd.DataFrame({"text": TEXTS})
    if fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "parquet":
        frame.to_parquet(path)
    else:
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    got = read_data(path, options=OPTS, require_splits=())
    assert got["text"].tolist() == TEXTS
    assert got.index.tolist()[:3] == (["line 2", "line 3", "line 4"] if fmt == "csv" else
                                      ["line 1", "line 2", "line 3"] if fmt == "jsonl" else
                                      ["row index 0", "row index 1", "row index 2"])
    assert got["id"].is_unique


def test_a_truly_blank_line_is_still_skipped_and_a_blank_row_of_many_columns_too(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('text\ngood\n\n""\nbad\n\n', encoding="utf-8")
    assert read_data(path, options=OPTS, require_splits=())["text"].tolist() == ["good", "", "bad"]
    path.write_text("id,text\na,good\n,\n  \nb,\n", encoding="utf-8")
    got = read_data(path, options=OPTS, require_splits=())
    assert got["text"].tolist() == ["good", ""] and got["id"].tolist() == ["a", "b"]

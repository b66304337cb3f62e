"""The user's own data file (variants.datasets.own): each error is one line naming file, row and
column; JSONL/CSV/Parquet read alike; the hash split is the VADER rule; the fingerprint sees
every field; the shipped example reads clean."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from variants.datasets.own import (DataError, data_fingerprint, read_data, split_rows, taskset_rows,
                                   to_taskset)
from variants.checkpoints.special_tokens import count_special_only, special_only_ids

ROOT = Path(__file__).resolve().parents[2]
OPTS = ["negative", "neutral", "positive"]
BASE = [  # one row per split, so the split check passes unless a test breaks it
    {"id": "a", "text": "good", "options": OPTS, "label": 2, "split": "fit"},
    {"id": "b", "text": "bad", "options": OPTS, "label": 0, "split": "calibration"},
    {"id": "c", "text": "meh", "options": OPTS, "label": 1, "split": "eval"},
]


def jsonl(tmp_path, rows, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def with_row(**fields):
    """BASE with the third row (line 3) changed."""
    return BASE[:2] + [{**BASE[2], **fields}]


def error_of(path, **kw):
    with pytest.raises(DataError) as info:
        read_data(path, **kw)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    return msg


@pytest.mark.parametrize("change, where, column, fix", [
    (dict(lable=1), "line 3", "'lable'", "did you mean 'label'"),
    (dict(text=None), "line 3", "'text'", "the text is missing"),
    (dict(text=7), "line 3", "'text'", "quote the text"),
    (dict(label="neutrl"), "line 3", "'label'", "did you mean 'neutral'"),
    (dict(label=3), "line 3", "'label'", "index below 3"),
    (dict(scores=[1.0, 2.0]), "line 3", "'scores'", "one score per option"),
    (dict(actions=["x", "y", "z", "w"]), "line 3", "'actions'", "one action per option"),
    (dict(raters=[0, 1, 7]), "line 3", "'raters'", "index below 3"),
    (dict(raters=["neutral", "happy"]), "line 3", "'raters'", "option text"),
    (dict(raters=[0.5, 0.2, 0.2]), "line 3", "'raters'", "sum to 1"),
    (dict(raters=[0.5, 0.5]), "line 3", "'raters'", "one share per option"),
    (dict(split="test"), "line 3", "'split'", "did you mean 'eval'"),
    (dict(split="validation"), "line 3", "'split'", "did you mean 'calibration'"),
    (dict(id="a"), "line 3", "'id'", "repeats line 1"),
    (dict(options=["only"]), "line 3", "'options'", "at least 2"),
    (dict(options=["x", "x"]), "line 3", "'options'", "unique"),
    (dict(options="negative,positive"), "line 3", "'options'", "as a list"),
])
def test_each_bad_cell_is_one_line_naming_file_row_column_and_fix(tmp_path, change, where,
                                                                   column, fix):
    msg = error_of(jsonl(tmp_path, with_row(**change)))
    assert f"{where}, column {column}" in msg and fix in msg


def test_missing_text_column_and_empty_split(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "text"} for r in BASE]
    assert "column 'text': the required column is missing" in error_of(jsonl(tmp_path, rows))
    msg = error_of(jsonl(tmp_path, with_row(split="fit")))
    assert "column 'split': the eval split is empty (3 rows)" in msg and "add rows" in msg
    assert len(read_data(jsonl(tmp_path, with_row(split="fit")),
                         require_splits=("fit", "calibration"))) == 3


def test_file_level_errors(tmp_path):
    assert "no rows" in error_of(jsonl(tmp_path, []))
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    assert "no rows" in error_of(tmp_path / "blank.jsonl")
    bad = tmp_path / "bytes.jsonl"
    bad.write_bytes(b'{"text": "ok", "split": "fit"}\n{"text": "caf\xe9"}\n')
    assert "line 2: byte 14 of the line is not valid UTF-8" in error_of(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a"}\n{"text": "b",}\n')
    assert "line 2: not valid JSON" in error_of(broken)
    assert "unknown file type '.txt'" in error_of(tmp_path / "d.txt")
    assert "does not exist" in error_of(tmp_path / "missing.csv")


def test_csv_errors_name_their_line(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('text,options\n"a","[""x"", ""y""]"\n"b",x|y\n')
    assert "line 3, column 'options'" in error_of(path)
    path.write_text('text,lables\na,1\n')
    assert "line 1, column 'lables': unknown column; did you mean 'label'" in error_of(path)
    path.write_text('text\na,1\n')
    assert "line 2: has 2 cells but the header has 1" in error_of(path)


def test_parquet_errors_give_the_row_index(tmp_path):
    path = tmp_path / "d.parquet"
    pd.DataFrame([dict(r) for r in with_row(label=5)]).to_parquet(path)
    assert "row index 2, column 'label'" in error_of(path)


def test_rows_without_options_need_defaults(tmp_path):
    rows = [{"id": r["id"], "text": r["text"], "label": "neutral", "split": r["split"]}
            for r in BASE]
    frame = read_data(jsonl(tmp_path, rows))  # options unknown yet: the label is kept as text
    with pytest.raises(DataError, match="line 1, column 'options': the row has no options"):
        taskset_rows(frame)
    rows_out, k, names = taskset_rows(frame, options=OPTS)
    assert [r["label"] for r in rows_out] == [1, 1, 1] and k == 3 and names == tuple(OPTS)
    with pytest.raises(DataError, match="line 1, column 'label'.*did you mean 'neutr'"):
        read_data(jsonl(tmp_path, rows), options=["negative", "neutr", "positive"])
    with pytest.raises(DataError, match="line 1, column 'scores': the model config's 2 default"):
        taskset_rows(frame, options=OPTS, scores=[1.0, 2.0])
    with pytest.raises(DataError, match="line 1, column 'actions': action 'negative' is not"):
        taskset_rows(frame, options=OPTS, action_names=("act",))


ROWS = [  # every column, ragged options (2 and 3), per-rater choices as indices
    {"id": "r1", "text": "Great, thanks", "question": "How?", "options": OPTS, "label": 2,
     "scores": [-1.0, 0.0, 1.0], "actions": ["esc", "rev", "ok"], "raters": [2, 2, 1],
     "split": "fit", "task": "sent"},
    {"id": "r2", "text": "Refund, now", "question": "Route?", "options": ["refund", "ignore"],
     "label": 0, "scores": [1.0, 0.0], "actions": ["esc", "ok"], "raters": [0, 0],
     "split": None, "task": "route"},
    {"id": "r3", "text": 'A "box", é', "question": "How?", "options": OPTS, "label": 1,
     "scores": [-1.0, 0.0, 1.0], "actions": ["esc", "rev", "ok"], "raters": [1],
     "split": "calibration", "task": "sent"},
    {"id": "r4", "text": "Loved it", "question": "How?", "options": OPTS, "label": 2,
     "scores": [-2.5, 0.0, 2.5], "actions": ["esc", "rev", "ok"], "raters": [2, 1, 2, 2],
     "split": "eval", "task": "sent"},
]


def test_jsonl_csv_parquet_read_the_same_rows(tmp_path):
    a = read_data(jsonl(tmp_path, ROWS))
    csv_rows = [{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()}
                for r in ROWS]
    pd.DataFrame(csv_rows).to_csv(tmp_path / "d.csv", index=False)
    b = read_data(tmp_path / "d.csv")
    pd.DataFrame(ROWS).to_parquet(tmp_path / "d.parquet")
    c = read_data(tmp_path / "d.parquet")
    assert list(a.index) == ["line 1", "line 2", "line 3", "line 4"]
    assert list(b.index)[:2] == ["line 2", "line 3"] and list(c.index)[0] == "row index 0"
    for other in (b, c):
        assert other.reset_index(drop=True).to_dict("records") == \
            a.reset_index(drop=True).to_dict("records")
        assert data_fingerprint(other) == data_fingerprint(a)
    ts = to_taskset(a)
    assert ts.option_mask.tolist() == [[True] * 3, [True, True, False], [True] * 3, [True] * 3]
    assert ts.labels.tolist() == [2, 0, 1, 2]
    np.testing.assert_allclose(ts.human_dist[0], [0, 1 / 3, 2 / 3])
    np.testing.assert_allclose(ts.human_dist[3], [0, 0.25, 0.75])
    assert ts.action_names == ("esc", "rev", "ok")
    assert ts.action_map[1].tolist() == [[1, 0, 0], [0, 0, 1], [0, 0, 0]]
    assert np.isnan(ts.option_scores[1, 2]) and ts.option_scores[3, 0] == -2.5
    assert ts.task.tolist() == ["sent", "route", "sent", "sent"]


def _independent_split(key):
    u = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64
    return "fit" if u < 0.6 else "calibration" if u < 0.8 else "eval"


def test_rows_without_split_get_the_vader_hash_split(tmp_path):
    from variants.datasets.splits import assign_split

    rows = [{"id": f"tweet:{i}", "text": f"t{i}"} for i in range(60)]
    frame = read_data(jsonl(tmp_path, rows))
    assert frame["split"].tolist() == [_independent_split(f"tweet:{i}") for i in range(60)]
    assert frame["split"].tolist() == assign_split(frame["id"].to_numpy()).tolist()
    no_ids = read_data(jsonl(tmp_path, [{"text": r["text"]} for r in rows] + [{"text": "t0"}]))
    first = "t" + hashlib.sha256(b"t0").hexdigest()[:12]
    assert no_ids["id"].iloc[0] == first and no_ids["id"].iloc[-1] == first + "#2"
    assert no_ids["split"].iloc[0] == _independent_split(first)
    assert len(split_rows(frame, "eval")) == (frame["split"] == "eval").sum() > 0


def test_label_as_text_equals_label_as_index(tmp_path):
    as_text = [{**r, "label": OPTS[r["label"]], "raters": [OPTS[r["label"]], "neutral"]}
               for r in BASE]
    as_index = [{**r, "raters": [r["label"], 1]} for r in BASE]
    a, b = read_data(jsonl(tmp_path, as_text, "a.jsonl")), read_data(jsonl(tmp_path, as_index))
    assert a["label"].tolist() == [2, 0, 1] and data_fingerprint(a) == data_fingerprint(b)
    assert to_taskset(a).fingerprint() == to_taskset(b).fingerprint()


@pytest.mark.parametrize("column, value", [
    ("id", "r9"), ("text", "Great, thanks!"), ("question", "Why?"), ("options", ["n", "m", "p"]),
    ("label", 1), ("scores", [-1.0, 0.0, 1.5]), ("actions", ["esc", "ok", "ok"]),
    ("raters", [2, 2, 2]), ("split", "eval"), ("task", "other"),
])
def test_fingerprint_changes_with_every_field(tmp_path, column, value):
    base = data_fingerprint(read_data(jsonl(tmp_path, ROWS, "a.jsonl"), require_splits=()))
    changed = [dict(ROWS[0], **{column: value})] + ROWS[1:]
    assert data_fingerprint(read_data(jsonl(tmp_path, changed), require_splits=())) != base


def test_fingerprint_sees_row_order(tmp_path):
    a = read_data(jsonl(tmp_path, ROWS, "a.jsonl"))
    b = read_data(jsonl(tmp_path, ROWS[::-1]))
    assert data_fingerprint(a) != data_fingerprint(b)


def test_csv_fixture_reads_with_defaults():
    frame = read_data(ROOT / "tests/fixtures/own_data_small.csv", options=OPTS)
    ts = to_taskset(frame, options=OPTS, scores=[-1, 0, 1], actions=["esc", "rev", "ok"])
    assert ts.labels.tolist() == [2, 0, 1, 0, -1, 1]
    assert ts.option_texts[3].tolist() == ["refund", "ignore", ""]
    assert ts.option_scores[3, :2].tolist() == [1.0, 0.0]
    assert ts.action_names == ("esc", "rev", "ok", "escalate", "none")
    np.testing.assert_allclose(ts.human_dist[2], [0, 1, 0])


def test_example_file_reads_clean_and_matches_vader():
    from variants.datasets import bundled as data

    frame = read_data(ROOT / "examples/vader_raters.jsonl")
    counts = frame["split"].value_counts()
    assert len(frame) == 300 and all(counts[s] > 0 for s in ("fit", "calibration", "eval"))
    ts = to_taskset(frame)
    vader = data.load_vader().set_index("id").loc[frame["id"]]
    assert ts.labels.tolist() == data.sentiment_label(vader["mean_rating"].to_numpy(), 3).tolist()
    np.testing.assert_allclose(ts.human_dist,
                               data.rater_distribution(vader["rater_scores"].tolist(), 3),
                               atol=1e-6)
    assert ts.action_names == ("escalate", "review", "none")


def test_special_only_texts_are_counted():
    from tokenizers import Tokenizer

    from variants.checkpoints.load import minilm_path

    tok = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    texts = ["", "🙂🙂", "[SEP]", "hi there", "[UNK] [PAD]", "ok 🙂"]
    # [CLS] [SEP] / [CLS] [UNK] [SEP] / typed specials: nothing for the model to read
    assert count_special_only(texts, tok) == 4
    assert count_special_only([], tok) == 0


def test_empty_and_whitespace_texts_are_kept_judged_and_listed_by_id(tmp_path, checkpoint):
    """An empty or blank text is a row like any other (it tokenizes to [CLS] [SEP]), in JSONL and
    CSV alike; its id is listed among the special-tokens-only rows."""
    rows = BASE + [{"id": "e", "text": "", "options": OPTS, "label": 1, "split": "eval"},
                   {"id": "w", "text": " \t ", "options": OPTS, "split": "eval"}]
    frame = read_data(jsonl(tmp_path, rows))
    assert frame["text"].tolist()[-2:] == ["", " \t "]
    csv = tmp_path / "d.csv"
    csv.write_text("id,text,split\na,good,fit\nb,bad,calibration\nc,meh,eval\ne,,eval\n"
                   'w,"  ",eval\n', encoding="utf-8")
    assert read_data(csv, options=OPTS)["text"].tolist()[-2:] == ["", "  "]
    ts = to_taskset(frame)
    tok = checkpoint.tokenizer
    assert special_only_ids(ts, tok) == ["e", "w"]
    encs, _ = tok.encode(["", " \t "])
    assert [len(e.ids) for e in encs] == [2, 2]  # [CLS] [SEP]


def test_report_lists_special_only_ids():
    from runs.report_facts import special_only_text as _special_only_text

    data = {"special_only_texts": {"fit": 0, "eval": 2}, "special_only_ids": {"eval": ["e", "w"]}}
    assert _special_only_text(data).endswith("kept and judged): fit 0, eval 2 (ids e, w)")
    many = {"special_only_texts": {"eval": 23},
            "special_only_ids": {"eval": [f"r{i}" for i in range(23)]}}
    assert _special_only_text(many).endswith("r19 and 3 more)")
    assert _special_only_text({}) == ""


def test_a_rows_own_question_reaches_the_prompt():
    """A data row's ``question`` fills the prompt's {question}; rows without one get the model's;
    a TaskSet without questions keeps its former fingerprint (no field added)."""
    from variants.models.decision import DecisionModel
    from variants.datasets.tasks import build_taskset

    base = dict(task="t", options=["no", "yes"], scores=None, actions=["a", "b"], label=0,
                human=None)
    rows = [dict(base, id="1", text="it rains", question="Take an umbrella?"),
            dict(base, id="2", text="sunny", question="")]
    ts = build_taskset(rows, k_max=2, action_names=("a", "b"))
    assert ts.questions.tolist() == ["Take an umbrella?", ""]
    model = DecisionModel(None, None)
    model.prompt, model.question = "{question} | {options} | {text}", "Go out?"
    texts, pairs = model.model_inputs(ts)
    assert texts == ["Take an umbrella? | no / yes | it rains", "Go out? | no / yes | sunny"]
    assert pairs is None
    assert ts.subset([1]).questions.tolist() == [""]
    plain = build_taskset([dict(r, question=None) for r in rows], k_max=2, action_names=("a", "b"))
    assert plain.questions is None
    assert plain.fingerprint() != ts.fingerprint()
    import dataclasses
    assert plain.fingerprint() == dataclasses.replace(ts, questions=None).fingerprint()

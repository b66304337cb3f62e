"""Break tests of own checkpoints, the model TOML and own data: inputs a user could give
that once got past validation and failed (or silently mixed) after the run folder was written.
Each expects exit 2, one line naming the problem and the fix, and nothing written; or, where
the input is fine, the value the reader should produce."""

import json
from pathlib import Path

import pytest

from variants.datasets import own as own_data
from variants.cli import main
from variants.models.model_config import ModelConfigError, parse_model_config

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"
TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none", "--bits", "8",
        "--timing-batch-sizes", "1", "--no-progress"]
OPTS = ["negative", "neutral", "positive"]
ACTS = ["escalate", "review", "none"]


def _rows(n_per_split=20, **row):
    """Labelled rows, n per split, with the example's options and actions."""
    out = []
    for s in ("fit", "calibration", "eval"):
        for i in range(n_per_split):
            out.append(dict(id=f"{s}{i}", text=f"text number {i} of {s}", options=OPTS,
                            actions=ACTS, label=i % 3, split=s, **row))
    return out


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _toml(path, body):
    path.write_text(body, encoding="utf-8")
    return path


def _sweep_error(tmp_path, capsys, *args):
    """Run a sweep expected to be refused: returns its one stderr line; asserts exit 2 and
    that nothing was written."""
    results = tmp_path / "results"
    rc = main(["sweep", "--results-dir", str(results), *TINY, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert not results.exists(), sorted(p.name for p in results.rglob("*"))
    return err[-1]


CLASSIFIER = f'''name = "cls"
logits = "classifier"
checkpoint = "{HF / 'modernbert'}"
options = ["negative", "neutral", "positive"]
actions = ["escalate", "review", "none"]
'''


# --- temperatures -----------------------------------------------------------------------------
@pytest.mark.parametrize("t", [1e300, 1e-30, 1e-4, 5e3])
def test_fixed_temperature_outside_the_fit_range_is_refused(t):
    """1e300 overflowed float32 and 1e-30 failed "temperature must be > 0" after the run
    folder was written; fixed temperatures now take the fit's own range
    (metrics.temperature_fit.BOUNDS)."""
    with pytest.raises(ModelConfigError, match=r"values\.3.*between 0\.001 and 1000"):
        parse_model_config({"name": "x", "logits": "cosine", "options": ["a", "b", "c"],
                            "temperature": {"mode": "fixed", "values": {"3": t}}}, "m.toml")


@pytest.mark.parametrize("t", [0.001, 0.1, 1000.0])
def test_fixed_temperature_at_the_range_ends_is_kept(t):
    cfg = parse_model_config({"name": "x", "logits": "cosine", "options": ["a", "b", "c"],
                              "temperature": {"mode": "fixed", "values": {"3": t}}}, "m.toml")
    assert cfg.temperature_values == {3: t}


def test_fixed_temperatures_missing_an_option_count_are_refused_before_writing(tmp_path, capsys):
    """values = {"2" = ...} on 3-option data failed at calibration, after the run folder."""
    toml = _toml(tmp_path / "m.toml", CLASSIFIER + '[temperature]\nmode = "fixed"\n'
                 'values = { "2" = 0.5 }\n')
    data = _jsonl(tmp_path / "d.jsonl", _rows())
    line = _sweep_error(tmp_path, capsys, "--model-config", str(toml), "--data", str(data))
    assert "[3]" in line and "[temperature] values" in line and '"3" = ' in line


def test_fixed_temperature_bounds_are_the_fits():
    from metrics.temperature_fit import BOUNDS
    from variants.models.model_config import T_BOUNDS

    assert T_BOUNDS == BOUNDS


def test_eval_option_count_absent_from_calibration_is_refused_before_writing(tmp_path, capsys):
    """A 4-option eval row with 3-option calibration rows failed at the eval outputs ('no
    temperature for option counts [4]: call calibrate()'), after the run folder was written."""
    rows = _rows()
    rows[-1].update(options=OPTS + ["other"], actions=ACTS + ["review"])
    toml = _toml(tmp_path / "m.toml", f'''name = "cos"
logits = "cosine"
checkpoint = "{HF / 'roberta'}"
''')
    data = _jsonl(tmp_path / "d.jsonl", rows)
    line = _sweep_error(tmp_path, capsys, "--model-config", str(toml), "--data", str(data))
    assert "[4]" in line and "calibration split" in line


def test_fixed_temperatures_are_checked_on_the_bundled_data_too(tmp_path, capsys):
    toml = _toml(tmp_path / "m.toml", '''name = "lh"
logits = "linear-head"
options = ["negative", "neutral", "positive"]
[temperature]
mode = "fixed"
values = { "5" = 1.0 }
''')
    line = _sweep_error(tmp_path, capsys, "--model-config", str(toml))
    assert "[3]" in line and '"3" = 1.0' in line


def test_a_calibration_split_smaller_than_alpha_needs_is_refused_before_writing(tmp_path, capsys):
    """--n-calibration 40 passed the size check, but the file's calibration split had 16 rows
    (< 19 for alpha = 0.05): every variant failed after run.json was written."""
    rows = _rows()
    for r in rows[20:40][:4]:
        r["split"] = "fit"
    toml = _toml(tmp_path / "m.toml", CLASSIFIER)
    data = _jsonl(tmp_path / "d.jsonl", rows)
    line = _sweep_error(tmp_path, capsys, "--model-config", str(toml), "--data", str(data))
    assert "16 rows" in line and "at least 19" in line and str(data) in line


def test_csv_labels_written_by_pandas_with_missing_values_read_as_indices(tmp_path):
    """pandas.to_csv writes an integer label column with a missing value as 2.0 / '' ; the
    CSV reader took '2.0' as an option text and refused the row (JSONL's 2.0 was read as 2)."""
    import pandas as pd

    frame = pd.DataFrame({"text": ["a", "b", "c", "d"], "label": [2, None, 0, -1],
                          "options": [json.dumps(OPTS)] * 4,
                          "split": ["fit", "calibration", "eval", "eval"]})
    frame.to_csv(tmp_path / "d.csv", index=False)
    assert (tmp_path / "d.csv").read_text().splitlines()[1].endswith(",2.0,"
                                                                     '"[""negative"", ""neutral"", '
                                                                     '""positive""]",fit')
    got = own_data.read_data(tmp_path / "d.csv")
    assert got["label"].tolist() == [2, -1, 0, -1]
    bad = tmp_path / "bad.csv"
    bad.write_text('text,label,options\nx,1.5,"[""a"", ""b""]"\n')
    with pytest.raises(own_data.DataError, match="line 2, column 'label': '1.5' is not one"):
        own_data.read_data(bad, require_splits=())


@pytest.mark.parametrize("kind,own", [
    ("classifier", OPTS[::-1]),                   # same names, other order: logits misread
    ("classifier", ["negative", "positive"]),     # 2 of the head's 3 classes
    ("linear-head", OPTS + ["mixed"]),            # more options than the head has classes
])
def test_rows_whose_options_are_not_the_heads_classes_are_refused(tmp_path, capsys, kind, own):
    """A classifier's logit k is id2label[k] (a linear head's, the TOML's options[k]); a row
    listing other options, or the same ones in another order, was swept silently (its label
    and scores read against the wrong logits) or failed mid-run with a shape mismatch."""
    rows = _rows()
    bad = rows[45]  # an eval row
    bad.update(options=own, actions=(ACTS * 2)[:len(own)], label=0)
    head = CLASSIFIER if kind == "classifier" else CLASSIFIER.replace(
        'logits = "classifier"', 'logits = "linear-head"')
    toml = _toml(tmp_path / "m.toml", head)
    data = _jsonl(tmp_path / "d.jsonl", rows)
    line = _sweep_error(tmp_path, capsys, "--model-config", str(toml), "--data", str(data))
    assert f"{data}: line 46, column 'options'" in line and "head's classes" in line


@pytest.mark.parametrize("options", [["neg", "pos"], ["a", "b", "c", "d"]])
def test_classifier_options_must_count_the_heads_outputs(tmp_path, capsys, options):
    """options = 2 names for a 3-output head failed mid-run ('shape mismatch: value array of
    shape (20,3)...') after the run folder was written."""
    toml = _toml(tmp_path / "m.toml", f'''name = "cls"
logits = "classifier"
checkpoint = "{HF / 'bert'}"
options = {json.dumps(options)}
''')
    rows = [{k: v for k, v in r.items() if k not in ("options", "actions")} for r in _rows()]
    for r in rows:
        r["label"] = min(r["label"], len(options) - 1)
    data = _jsonl(tmp_path / "d.jsonl", rows)
    line = _sweep_error(tmp_path, capsys, "--model-config", str(toml), "--data", str(data))
    assert f"{toml}: options" in line and f"{len(options)} names" in line and "3 logits" in line


def test_resume_with_an_edited_toml_names_only_the_changed_key(tmp_path, capsys):
    """Editing one TOML value and rerunning the same --run was refused (good) with both whole
    parsed TOMLs in the message (~1500 characters); the message now names the changed keys."""
    toml = _toml(tmp_path / "m.toml", CLASSIFIER.replace("classifier", "linear-head", 1)
                 + "[linear_head]\nC = 10.0\n")
    data = _jsonl(tmp_path / "d.jsonl", _rows())
    args = ["sweep", "--results-dir", str(tmp_path / "r"), *TINY, "--model-config", str(toml),
            "--data", str(data), "--run", "R"]
    assert main(args) == 0
    capsys.readouterr()
    toml.write_text(toml.read_text().replace("C = 10.0", "C = 0.5"))
    before = sorted(p.name for p in (tmp_path / "r" / "R").rglob("*"))
    assert main(args) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "'model_config_parsed.config.linear_head_C': (10.0, 0.5)" in line
    assert "marker_token" not in line and len(line) < 400
    assert sorted(p.name for p in (tmp_path / "r" / "R").rglob("*")) == before


def test_editing_config_json_in_place_never_reuses_cached_outputs(tmp_path, capsys):
    """config.json changes the model without touching the weights (classifier_pooling cls ->
    mean, eps, θ, window); the cache keys and run identity held only the weights' sha256, so
    a sweep after the edit loaded the old head/reference outputs (logits identical to 0.0)."""
    import shutil

    import numpy as np

    folder = tmp_path / "mb"
    shutil.copytree(HF / "modernbert", folder)
    toml = _toml(tmp_path / "m.toml", CLASSIFIER.replace(str(HF / "modernbert"), str(folder)))
    data = _jsonl(tmp_path / "d.jsonl", _rows())
    args = ["sweep", "--results-dir", str(tmp_path / "r"), *TINY, "--model-config", str(toml),
            "--data", str(data)]
    assert main([*args, "--run", "A"]) == 0
    config = folder / "config.json"
    assert '"classifier_pooling": "cls"' in config.read_text()
    config.write_text(config.read_text().replace('"classifier_pooling": "cls"',
                                                 '"classifier_pooling": "mean"'))
    assert main([*args, "--run", "A"]) == 2  # resuming A with another model: refused
    assert "checkpoint_config_sha256" in capsys.readouterr().err.strip().splitlines()[-1]
    assert main([*args, "--run", "B"]) == 0
    assert "loaded fitted head" not in capsys.readouterr().err
    a, b = (np.load(tmp_path / "r" / run / "reference" / "calibration_outputs.npz")["logits"]
            for run in ("A", "B"))
    assert np.abs(a - b).max() > 1e-3


@pytest.mark.parametrize("field,value,found", [("text", "I typed [unused0] here", 4),
                                               ("question", "why " * 600, 0)])
def test_marker_rows_that_lose_or_gain_markers_are_refused_before_writing(
        tmp_path, capsys, field, value, found):
    """A state holding the marker token, or a question so long the markers are cut, failed at
    the reference outputs (run folder written) naming the row as np.str_('...')."""
    rows = _rows(question="How does the writer feel?")
    rows[45][field] = value
    data = _jsonl(tmp_path / "d.jsonl", rows)
    line = _sweep_error(tmp_path, capsys, "--model-config",
                        str(ROOT / "examples" / "model-marker.toml"), "--data", str(data))
    assert f"row 'eval5': its prompt holds {found} marker tokens" in line
    assert str(data) in line and "np.str_" not in line


@pytest.mark.parametrize("kind,labels,expect", [
    ("linear-head", None, "0 labelled rows"),                 # no labels at all
    ("linear-head", 0, "classes [0] of 0, 1, 2"),             # one class only
    ("marker", None, "0 labelled rows"),                      # a fitted scorer needs labels
])
def test_a_fit_split_that_cannot_fit_the_head_is_refused_before_writing(
        tmp_path, capsys, kind, labels, expect):
    """No labels in the fit split (or one class) failed inside sklearn after the run folder
    was written ('Found array with 0 sample(s)...', 'needs samples of at least 2 classes')."""
    rows = _rows(question="How does the writer feel?")
    for r in rows:
        if r["split"] == "fit":
            r["label"] = labels if labels is not None else -1
    data = _jsonl(tmp_path / "d.jsonl", rows)
    toml = ROOT / "examples" / f"model-{kind}.toml"
    line = _sweep_error(tmp_path, capsys, "--model-config", str(toml), "--data", str(data))
    assert str(data) in line and "fit split" in line and expect in line


@pytest.mark.parametrize("body,expect", [
    ("def f(ck):\n    raise RuntimeError('boom inside factory')\n",
     "RuntimeError: 'boom inside factory'"),
    ("def f():\n    return 1\n", "TypeError: 'f() takes 0 positional arguments"),
])
def test_a_factory_that_raises_is_one_line(tmp_path, capsys, monkeypatch, body, expect):
    """--model pkg:factory whose call raised (a bug in it, a wrong signature) ended in a
    traceback; the import already was one line."""
    name = f"brk16_factory_{len(body)}"  # one module per case (sys.modules caches them)
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    line = _sweep_error(tmp_path, capsys, "--model", f"{name}:f")
    assert line.startswith(f"variants: error: --model '{name}:f': calling it raised")
    assert expect in line


def test_id2label_with_gaps_is_refused_not_named_none(tmp_path):
    """id2label {"0", "2", "5"} on a 3-logit head gave the options ['negative', 'None',
    'positive'] (the gap read as the string 'None', label 5 dropped), silently."""
    import shutil

    from variants.checkpoints.load import CheckpointError, load_checkpoint

    folder = tmp_path / "b"
    shutil.copytree(HF / "bert", folder)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {"0": "negative", "2": "positive", "5": "neutral"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json: id2label keys \['0', '2', '5'\] are "
                                              r"not 0\.\.2"):
        load_checkpoint(folder)


def test_marker_scorer_with_a_misshaped_bias_names_the_tensor(tmp_path, capsys):
    """scorer = "embeddings.LayerNorm" (weight (384,), bias (384,)) ended in mlx's bare
    '[reshape] Cannot reshape array of size 384 into shape (1).'"""
    toml = _toml(tmp_path / "m.toml", (ROOT / "examples" / "model-marker.toml").read_text()
                 .replace('scorer = "fit"', 'scorer = "embeddings.LayerNorm"'))
    data = _jsonl(tmp_path / "d.jsonl", _rows(question="How does the writer feel?"))
    line = _sweep_error(tmp_path, capsys, "--model-config", str(toml), "--data", str(data))
    assert f"{toml}: [marker] scorer: embeddings.LayerNorm.bias has shape (384,)" in line
    assert "need () or (1,)" in line


def test_a_column_given_twice_is_refused(tmp_path):
    """A CSV header 'text,label,text' (or a JSONL object with "text" twice) silently kept the
    last cell: the row's text was 'b', not 'a'."""
    csv_file = tmp_path / "d.csv"
    csv_file.write_text("text,label,text\na,0,b\n")
    with pytest.raises(own_data.DataError, match=r"d\.csv: line 1, column 'text': the column "
                                                 r"appears twice"):
        own_data.read_data(csv_file, require_splits=())
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "ok"}\n{"text": "a", "label": 0, "text": "b"}\n')
    with pytest.raises(own_data.DataError, match=r"d\.jsonl: line 2, column 'text': the column "
                                                 r"appears twice"):
        own_data.read_data(jsonl, require_splits=())


def test_sweep_help_prints_the_data_schema(capsys):
    """`variants sweep --help` shows the --data schema; own_data.SCHEMA_HELP
    was written for it but never shown."""
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for line in own_data.SCHEMA_HELP.splitlines():  # verbatim, its columns kept
        assert line in out


def test_a_model_toml_saved_with_a_bom_and_crlf_reads(tmp_path):
    """A TOML saved by Notepad (UTF-8 BOM, CRLF) was 'not valid TOML (Invalid statement (at
    line 1, column 1))' though the data reader already drops a BOM."""
    from variants.models.model_config import load_model_config

    path = tmp_path / "m.toml"
    path.write_bytes(b'\xef\xbb\xbfname = "x"\r\nlogits = "cosine"\r\noptions = ["a", "b"]\r\n')
    cfg = load_model_config(path)
    assert (cfg.name, cfg.logits, cfg.options) == ("x", "cosine", ["a", "b"])


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_toml_scores_must_be_finite(tmp_path, value):
    """TOML has nan and inf literals: scores = [nan, 0.0, 1.0] was accepted (a data row's
    non-finite score is refused), and expected scores / Δscore became NaN."""
    from variants.models.model_config import load_model_config

    path = _toml(tmp_path / "m.toml", f'name = "x"\nlogits = "cosine"\noptions = ["a", "b", "c"]\n'
                 f"scores = [{value}, 0.0, 1.0]\n")
    with pytest.raises(ModelConfigError, match="scores: must be a list of finite numbers"):
        load_model_config(path)


def test_toml_options_need_two(tmp_path):
    """options = ["only"] was accepted (a data row needs >= 2) and swept to exit 0 with every
    metric trivially perfect: a one-option decision decides nothing."""
    with pytest.raises(ModelConfigError, match=r"options: has 1 option; give at least 2"):
        parse_model_config({"name": "x", "logits": "cosine", "options": ["only"]}, "m.toml")
    with pytest.raises(ModelConfigError, match=r"\[tasks\.t\] options: has 1 option"):
        parse_model_config({"name": "x", "logits": "cosine",
                            "tasks": {"t": {"options": ["only"]}}}, "m.toml")


@pytest.mark.parametrize("flag", ["--checkpoint", "--data"])
def test_an_empty_path_flag_is_refused_not_read_as_the_current_folder(flag, tmp_path, capsys):
    """`--checkpoint ""` resolved to the current folder and failed with "config.json is missing"
    without naming it: an empty path is now its own one-line error, exit 2, nothing written."""
    from variants.cli import main

    code = main(["sweep", flag, "", "--results-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"{flag} is empty" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_semicolon_separated_csv_is_named_as_such(tmp_path):
    """A CSV saved with ';' (a European spreadsheet) read as one unknown column 'text;label':
    the error now says the separator is the problem."""
    from variants.datasets.own import DataError, read_data

    f = tmp_path / "rows.csv"
    f.write_text("text;label\nso good;2\n")
    with pytest.raises(DataError) as e:
        read_data(f)
    msg = str(e.value)
    assert "separated by semicolons" in msg and "'text;label'" in msg and "\n" not in msg

"""Bad input found by an attack on a fresh clone (issue #39): each is one line naming the flag
and the fix, exit 2, and nothing written (no empty run folder left behind)."""

from pathlib import Path

import pytest

from variants.cli import main

TINY = ["--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1", "--no-progress"]


def _refused(argv, capsys):
    """``variants argv`` returns (or exits with) 2; its stderr, checked to be one line."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("variants") and err.count("\n") == 1, err
    return err


# -- sweep: --n-fit 0 only for a model that fits nothing ---------------------------------------

@pytest.mark.parametrize("n_fit, says", [
    ("0", "--n-fit 0: model minilm-sentiment fits its head on the fit split, which would be "
          "empty; pass --n-fit 10 or more"),
    ("5", "--n-fit 5 is too small; pass --n-fit 10 or more (or 0 for a model that fits "
          "nothing)"),
])
def test_sweep_n_fit_too_small_names_the_flag_and_writes_nothing(tmp_path, capsys, monkeypatch,
                                                                 n_fit, says):
    monkeypatch.chdir(tmp_path)
    err = _refused(["sweep", "--n-fit", n_fit, *TINY], capsys)
    assert says in err
    assert list(tmp_path.iterdir()) == []


# -- a command stopped before writing leaves no empty folder -----------------------------------

@pytest.mark.parametrize("make, says", [
    (lambda p: p.mkdir(), "config.json is missing; a checkpoint folder needs config.json"),
    (lambda p: p.write_text("x"), "is not a folder; pass a Hugging Face checkpoint folder"),
])
def test_sensitivity_bad_checkpoint_leaves_no_folder(tmp_path, capsys, monkeypatch, make, says):
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "BAD")
    err = _refused(["sensitivity", "--checkpoint", "BAD", "--no-progress"], capsys)
    assert says in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BAD"]  # no results/sensitivity/<model>


def test_a_sweep_stopped_before_writing_takes_its_folders_back(tmp_path, capsys, monkeypatch):
    from variants.sweep.run import Sweep

    def reference(self):
        raise ValueError("the head cannot be fitted; fix it")

    monkeypatch.setattr(Sweep, "reference", reference)
    monkeypatch.chdir(tmp_path)
    err = _refused(["sweep", "--n-fit", "60", *TINY], capsys)
    assert "the head cannot be fitted" in err
    assert list(tmp_path.iterdir()) == []  # not results/<run>/ nor results/.cache/.lock
    # a results folder that was there keeps what it held, its cache included
    (tmp_path / "results" / ".cache").mkdir(parents=True)
    (tmp_path / "results" / "other-run").mkdir()
    _refused(["sweep", "--n-fit", "60", *TINY], capsys)
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [".cache", "other-run"]


# -- names that become folders or CSV keys -----------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--run", "a\nb"], "run name 'a\\nb' must be a plain folder name: it holds a control "
                        "character ('\\n')"),
    (["--run", "tab\there"], "holds a control character ('\\t')"),
    (["--run", "a\\b"], "holds a path separator"),
    (["--run", "null"], "run name 'null' must be a plain folder name: it reads as a missing "
                        "value (NaN) in a CSV file"),
    (["--run", "NA"], "reads as a missing value (NaN)"),
    (["--results-dir", "r\nx"], "--results-dir 'r\\nx' holds a control character ('\\n')"),
])
def test_sweep_names_are_refused_before_loading(tmp_path, capsys, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    err = _refused(["sweep", "--n-fit", "60", *TINY, *args], capsys)
    assert says in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, says", [
    ("a\\nb", "holds a control character"),
    ("null", "reads as a missing value (NaN) in a CSV file"),
    ("None", "reads as a missing value (NaN) in a CSV file"),
    ("a\\\\b", "holds a path separator"),
])
def test_a_model_toml_name_that_cannot_name_a_run_is_refused(tmp_path, name, says):
    from variants.models.model_config import ModelConfigError, load_model_config

    path = tmp_path / "m.toml"
    path.write_text(f'name = "{name}"\nlogits = "linear-head"\noptions = ["a", "b"]\n'
                    'actions = ["x", "y"]\n')
    with pytest.raises(ModelConfigError, match="name") as e:
        load_model_config(path)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_every_generated_variant_name_is_a_plain_csv_key():
    from runs.names import name_problem
    from variants.families import FAMILIES, get_family

    for family in FAMILIES:
        for v in get_family(family).ladder():
            assert name_problem(v.name, csv=True) is None, (family, v.name)


# -- export --out: refused up front --------------------------------------------------------------

@pytest.mark.parametrize("out, says", [
    ("", "--out is empty; pass a new folder"),
    ("  ", "--out is empty; pass a new folder"),
    (".", "--out . names no new folder"),
    ("..", "--out .. names no new folder"),
    ("a\nb", "holds a control character ('\\n')"),
])
def test_export_out_that_names_no_new_folder_is_refused_first(tmp_path, capsys, monkeypatch, out,
                                                               says):
    import variants.export.source as source

    def locate(*a, **k):
        raise AssertionError("the variant was located before --out was refused")

    monkeypatch.setattr(source, "locate", locate)
    empty = tmp_path / "cwd"
    empty.mkdir()
    monkeypatch.chdir(empty)  # an empty current folder: '' and '.' passed the check there
    fixture = Path(__file__).parents[1] / "fixtures" / "sweep_small"
    err = _refused(["export", str(fixture), "--variant", "q8-g64", "--out", out], capsys)
    assert says in err
    assert list(empty.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cwd"]


@pytest.mark.parametrize("verb, flag", [("search", "--out"), ("sensitivity", "--out"),
                                        ("check", "--output-dir")])
def test_an_output_folder_with_a_newline_is_refused(tmp_path, capsys, monkeypatch, verb, flag):
    monkeypatch.chdir(tmp_path)
    fixture = Path(__file__).parents[1] / "fixtures" / "sweep_small"
    argv = [verb, flag, "a\nb"] + ([str(fixture)] if verb == "check" else ["--no-progress"])
    err = _refused(argv, capsys)
    assert f"{flag} 'a\\nb' holds a control character ('\\n'); pass a plain path" in err
    assert list(tmp_path.iterdir()) == []


# -- an empty folder argument is not the current folder ----------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["check", ""], "RESULTS_DIR is empty; pass a folder"),
    (["check", " "], "RESULTS_DIR is empty; pass a folder"),
    (["plot", ""], "RESULTS_DIR is empty; pass a folder"),
    (["compare", "", "x"], "A is empty; pass a folder"),
    (["compare", "x", "a\nb"], "B 'a\\nb' holds a control character"),
    (["export", "", "--out", "o"], "SOURCE is empty; pass a folder"),
    (["verify", ""], "DIR is empty; pass a folder"),
])
def test_an_empty_folder_argument_is_refused(tmp_path, capsys, monkeypatch, argv, says):
    # '' was read as '.': inside a run folder, `variants check ''` checked it
    monkeypatch.chdir(tmp_path)
    err = _refused(argv, capsys)
    assert says in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["sweep", "--model-config", "a\nb"],
    ["sweep", "--contract", "a\nb"],
    ["check", "r/ba\nse"],
    ["verify", "r/ba\nse"],
])
def test_a_path_with_a_newline_is_named_on_one_line(argv, tmp_path, monkeypatch, capsys):
    """Issue #39's attack: a path holding a newline printed its error over two lines; every
    error line escapes control characters (metrics._checks.printable)."""
    from variants.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # refused by the parser (runs.commands.args.Parser.error)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("variants: error: ") and "\\n" in err, err
    assert list(tmp_path.iterdir()) == []


# -- issue #42's flags: one line naming the flag and the fix, nothing written -------------------

@pytest.mark.parametrize("argv, says", [
    (["search", "--embedding-texts", "missing.txt"], "--embedding-texts missing.txt is not a "
                                                     "file; pass a UTF-8 text file"),
    (["search", "--modes", "fp4"], "--modes 'fp4' is not a microscaling mode; choose from mxfp4"),
    (["sweep", "--family", "quant", "--quant-mode", "mxfp4", "--bits", "8"],
     "--quant-mode mxfp4 stores 4-bit values; drop --bits 8"),
    (["sweep", "--family", "quant", "--bits-map", "value=mxfp4:32"],
     "mxfp4 has its own width, group size and scales"),
    (["sweep", "--family", "quant", "--quantize-embeddings", "--bits-map",
      "word_embeddings@unseen=2", "--embedding-texts", "missing.txt"],
     "--embedding-texts missing.txt is not a file"),
    (["sweep", "--family", "quant", "--embedding-texts", "missing.txt"],
     "--embedding-texts tells the word-table rows in use for a --bits-map entry"),
    (["search", "--no-unseen-rows", "--embedding-texts", "x.txt"],
     "the unseen-rows step, which is off here"),
    (["search", "--modes", "none", "mxfp4"], "'none' means no mode"),
    (["sweep", "--family", "quant", "--quant-mode", "mxfp8", "--scale-dtype", "bfloat16"],
     "--quant-mode mxfp8 stores its own 8-bit scales; drop --scale-dtype bfloat16"),
    (["sweep", "--family", "quant", "--quant-mode", "mxfp4", "--group-size", "128"],
     "--quant-mode mxfp4 has groups of 32; drop --group-size 128"),
])
def test_format_flags_are_refused_in_one_line(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    err = _refused([*argv, "--results-dir", str(tmp_path / "r")], capsys)
    assert says in err
    assert not (tmp_path / "r").exists()

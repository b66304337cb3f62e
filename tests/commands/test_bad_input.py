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

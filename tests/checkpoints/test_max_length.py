"""The tokenizer's max length set by the user: ``--max-length`` (sweep, search, sensitivity) or
the model TOML's ``max_length``, the flag first. The bundled MiniLM's tokenizer.json bakes 128
tokens; asked for 256, texts are cut at 256, run.json's ``tokenizer.decided`` names where the
256 came from, and the tokenizer fingerprint (a part of every cache key) changes. A length the
checkpoint's position table (512) cannot hold, or one below 3 tokens, is one line, exit 2."""

import pytest

from variants.checkpoints.load import CheckpointError, load_checkpoint
from variants.models.model_config import ModelConfigError, load_model_config
from variants.sweep.config import SweepConfig, SweepError

LONG = " ".join(["The movie was great but the ending felt rushed and strange."] * 30)


def _toml(tmp_path, extra=""):
    path = tmp_path / "model.toml"
    path.write_text(f'name = "m"\nlogits = "linear-head"\noptions = ["neg", "pos"]\n{extra}')
    return path


def test_model_toml_max_length(tmp_path):
    cfg = load_model_config(_toml(tmp_path, "max_length = 256\n"))
    assert cfg.max_length == 256 and cfg.to_dict()["max_length"] == 256
    plain = load_model_config(_toml(tmp_path))
    assert plain.max_length is None and "max_length" not in plain.to_dict()  # keys as before


@pytest.mark.parametrize("value", ["0", "2", "true", '"512"', "256.0"])
def test_model_toml_bad_max_length(tmp_path, value):
    with pytest.raises(ModelConfigError, match=r"model\.toml: max_length must be a whole "
                                               r"number of tokens >= 3"):
        load_model_config(_toml(tmp_path, f"max_length = {value}\n"))


def test_flag_before_toml_before_tokenizer_files(tmp_path):
    toml = str(_toml(tmp_path, "max_length = 200\n"))
    assert SweepConfig().max_length_choice() is None
    assert SweepConfig(model_config=toml).max_length_choice() == (
        200, f"model TOML max_length ({toml})")
    assert SweepConfig(model_config=toml, max_length=300).max_length_choice() == (
        300, "--max-length")


@pytest.fixture(scope="module")
def ck256():
    return load_checkpoint(max_length=(256, "--max-length"))


def test_the_tokenizer_cuts_at_the_asked_length_and_records_where_from(checkpoint, ck256):
    tok, base = ck256.tokenizer, checkpoint.tokenizer
    assert base.max_length == 128
    assert base.settings()["decided"]["max_length"] == "tokenizer.json truncation.max_length"
    assert tok.max_length == 256
    s = tok.settings()
    assert s["max_length"] == 256 and s["decided"]["max_length"] == "--max-length"
    (long_256,), n_cut = tok.encode([LONG])
    assert len(long_256.ids) == 256 and n_cut == 1
    (long_128,), _ = base.encode([LONG])
    assert len(long_128.ids) == 128
    assert tok.fingerprint() != base.fingerprint()  # and so every cache key


def test_above_the_position_table_is_refused():
    with pytest.raises(CheckpointError, match=r"^--max-length 513 exceeds what .*config\.json "
                                              r"can read \(512 tokens"):
        load_checkpoint(max_length=(513, "--max-length"))


def test_load_inputs_passes_it_on(tmp_path):
    from variants.sweep.inputs import load_inputs

    cfg = SweepConfig(max_length=200, n_fit=10, n_calibration=20, n_eval=10,
                      timing_batch_sizes=(1,), results_dir=str(tmp_path)).validate()
    _, ck, _ = load_inputs(cfg)
    assert ck.tokenizer.max_length == 200
    assert ck.tokenizer.settings()["decided"]["max_length"] == "--max-length"


@pytest.mark.parametrize("verb", ["sweep", "search", "sensitivity"])
def test_bad_flag_is_one_line_exit_2(tmp_path, capsys, verb):
    from variants.cli import main

    root = tmp_path / "r"
    assert main([verb, "--max-length", "2", "--results-dir", str(root),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("variants: error: --max-length must be a whole number of tokens >= 3 "
                   "(special tokens included), got 2; e.g. 512")
    assert not root.exists()


def test_search_passes_it_to_its_sweeps_and_resume_identity():
    from variants.search.driver import SearchOptions

    o = SearchOptions(max_length=256)
    assert o.sweep_kwargs()["max_length"] == 256 and o.settings()["max_length"] == 256
    with pytest.raises(SweepError, match="--max-length must be"):
        SweepConfig(**dict(SearchOptions(max_length=1).sweep_kwargs())).validate()

"""A mistyped command never damages a finished run: every verb checks its flags and outputs before
it reads or writes a folder, and a usage error is one line (exit 2) naming the flag, the value and
what it may be, not the whole usage."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runs.folder import CheckError
from runs.plots.data import PlotError
from variants.cli import main

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sweep_small"
ROOT = Path(__file__).resolve().parents[2]


def _finished_run(tmp_path):
    """A copy of the fixture run whose run.json says "complete", as a finished sweep leaves it."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(dict(meta, status="complete"), indent=2) + "\n")
    return run


def _digest(folder):
    """SHA-256 of every file's path and bytes: equal digests = the folder is exactly as it was."""
    h = hashlib.sha256()
    for p in sorted(Path(folder).rglob("*")):
        h.update(str(p.relative_to(folder)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _usage_error(argv, capsys):
    """Run ``variants argv`` expecting a usage error; returns its stderr (checked to be one
    ``variants: error:`` line, without the usage text)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("variants: error: ") and err.count("\n") == 1, err
    assert "usage:" not in err
    return err


# -- check: every flag validated before the folder is touched ---------------------------------

@pytest.mark.parametrize("flag, value, rule", [
    ("--alpha", "2", "in (0, 1)"),
    ("--alpha", "nan", "in (0, 1)"),
    ("--alpha", "0", "in (0, 1)"),
    ("--n-bootstrap", "-1", "in [0, 100000]"),
    ("--n-bootstrap", "100000000000", "in [0, 100000]"),
    ("--near-tie-margin", "nan", "in [0, 10000]"),
    ("--near-tie-margin", "-1", "in [0, 10000]"),
    ("--near-tie-margin", "inf", "in [0, 10000]"),
    # issue #39's attack: 1e300 became a stratum the checker refused after files were rewritten
    ("--near-tie-margin", "1e300", "in [0, 10000]"),
    ("--seed", "-1", ">= 0"),
    ("--worst", "-1", ">= 0"),
])
def test_check_with_a_bad_flag_leaves_the_run_byte_identical(tmp_path, capsys, flag, value, rule):
    run = _finished_run(tmp_path)
    before = _digest(run)
    err = _usage_error(["check", str(run), flag, value], capsys)
    assert f"{flag} '{value}' must be " in err and rule in err
    assert _digest(run) == before
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


def test_check_with_a_non_number_names_the_flag(tmp_path, capsys):
    run = _finished_run(tmp_path)
    err = _usage_error(["check", str(run), "--alpha", "abc"], capsys)
    assert err.startswith("variants: error: --alpha 'abc' is not a number, e.g. 0.05")


@pytest.mark.parametrize("overrides, message", [
    ({"alpha": 2.0}, "--alpha 2.0 must be in (0, 1)"),
    ({"alpha": float("nan")}, "--alpha nan must be in (0, 1)"),
    ({"n_bootstrap": -1}, "--n-bootstrap -1 must be in [0, 100000]"),
    ({"n_bootstrap": 2.5}, "--n-bootstrap 2.5 must be an integer"),
    ({"near_tie_margin": float("nan")}, "--near-tie-margin nan must be in [0, 10000]"),
    # 40 calibration examples cannot give a conformal ε at alpha 0.001 (needs 999)
    ({"alpha": 0.001}, "alpha=0.001 needs at least 999 calibration examples"),
])
def test_check_run_refuses_bad_settings_before_writing(tmp_path, overrides, message):
    from runs.judge import check_run

    run = _finished_run(tmp_path)
    before = _digest(run)
    with pytest.raises(CheckError) as e:
        check_run(run, **overrides)
    assert message in str(e.value)
    assert _digest(run) == before


def test_check_output_dir_that_cannot_be_made_exits_2_up_front(tmp_path, capsys):
    run = _finished_run(tmp_path)
    before = _digest(run)
    blocker = tmp_path / "a-file"
    blocker.write_text("mine\n")
    for out, says in ((blocker, "is a file; pass a folder"),
                      (blocker / "sub", "cannot create the folder"),
                      ("", "is empty; pass a folder")):  # not the current folder
        assert main(["check", str(run), "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"variants: error: --output-dir {out}") and says in err, err
        assert err.count("\n") == 1
    assert blocker.read_text() == "mine\n" and _digest(run) == before


def test_contract_not_found_lists_the_packaged_contracts(tmp_path, capsys):
    run = _finished_run(tmp_path)
    before = _digest(run)
    assert main(["check", str(run), "--contract", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "contract file nosuch not found" in err and "default | strict | lenient" in err
    assert _digest(run) == before


def test_contract_refuses_an_unbounded_bootstrap(tmp_path):
    from contracts.checker import ContractError, load_contract

    path = tmp_path / "c.toml"
    path.write_text('name = "c"\n[settings]\nn_bootstrap = 100000000000\n[[clause]]\nid = "a"\n'
                    'metric = "agreement"\nstatistic = "rate"\nmin = 0.9\n')
    with pytest.raises(ContractError, match=r"n_bootstrap = 100000000000 must be in \[0, 100000\]"):
        load_contract(path)


# -- plot: --dpi bounded and named ------------------------------------------------------------

@pytest.mark.parametrize("value, says", [("0", "must be an integer in [20, 600]"),
                                         ("100000", "must be an integer in [20, 600]"),
                                         ("abc", "is not an integer")])
def test_plot_dpi_out_of_range_names_the_flag(tmp_path, capsys, value, says):
    run = _finished_run(tmp_path)
    before = _digest(run)
    err = _usage_error(["plot", str(run), "--dpi", value], capsys)
    assert f"--dpi '{value}' {says}" in err
    assert _digest(run) == before and not (run / "plots").exists()


def test_plot_run_refuses_a_dpi_out_of_range(tmp_path, _plots_only_where_marked):
    plot_run = _plots_only_where_marked  # the real one
    run = _finished_run(tmp_path)
    for dpi in (0, 100_000, 110.0):
        with pytest.raises(PlotError, match=r"dpi .* pass an integer in \[20, 600\]"):
            plot_run(run, dpi=dpi)
    assert not (run / "plots").exists()


# -- sensitivity: outputs and flags checked before the model is loaded ------------------------

@pytest.fixture
def no_loading(monkeypatch):
    """Loading the sweep's inputs fails the test: what is checked must be checked before."""
    import variants.sweep.run as sweep  # imported now, so its own binding is the real function
    import variants.sweep.inputs as sweep_inputs

    def load_inputs(cfg):
        raise AssertionError("inputs loaded before the bad flag was refused")

    monkeypatch.setattr(sweep_inputs, "load_inputs", load_inputs)
    monkeypatch.setattr(sweep, "load_inputs", load_inputs)


def test_sensitivity_out_that_is_a_file_or_unwritable_exits_2_first(tmp_path, capsys, no_loading):
    mine = tmp_path / "mine.csv"
    mine.write_text("keep me\n")
    for out, says in ((mine, "is a file; pass a folder"),
                      (mine / "sub", "cannot create the folder"),
                      ("", "is empty; pass a folder")):
        assert main(["sensitivity", "--out", str(out), "--results-dir", str(tmp_path / "r"),
                     "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"variants: error: --out {out}") and says in err, err
        assert "delete" not in err and err.count("\n") == 1
    assert mine.read_text() == "keep me\n"


@pytest.mark.parametrize("args, says", [
    (["--bits", "0"], "--bits 0 is not one of: 2, 3, 4, 6, 8"),
    (["--group-size", "0"], "--group-size 0 is not one of: 32, 64, 128"),
    (["--layers", "["], "--layers '[' is not a valid regular expression"),
    (["--n-examples", "5"], "--n-examples '5' must be an integer >= 10"),
    (["--seed", "-1"], "--seed '-1' must be an integer >= 0"),
])
def test_sensitivity_bad_flags_are_refused_before_loading(tmp_path, capsys, no_loading, args,
                                                          says):
    err = _usage_error(["sensitivity", "--results-dir", str(tmp_path / "r"), *args], capsys)
    assert says in err
    assert not (tmp_path / "r").exists()


def test_sensitivity_size_beyond_the_split_names_its_own_flag(tmp_path, capsys):
    # --n-fit / --n-calibration small: the command fits the reference (head and temperatures)
    # before it counts the rows, and the rows (the search split's calibration half, from
    # --n-search, left at its default) do not depend on them; the defaults (2000 fit, 800
    # calibration texts) made this usage error take ~15 s
    assert main(["sensitivity", "--n-examples", "1000000", "--results-dir", str(tmp_path / "r"),
                 "--n-fit", "40", "--n-calibration", "40", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--n-examples 1000000 is more than the" in err and "--n-calibration" not in err


# -- usage errors: one line naming the flag, the value and the choices ------------------------

@pytest.mark.parametrize("argv, says", [
    ([], "no command given; choose one of: sweep, check, selftest, plot, compare, list, "
         "sensitivity, search"),
    (["frob"], "unknown command 'frob'; choose one of: sweep, check, selftest, plot, compare, "
               "list, sensitivity, search"),
    (["sweep", "--n-eval", "abc"], "--n-eval 'abc' is not an integer; see 'variants sweep --help'"),
    (["sweep", "--family", "nosuch"], "--family 'nosuch' is not one of: quant, lowrank, prune, "
                                      "exit, student, exact"),
    (["sweep", "--cold-start", "some"], "--cold-start 'some' is not one of: none, reference, all"),
    (["sweep", "--timing-budget-s", "x"], "--timing-budget-s 'x' is not a number"),
    (["check"], "the following arguments are required: RESULTS_DIR"),
    (["list", "--frob"], "unrecognized arguments: --frob; see 'variants list --help'"),
])
def test_usage_errors_are_one_line(capsys, argv, says):
    err = _usage_error(argv, capsys)
    assert says in err


def test_a_huge_value_is_cut_in_a_usage_error(capsys):
    err = _usage_error(["sweep", "--n-eval", "x" * 100_000], capsys)
    assert "--n-eval 'xxxx" in err and "(100000 chars)" in err and len(err) < 300


# -- VARIANTS_BLAS named explicitly must load -------------------------------------------------

def test_an_explicit_blas_that_cannot_be_loaded_exits_2(tmp_path):
    env = dict(os.environ, VARIANTS_BLAS=str(tmp_path / "nonexistent.so"),
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "variants", "list"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert done.stderr.startswith(f"variants: error: VARIANTS_BLAS='{tmp_path / 'nonexistent.so'}'"
                                  " cannot be loaded")
    assert "none for MLX's own BLAS" in done.stderr


# -- folders that are not runs, searches too small ---------------------------------------------

@pytest.mark.plots  # the real plot_run (the suite stubs it elsewhere)
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("verb, says", [("check", "/proc has no reference/outputs.npz"),
                                        ("plot", "/proc has no summary.csv")])
def test_a_folder_that_is_no_run_is_named_not_its_lock_file(capsys, verb, says):
    # /proc cannot hold a .lock file: the verb must say the folder is no run, not "[Errno 2]"
    assert main([verb, "/proc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"variants: error: {says}") and ".lock" not in err, err


@pytest.mark.plots
def test_plot_of_a_file_says_it_is_not_a_folder(tmp_path, capsys):
    afile = tmp_path / "summary.csv"
    afile.write_text("a,b\n")
    assert main(["plot", str(afile)]) == 2
    assert f"results folder {afile} is not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("n", [-1, 0, 39])
def test_search_split_too_small_is_refused_before_loading(n):
    from variants.search.driver import SearchOptions

    with pytest.raises(ValueError, match=f"--n-search {n} must be >= 40"):
        SearchOptions(n_search=n).validate()
    SearchOptions(n_search=40).validate()  # the smallest it takes


def test_run_sweep_as_a_library_refuses_an_explicit_blas_that_cannot_be_loaded(tmp_path):
    # the command line exits 2; a script calling run_sweep must not time everything on MLX's
    # reference BLAS (70x slower) without a word either
    code = ("import variants\n"
            "from variants.sweep.run import run_sweep\n"
            "from variants.sweep.config import SweepError\n"
            "try:\n"
            "    run_sweep(log=lambda m: None, family='quant', params={'bits': [8]},\n"
            "              results_dir='out')\n"
            "except SweepError as e:\n"
            "    print('refused:', e)\n")
    env = dict(os.environ, VARIANTS_BLAS=str(tmp_path / "nonexistent.so"), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith(f"refused: VARIANTS_BLAS='{tmp_path / 'nonexistent.so'}'"
                                  " cannot be loaded"), (done.stdout, done.stderr[-2000:])
    assert not (tmp_path / "out").exists()


def test_a_tiny_alpha_names_a_readable_number_of_calibration_examples(tmp_path, capsys):
    # 1/alpha - 1 for alpha = 1e-300 is a 300-digit integer: the message stays one short line
    run = _finished_run(tmp_path)
    before = _digest(run)
    assert main(["check", str(run), "--alpha", "1e-300"]) == 2
    err = capsys.readouterr().err
    assert _digest(run) == before
    assert err.startswith("variants: error: alpha=1e-300 needs at least 1e+300 calibration "
                          "examples"), err
    assert len(err) < 300 and err.count("\n") == 1


@pytest.mark.parametrize("out", ["", "  "])
def test_search_out_that_is_empty_exits_2_first(tmp_path, capsys, monkeypatch, no_loading, out):
    # an empty --out was falsy: the search ran into results/search/... without a word
    monkeypatch.chdir(tmp_path)
    assert main(["search", "--out", out, "--results-dir", str(tmp_path / "r"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == "variants: error: --out is empty; pass a folder\n", err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, says", [
    (["--results-dir", ""], "--results-dir is empty; pass a folder"),
    (["--results-dir", "  "], "--results-dir is empty; pass a folder"),
    (["--run", " "], "run name ' ' must be a plain folder name"),
    (["--run", "my run "], "run name 'my run ' must be a plain folder name"),
    (["--model-config", ""], "--model-config is empty; give a path, or leave the flag out"),
    # issue #39's attack: an empty --model ran the default model silently
    (["--model", ""], "--model is empty; give a bundled model's name or package.module:factory"),
    (["--model", "  "], "--model is empty"),
])
def test_sweep_blank_folder_names_exit_2_before_loading(tmp_path, capsys, monkeypatch,
                                                        no_loading, args, says):
    # '' was the current folder and ' ' a folder named by a blank: both ran a whole sweep
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--family", "quant", "--bits", "8", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"variants: error: {says}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, says", [
    # issue #39's attack: --energies under the default --rank-rule params was dropped silently
    (["--energies", "0.9"],
     "--energies is read only with --rank-rule energy (this sweep has --rank-rule params)"),
    (["--rank-rule", "rank", "--ratios", "0.5"], "--ratios is read only with --rank-rule params"),
    # plain SVD reads no activations: only whitened (and scaled) need fit rows
    (["--n-fit", "0", "--n-calibration", "40"],
     "--methods whitened learns from fit-split activations, but the fit split is empty"),
])
def test_lowrank_flags_it_would_not_read_are_refused(tmp_path, capsys, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--family", "lowrank", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"variants: error: {says}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []

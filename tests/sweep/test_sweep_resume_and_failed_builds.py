"""Regressions (review of sweep/check): resume checks a variant folder's saved config, a variant
whose build fails is left out (the others are written, exit 2), VARIANTS_STREAMS and timing flags
are validated before anything is written, and `variants check` keeps the family sections."""

import json

import pytest

from variants.cli import main
from runs.io import write_json

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "1", "--timing-warmup", "0", "--cold-start", "none", "--no-progress"]


@pytest.mark.parametrize("args, message", [
    (["--timing-rounds", "0"], "timing_rounds=0 (--timing-rounds) must be >= 1"),
    (["--timing-budget-s", "0"], "timing_budget_s=0 (--timing-budget-s) must be"),
    (["--timing-budget-s", "inf"], "timing_budget_s=inf (--timing-budget-s) must be"),
    (["--timing-warmup", "-1"], "timing_warmup=-1 (--timing-warmup) must be >= 0"),
    (["--timing-rounds", "2", "--timing-min-rounds", "5"],
     "timing_min_rounds=5 (--timing-min-rounds) exceeds timing_rounds=2 (--timing-rounds)"),
    (["--timing-batch-sizes", "1", "500"],
     "--timing-batch-sizes 500 exceed the eval set (--n-eval 40)"),
])
def test_timing_flags_are_named_and_refused_before_writing(tmp_path, capsys, args, message):
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY, *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err, err
    assert not (tmp_path / "r").exists()


def test_default_min_rounds_follows_few_rounds():
    from variants.sweep.run import SweepConfig

    assert SweepConfig(timing_rounds=2).validate().timing_min_rounds == 2
    assert SweepConfig().validate().timing_min_rounds == 3
    assert SweepConfig(timing_rounds=9, timing_min_rounds=9).validate().timing_min_rounds == 9


def test_bad_variants_streams_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VARIANTS_STREAMS", "two")
    code = main(["sweep", "--results-dir", str(tmp_path / "r"), *TINY])
    assert code == 2
    assert "VARIANTS_STREAMS must be a whole number" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_validate_env():
    import os

    from variants.runtime import parallel

    old = os.environ.get("VARIANTS_STREAMS")
    try:
        os.environ["VARIANTS_STREAMS"] = "0"
        with pytest.raises(ValueError, match="VARIANTS_STREAMS must be from 1 to 64, got 0"):
            parallel.validate_env()
        os.environ["VARIANTS_STREAMS"] = "1"
        assert parallel.validate_env() == 1
    finally:
        if old is None:
            os.environ.pop("VARIANTS_STREAMS", None)
        else:
            os.environ["VARIANTS_STREAMS"] = old


def _exit_run(tmp_path):
    """(results root, sweep argv, validated SweepConfig) of a one-variant exit run ``t``."""
    from variants.sweep.run import SweepConfig

    root = tmp_path / "r"
    args = ["--family", "exit", "--exit-rules", "margin", "--exit-thresholds", "0.5001",
            "--exit-layers", "3", "--results-dir", str(root), "--run", "t", *TINY]
    cfg = SweepConfig(family="exit", params={"exit_rules": ["margin"],
                                             "exit_thresholds": [0.5001], "exit_layers": [3]},
                      n_fit=60, n_calibration=40, n_eval=40, run="t",
                      results_dir=str(root)).validate()
    return root, args, cfg


def test_resume_refuses_a_variant_folder_built_with_other_settings(tmp_path, capsys):
    """The folder name matches but build.json recorded another config: refused (exit 2) before
    anything is written, naming the variant, the field and the fix."""
    root, args, cfg = _exit_run(tmp_path)
    (vcfg,) = cfg.variants
    write_json(root / "t" / "run.json", {"identity": cfg.identity(), "status": "running"})
    from dataclasses import asdict

    saved = dict(asdict(vcfg), threshold=0.5004)  # same folder name (t0.5), other threshold
    write_json(root / "t" / vcfg.name / "build.json", {"config": saved})
    before = sorted(p.name for p in (root / "t").rglob("*"))
    assert main(["sweep", *args]) == 2
    err = capsys.readouterr().err
    assert f"variant {vcfg.name}" in err and "threshold: saved 0.5004, requested 0.5001" in err
    assert "another --run" in err and "delete" in err
    assert sorted(p.name for p in (root / "t").rglob("*")) == before


def test_resume_refuses_a_run_judged_against_another_reference(tmp_path, capsys):
    """run.json's reference_fit records another head and temperatures (another package's
    shipped state, a fit elsewhere): its variants were judged against another reference, so
    resuming is refused (exit 2, one error line naming both hashes; the fit's progress lines
    before it) before the run folder changes."""
    root, args, cfg = _exit_run(tmp_path)
    write_json(root / "t" / "run.json", {"identity": cfg.identity(), "status": "running",
                                         "reference_fit": {"source": "shipped",
                                                           "sha256": "ab" * 32}})
    before = (root / "t" / "run.json").read_text()
    assert main(["sweep", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "another reference head and temperatures (sha256 abababababababab…, shipped; now" \
        in err and ", fitted)" in err and "another --run" in err
    assert [line for line in err.splitlines() if "error" in line] == [err.splitlines()[-1]]
    assert sorted(p.name for p in (root / "t").iterdir()) == ["run.json"]
    assert (root / "t" / "run.json").read_text() == before


@pytest.mark.slow
def test_failed_variant_build_is_left_out_and_the_rest_is_written(tmp_path, capsys, monkeypatch):
    """A variant whose build raises ValueError (only detectable at build time) no longer aborts
    the sweep: the others are built, summary.csv/report.md written, the failure listed, exit 2."""
    import pandas as pd

    from variants.families.quant import build as quantize

    real_build = quantize.build

    def build(reference, cfg, *a, **k):
        if cfg.bits == 4:
            raise ValueError("planted: fires on none of the calibration examples")
        return real_build(reference, cfg, *a, **k)

    monkeypatch.setattr(quantize, "build", build)
    root = tmp_path / "r"
    args = ["sweep", "--bits", "8", "4", "--speed-mode", "simulated", "--results-dir", str(root),
            "--run", "t", *TINY]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "q4-g64: FAILED" in captured.err and "planted" in captured.err
    assert "1 variant(s) failed to build" in captured.err and "q8-g64" in captured.out
    run = root / "t"
    assert list(pd.read_csv(run / "summary.csv")["variant"]) == ["q8-g64"]
    assert not (run / "q4-g64").exists()
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "partial" and "planted" in meta["failed_variants"]["q4-g64"]
    assert meta["parallel"]["streams"] >= 1 and "blas_threads_per_call" in meta["parallel"]
    report = (run / "report.md").read_text()
    assert "Variants that failed to build" in report and "`q4-g64`: ValueError: planted" in report
    assert "(run status `partial`)" in report  # the final status, though run.json gets it last
    assert "CPU streams per encoder layer" in report

    # every variant fails: exit 2, run.json says so, no summary of nothing
    assert main([*args[:2], "4", *args[4:6], "--results-dir", str(tmp_path / "r2"), "--run", "t",
                 *TINY]) == 2
    assert "every variant failed to build" in capsys.readouterr().err
    meta = json.loads((tmp_path / "r2" / "t" / "run.json").read_text())
    assert meta["status"] == "failed" and list(meta["failed_variants"]) == ["q4-g64"]
    assert not (tmp_path / "r2" / "t" / "summary.csv").exists()


@pytest.mark.slow
@pytest.mark.plots  # the early-exit table comes with its histogram plot
def test_check_keeps_the_family_sections_of_an_exit_sweep(tmp_path, capsys):
    """`variants check` rewrote report.md without the describe() blocks and the early-exit
    table, in place and with --output-dir; a rerun with a threshold that rounds to the same
    folder name reused the other variant."""
    root = tmp_path / "r"
    args = ["sweep", "--family", "exit", "--exit-rules", "margin", "--exit-thresholds", "0.5001",
            "--exit-layers", "3", "--speed-mode", "simulated", "--results-dir", str(root),
            "--run", "t", *TINY]
    assert main(args) in (0, 1)
    run = root / "t"
    name = json.loads((run / "run.json").read_text())["config"]["variants"][0]
    sweep_report = (run / "report.md").read_text()
    describe_block = json.loads((run / "run.json").read_text())["extras"][name]
    assert describe_block.splitlines()[0] in sweep_report
    assert "Early exit on the eval split" in sweep_report
    capsys.readouterr()

    for extra in ([], ["--output-dir", str(tmp_path / "out")]):
        assert main(["check", str(run), "--n-bootstrap", "20", *extra]) == 0
        out = tmp_path / "out" if extra else run
        report = (out / "report.md").read_text()
        assert describe_block.splitlines()[0] in report, extra
        assert "Early exit on the eval split" in report, extra
        for link in (line[line.index("](") + 2:-1] for line in report.splitlines()
                     if line.startswith("![")):
            assert (out / link).is_file(), link

    # a folder of the same name built with another threshold (names used to round 0.5004 to
    # t0.5): refused with the fix, not reused
    build = json.loads((run / name / "build.json").read_text())
    build["config"]["threshold"] = 0.5004
    write_json(run / name / "build.json", build)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "reusing them" not in err and "threshold: saved 0.5004, requested 0.5001" in err

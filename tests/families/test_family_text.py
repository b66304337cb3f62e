"""What a family says about a variant: the sweep writes ``<variant>/family.md`` at build time,
``variants check`` reads it back without importing a builder."""

import json
from pathlib import Path

import pytest

from runs.family_text import family_extras, write_family_text
from runs.folder import RunFolder
from runs.readers import CorruptFileError

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _variant(tmp_path, build, timing=None):
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "build.json").write_text(json.dumps(build))
    (tmp_path / "v" / "timing.json").write_text(json.dumps(timing or {}))
    return tmp_path


def test_written_from_describe_and_read_back(tmp_path):
    run = _variant(tmp_path, {"threshold": 0.5}, {"batches": {}})
    seen = []

    def describe(build, timing):
        seen.append((build, timing))
        return f"- threshold {build['threshold']}\n"

    assert write_family_text(run, "v", "exit", describe) == "- threshold 0.5\n"
    assert seen == [({"threshold": 0.5}, {"batches": {}})]
    assert (run / "v" / "family.md").read_text() == "- threshold 0.5\n"
    assert RunFolder(run).family_texts(["v", "other"]) == {"v": "- threshold 0.5\n"}
    assert family_extras(run, "exit", ["v"]) == {"v": "- threshold 0.5\n"}  # read, no family


def test_family_md_first_then_run_json_extras(tmp_path):
    run = _variant(tmp_path, {})
    (run / "w").mkdir()
    (run / "run.json").write_text(json.dumps({"extras": {"v": "old v", "w": "old w"}}))
    (run / "v" / "family.md").write_text("new v")
    assert RunFolder(run).family_texts(["v", "w", "x"]) == {"v": "new v", "w": "old w"}


def test_a_family_without_describe_writes_nothing(tmp_path):
    run = _variant(tmp_path, {})
    assert family_extras(run, "quant", ["v"], family=object()) == {}
    assert not (run / "v" / "family.md").exists()


def test_a_describe_returning_none_writes_nothing(tmp_path):
    """The family interface's default ``describe`` (quant) returns None: no family.md, no
    block (the sweep used to write ``None`` and die with TypeError)."""
    run = _variant(tmp_path, {"bits": 8})
    family = type("F", (), {"describe": staticmethod(lambda build, timing: None)})()
    assert write_family_text(run, "v", "quant", family.describe) is None
    assert family_extras(run, "quant", ["v"], family=family) == {}
    assert not (run / "v" / "family.md").exists() and list((run / "v").glob(".*.tmp")) == []


def test_describe_missing_a_field_names_the_build_file(tmp_path):
    run = _variant(tmp_path, {})
    with pytest.raises(CorruptFileError, match="prune field missing or of the wrong type: "
                                               "KeyError 'schedule'") as e:
        write_family_text(run, "v", "prune", lambda b, t: b["schedule"])
    assert e.value.path == run / "v" / "build.json"
    assert not (run / "v" / "family.md").exists()


@pytest.mark.parametrize("name", ["sweep_small_lowrank", "sweep_small_prune", "sweep_small_exit"])
def test_fixture_blocks_equal_the_saved_extras(name):
    """The fixtures' family.md (added once, tests/fixtures/README.md) are the blocks the sweep
    saved in run.json: check's report.md is the same from either."""
    run = RunFolder(FIXTURES / name)
    names = run.variants()
    assert len(names) >= 6
    assert {n: run.family_text(n) for n in names} == {n: run.meta["extras"][n] for n in names}


@pytest.mark.slow
def test_a_sweep_writes_family_md(tmp_path, capsys):
    """A tiny prune sweep: every variant folder gets family.md, equal to the family's describe of
    its build.json/timing.json and to run.json's extras, and report.md carries it."""
    from variants.families import get_family
    from variants.cli import main

    code = main(["sweep", "--family", "prune", "--prune-layers", "2", "--keep-ratios", "0.5",
                 "--n-fit", "20", "--n-calibration", "20", "--n-eval", "20",
                 "--timing-batch-sizes", "1", "--timing-rounds", "1", "--timing-warmup", "0",
                 "--timing-budget-s", "1", "--cold-start", "none", "--speed-mode", "simulated",
                 "--no-progress", "--results-dir", str(tmp_path), "--run", "t"])
    assert code == 0, capsys.readouterr().err[-2000:]
    run = RunFolder(tmp_path / "t")
    names = run.variants()
    assert names
    describe = get_family("prune").describe
    report = (tmp_path / "t" / "report.md").read_text()
    for n in names:
        text = run.family_text(n)
        assert text == describe(run.json(n, "build.json"), run.json(n, "timing.json"))
        assert text == run.meta["extras"][n] and text.startswith("- pruning: after layer 2 keep")
        assert text in report

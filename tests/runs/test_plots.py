"""Plots of a sweep folder, on the saved small sweeps in tests/fixtures/."""

import argparse
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from runs.commands.plot import configure_parser
from runs.plots.data import PlotError, SkipPlot, load_run
from runs.plots.family import FAMILY_PLOTS
from runs.plots.markdown import plots_markdown
from runs.plots.render import plot_run

FIXTURES = Path(__file__).parents[1] / "fixtures"
RUNS = ("sweep_small", "sweep_small_choice")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.plots  # the real plot_run everywhere here (conftest stubs it elsewhere)


@pytest.fixture
def run_copy(tmp_path):
    def copy(name="sweep_small"):
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst)
        return dst
    return copy


def _keep_only(run_dir, keep):
    s = pd.read_csv(run_dir / "summary.csv")
    for name in s["variant"]:
        if name not in keep:
            shutil.rmtree(run_dir / name)
    s[s["variant"].isin(keep)].to_csv(run_dir / "summary.csv", index=False)


@pytest.mark.parametrize("name", RUNS)
def test_plot_run_writes_every_plot(run_copy, name, request):
    if name == "sweep_small":  # drawn once per session (conftest), shared with other tests
        run_dir, paths = request.getfixturevalue("plotted_sweep_small")
    else:
        run_dir = run_copy(name)
        paths = plot_run(run_dir)
    stems = [p.stem for p in paths]
    assert stems == ["pareto_b1", "reliability", "margin_drift", "flip_strata", "family_quant"]
    for p in paths:
        assert p.parent == run_dir / "plots"
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, p
    assert not list((run_dir / "plots").glob("*.tmp")), "temp files left behind"


def test_plot_run_does_not_import_mlx():
    code = ("import sys; from runs.plots.render import plot_run; "
            "assert not any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules), 'mlx imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_single_variant_folder_says_so(run_copy, caplog):
    run_dir = run_copy()
    _keep_only(run_dir, ["q4-g64"])
    with caplog.at_level(logging.INFO, logger="runs.plots"):
        paths = plot_run(run_dir, dpi=40)
    assert len(paths) == 5 and all(p.stat().st_size > 0 for p in paths)
    assert "single variant (q4-g64)" in caplog.text


@pytest.mark.parametrize("setup, match", [
    ("missing", "does not exist"),
    ("empty", "has no summary.csv, so it is not a finished sweep; run `variants sweep` first"),
    ("parent", "holds the runs sweep_small: pass one of them"),
    ("no_variant", "lists no variant"),
    ("header_only", "lists no variant"),
])
def test_unplottable_folder_raises_clear_error(tmp_path, run_copy, setup, match):
    if setup == "missing":
        target = tmp_path / "nope"
    elif setup == "empty":
        target = tmp_path / "empty"
        target.mkdir()
    elif setup == "parent":
        run_copy()
        target = tmp_path
    else:
        target = run_copy()
        if setup == "no_variant":
            (target / "summary.csv").write_text("")
        else:
            _keep_only(target, [])
    with pytest.raises(PlotError, match=match):
        plot_run(target)


def test_cli_plot_verb(run_copy, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="variants")
    configure_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plot", str(tmp_path / "missing")])
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("variants: error: results folder")
    run_dir = run_copy()
    args = parser.parse_args(["plot", str(run_dir), "--dpi", "40"])
    assert args.func(args) == 0
    out = capsys.readouterr().out.split()
    assert len(out) == 5 and all(Path(p).is_file() for p in out)


def test_family_plot_skips_when_columns_absent(run_copy, caplog):
    """A family whose build/summary lacks the plot's columns is skipped with a logged note."""
    run_dir = run_copy()
    s = pd.read_csv(run_dir / "summary.csv")
    s["family"] = "prune"  # no keep_ratio column
    s.to_csv(run_dir / "summary.csv", index=False)
    with pytest.raises(SkipPlot, match="no keep_ratio"):
        FAMILY_PLOTS["prune"](load_run(run_dir), "prune")
    with caplog.at_level(logging.INFO, logger="runs.plots"):
        stems = [p.stem for p in plot_run(run_dir, dpi=40)]
    assert "family_prune" not in stems and "pareto_b1" in stems
    assert "skipped family_prune.png" in caplog.text


def test_plots_markdown_links_relative(plotted_sweep_small):
    run_dir, paths = plotted_sweep_small
    assert len(paths) == 5
    md = plots_markdown(paths, run_dir)
    assert md.startswith("====== Plots ======")
    for p in paths:
        assert f"(plots/{p.name})" in md
    assert plots_markdown([], run_dir) == ""


def test_fixture_is_a_complete_small_sweep():
    for name in RUNS:
        meta = json.loads((FIXTURES / name / "run.json").read_text())
        s = pd.read_csv(FIXTURES / name / "summary.csv")
        assert meta["config"]["variants"] == s["variant"].tolist()
        assert sum(f.stat().st_size for f in (FIXTURES / name).rglob("*") if f.is_file()) < 1e6


#: The per-example columns the plots read from an evaluation (margin vs drift, flip strata).
PLOTTED_COLUMNS = ["ref_margin", "max_abs_logit_diff", "flip", "negative_flip", "positive_flip",
                   "label", "n_options"]


@pytest.mark.parametrize("name", ["sweep_small_choice", "sweep_small_exit"])
def test_the_judges_evaluations_draw_the_same_plots(name):
    """plot_run(evaluations=...) (the sweep hands the judge's over) plots the same numbers as
    the plots' own evaluate() from metrics.json's ε and run.json's near-tie margin."""
    from contracts.checker import load_contract
    from runs.folder import RunFolder
    from runs.judge import judge_variant

    folder = RunFolder(FIXTURES / name)
    contract = load_contract(None)
    handed = {n: judge_variant(folder, n, contract, write=False)[1] for n in folder.variants()}
    own, given = load_run(FIXTURES / name), load_run(folder, evaluations=handed)
    assert given.evaluation(own.variants[0]) is handed[own.variants[0]]
    for n in own.variants:
        assert given.evaluation(n).epsilon == own.evaluation(n).epsilon
        pd.testing.assert_frame_equal(given.evaluation(n).per_example[PLOTTED_COLUMNS],
                                      own.evaluation(n).per_example[PLOTTED_COLUMNS])
    pd.testing.assert_frame_equal(given.per_example(), own.per_example()[given.per_example().columns])


def test_family_captions_are_the_plot_docstrings():
    """report.md's family-plot captions (kept in a table so the report needs no matplotlib) are
    the first docstring line of each family plot."""
    from runs.plots.markdown import FAMILY_CAPTIONS

    assert set(FAMILY_CAPTIONS) == set(FAMILY_PLOTS)
    for family, fn in FAMILY_PLOTS.items():
        assert FAMILY_CAPTIONS[family] == fn.__doc__.strip().splitlines()[0].rstrip(".")


def test_report_section_imports_no_matplotlib():
    code = ("import sys\nfrom runs.plots.markdown import report_tail\n"
            f"t = report_tail({str(FIXTURES / 'sweep_small_exit')!r}, "
            f"{str(FIXTURES / 'sweep_small_exit')!r})\n"
            "print('matplotlib' in sys.modules, 'Early exit on the eval split' in t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[2])
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]

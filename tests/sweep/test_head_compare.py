"""A regression and a multi-label run beyond the main table: ``variants compare`` of two runs
shows the head's own figures side by side (recomputed here from outputs.npz with NumPy and
scipy.stats.spearmanr), an exact McNemar test on the rows whose label set changed (multi-label,
counted by hand) or a line saying why there is none (regression), never a top-option McNemar;
a multi-label run against a regression run is refused in one line. summary.csv, report.json
and the plots of such a run carry no softmax figure; the model card says nothing was fitted."""

import json
from math import comb

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from runs.compare import compare_pair, pairs
from tests.sweep.test_head_sweeps import _logits, _sweep
from variants.cli import main


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    run = _sweep(tmp_path_factory.mktemp("reg"), 1, "regression", "8", "--bits", "8", "2")
    return run, run


@pytest.fixture(scope="module")
def multi_label(tmp_path_factory):
    run = _sweep(tmp_path_factory.mktemp("ml"), 4, "multi_label_classification", "8",
                 "--bits", "8", "2")
    return run, run


def _changed(run, name):
    """(N,) bool: rows whose set of labels (logit >= 0, i.e. sigmoid >= 0.5) changed."""
    return ((_logits(run, "reference") >= 0) != (_logits(run, name) >= 0)).any(axis=1)


def test_multi_label_compare_tests_the_rows_whose_label_set_changed(multi_label, capsys):
    a_run, b_run = multi_label
    (a, b), = pairs(f"{a_run}:q8-g64", f"{b_run}:q2-g64")
    r = compare_pair(a, b, n_boot=50)
    ca, cb = _changed(a_run, "q8-g64"), _changed(b_run, "q2-g64")
    a_only, b_only = int((ca & ~cb).sum()), int((~ca & cb).sum())
    assert b_only >= 5  # 2 bits changes label sets: the test has something to find
    d = a_only + b_only
    p = 2 * sum(comb(d, k) for k in range(min(a_only, b_only) + 1)) / 2 ** d
    m = r["mcnemar_label_set"]
    assert (m["a_only"], m["b_only"], m["both"], m["neither"]) == (
        a_only, b_only, int((ca & cb).sum()), int((~ca & ~cb).sum()))
    assert m["p_value"] == pytest.approx(min(p, 1.0), rel=1e-9)
    assert r["mcnemar_correct"] is None and r["mcnemar_flips"] is None
    assert r["head_figures"]["b"]["label_set_change_rate"] == pytest.approx(cb.mean())
    assert r["head_figures"]["a"]["label_flips"] == (
        (_logits(a_run, "reference") >= 0) != (_logits(a_run, "q8-g64") >= 0)).sum()

    assert main(["compare", f"{a_run}:q8-g64", f"{b_run}:q2-g64", "--n-bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert (f"exact McNemar, label set changed against the reference (sigmoid >= 0.5 per "
            f"label): A only {a_only}, B only {b_only}") in out
    assert f"| label_set_change_rate | {ca.mean():.4g} | {cb.mean():.4g} |" in out
    assert "right (labelled rows)" not in out and "flipped against the reference:" not in out


def test_regression_compare_shows_values_side_by_side_and_no_mcnemar(regression, capsys):
    a_run, b_run = regression
    assert main(["compare", f"{a_run}:q8-g64", f"{b_run}:q2-g64", "--n-bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "McNemar" in out and "exact McNemar" not in out
    assert "- no McNemar test: a regression head makes no yes/no decision per row" in out
    rho = [spearmanr(_logits(run, "reference")[:, 0], _logits(run, n)[:, 0]).statistic
           for run, n in ((a_run, "q8-g64"), (b_run, "q2-g64"))]
    assert rho[1] < rho[0] - 0.05  # 2 bits reorders the values
    assert f"| value_spearman | {rho[0]:.4g} | {rho[1]:.4g} | {rho[1] - rho[0]:+.4g} |" in out
    err = [np.abs(_logits(run, n)[:, 0] - _logits(run, "reference")[:, 0]).max()
           for run, n in ((a_run, "q8-g64"), (b_run, "q2-g64"))]
    assert f"| value_abs_error_max | {err[0]:.4g} | {err[1]:.4g} |" in out


def test_compare_refuses_a_multi_label_run_against_a_regression_run(regression, multi_label,
                                                                    capsys):
    rc = main(["compare", f"{multi_label[0]}:q8-g64", f"{regression[0]}:q8-g64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "different outputs: A's model outputs multi_label, B's regression" in err[0]


@pytest.mark.parametrize("which", ["regression", "multi_label"])
def test_no_softmax_figure_in_summary_report_json_or_plots(which, request):
    run = request.getfixturevalue(which)[1]
    summary = pd.read_csv(run / "summary.csv")
    for col in ("agreement", "flip_rate", "certified_share", "kl_mean", "accuracy_ref",
                "accuracy_variant", "ece_variant", "negative_flips"):
        assert col in summary.columns and summary[col].isna().all(), col  # kept, empty
    r, v = _logits(run, "reference"), _logits(run, "q2-g64")
    row = summary.set_index("variant").loc["q2-g64"]
    assert row["max_abs_logit_diff_max"] == pytest.approx(np.abs(v - r).max())  # raw: kept
    rep = json.loads((run / "q2-g64" / "report.json").read_text())
    assert rep["outputs"] == which
    assert set(rep["not_applicable"]) == {"bounds", "calibration", "temperatures",
                                          "reliability_variant", "drift", "flips"}
    assert all(rep[k] is None for k in rep["not_applicable"])
    assert rep["summary"]["agreement"] is None and "agreement" in rep["summary"]["not_applicable"]
    plots = sorted(p.stem for p in (run / "plots").glob("*.png"))
    md = (run / "report.md").read_text()
    if plots:  # the test suite may stub plotting; when drawn, only the head's own
        assert plots == ["family_quant", "pareto_b1"]
    for stem in ("reliability", "margin_drift", "flip_strata"):
        assert f"plots/{stem}.png" not in md


def test_model_card_says_nothing_was_fitted_for_the_checkpoints_own_head(regression, tmp_path):
    out = tmp_path / "exp"
    assert main(["export", str(regression[0]), "--variant", "q8-g64", "--out", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert ("Judged against the reference with the checkpoint's own head: nothing is fitted "
            "for a head that outputs one output value per row (regression)") in card
    assert "fitted on the run's fit and calibration splits" not in card


def test_softmax_only_plots_are_neither_drawn_nor_linked(multi_label, tmp_path):
    from runs.plots.data import load_run
    from runs.plots.markdown import plots_markdown
    from runs.plots.render import figures

    run = multi_label[0]
    assert [stem for stem, _ in figures(load_run(run))] == ["pareto_b1", "family_quant"]
    (run / "plots").mkdir(exist_ok=True)
    stale = [run / "plots" / f"{s}.png" for s in ("pareto_b1", "reliability", "flip_strata",
                                                 "family_quant")]
    md = plots_markdown(stale, run)  # e.g. files an older write of the folder left
    assert "plots/pareto_b1.png" in md and "plots/reliability.png" not in md
    assert "plots/flip_strata.png" not in md
    assert "vs share of rows whose label set changed (y)" in md and "vs agreement" not in md

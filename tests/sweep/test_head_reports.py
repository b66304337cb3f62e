"""What a regression or multi-label run shows: the main table (what ``variants sweep`` prints),
report.md, the variant's report.md, the HTML report and the export's model card carry the
figures of the head's own outputs, recomputed here from the saved raw logits (NumPy,
scipy.stats.spearmanr), and no softmax figure; and every softmax objective (early exit,
student, DWQ, the search and its sensitivity) is refused in one line, exit 2, nothing written.
"""

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from runs.report import format_table
from tests.models.head_fixtures import make_head_folder, model_toml, rows_jsonl
from tests.sweep.test_head_sweeps import ARGS, _logits, _sweep
from variants.cli import main

SOFTMAX_HEADERS = ("agree", "certified", "cert. flips", "max Δscore", "max Δaction")


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("reg"), 1, "regression", "8")


@pytest.fixture(scope="module")
def multi_label(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("ml"), 4, "multi_label_classification", "4")


def _regression_figures(run, name):
    r, v = _logits(run, "reference")[:, 0], _logits(run, name)[:, 0]
    err = np.abs(v - r)
    rel = err / r.std()
    return {"value_abs_error_mean": err.mean(), "value_abs_error_max": err.max(),
            "value_rel_error_mean": rel.mean(), "value_rel_error_max": rel.max(),
            "value_spread": r.std(), "within_tolerance": np.mean(rel <= 0.05),
            "value_spearman": spearmanr(r, v).statistic}


def _label_figures(run, name):
    zr, zv = _logits(run, "reference"), _logits(run, name)
    pr, pv = 1 / (1 + np.exp(-zr)), 1 / (1 + np.exp(-zv))
    yr, yv = zr >= 0, zv >= 0
    drift = np.abs(pv - pr)
    return {"label_flips": (yr != yv).sum(), "label_set_changes": (yr != yv).any(axis=1).sum(),
            "label_set_change_rate": (yr != yv).any(axis=1).mean(),
            "label_flip_rate_max": (yr != yv).mean(axis=0).max(),
            "label_prob_drift_max": drift.max(axis=1).max(),
            "label_prob_drift_p95": np.percentile(drift.max(axis=1), 95),
            "label_prob_drift_mean": drift.mean(),
            "label_brier_delta": ((pv - yr) ** 2 - (pr - yr) ** 2).mean(axis=0).max()}


def _check_summary(run, name, want):
    summary = pd.read_csv(run / "summary.csv")
    row = summary.set_index("variant").loc[name]
    metrics = json.loads((run / name / "metrics.json").read_text())
    for k, x in want.items():
        assert row[k] == pytest.approx(x, rel=1e-6, abs=1e-12), k
        assert metrics[k] == pytest.approx(x, rel=1e-6, abs=1e-12), k
    return summary


def test_regression_run_shows_the_value_figures(regression):
    want = _regression_figures(regression, "q8-g64")
    assert 0 < want["value_abs_error_max"] and want["value_spearman"] < 1  # not degenerate
    summary = _check_summary(regression, "q8-g64", want)
    assert summary["outputs"].tolist() == ["regression"]
    table = format_table(summary)  # what `variants sweep` prints
    assert list(table.columns[:8]) == ["variant", "bits/w", "model MB", "max abs Δvalue",
                                       "max rel. error", "mean rel. error", "within tol.",
                                       "Spearman ρ"]
    assert not set(SOFTMAX_HEADERS) & set(table.columns)
    assert not any(c.startswith("ECE") for c in table.columns)
    cells = table.iloc[0]
    assert cells["max abs Δvalue"] == f"{want['value_abs_error_max']:.4g}"
    assert cells["max rel. error"] == f"{want['value_rel_error_max']:.4f}"
    assert cells["within tol."] == f"{want['within_tolerance']:.3f}"
    assert cells["Spearman ρ"] == f"{want['value_spearman']:.4f}"

    md = (regression / "report.md").read_text()
    assert f"max {want['value_abs_error_max']:.4g} (output units)" in md
    assert f"s = {want['value_spread']:.4g}: mean {want['value_rel_error_mean']:.4f}" in md
    assert f"Spearman ρ {want['value_spearman']:.4f}" in md
    assert "do not apply" in md
    for softmax in ("certified = eval examples", "temperatures per option count", "agreement 1",
                    "| agree"):
        assert softmax not in md, softmax
    own = (regression / "q8-g64" / "report.md").read_text()
    assert "====== What the head outputs ======" in own
    assert "Margin certificate" not in own and "Calibration" not in own


def test_multi_label_run_shows_the_label_figures(multi_label):
    want = _label_figures(multi_label, "q4-g64")
    assert want["label_prob_drift_max"] > 0
    summary = _check_summary(multi_label, "q4-g64", want)
    assert summary["outputs"].tolist() == ["multi_label"]
    table = format_table(summary)
    assert list(table.columns[3:9]) == ["label flips", "rows changed", "label flip rate max",
                                        "max abs Δprob", "Brier Δ", "ECE Δ"]
    assert not set(SOFTMAX_HEADERS) & set(table.columns)
    cells = table.iloc[0]
    assert cells["label flips"] == f"{want['label_flips']:.0f}"
    assert cells["max abs Δprob"] == f"{want['label_prob_drift_max']:.4f}"
    assert cells["Brier Δ"] == f"{want['label_brier_delta']:+.4f}"
    md = (multi_label / "report.md").read_text()
    assert (f"|Δprob| per row max {want['label_prob_drift_max']:.4f} / p95 "
            f"{want['label_prob_drift_p95']:.4f}, mean {want['label_prob_drift_mean']:.4f}") in md
    assert "certified = eval examples" not in md and "| agree" not in md
    own = (multi_label / "q4-g64" / "report.md").read_text()
    assert "Flips by stratum" not in own and "Reliability diagram" not in own
    if "Worst examples" in own:  # a failing clause's rows: labels decided yes, not top-2 probs
        assert "ref_labels" in own and "ref_top2" not in own


@pytest.mark.parametrize("which", ["regression", "multi_label"])
def test_html_report_shows_the_head_figures_and_no_softmax_section(which, request, tmp_path):
    from runs.html.render import write_html_report  # the sweep's is stubbed in tests (conftest)

    run = request.getfixturevalue(which)
    name = "q8-g64" if which == "regression" else "q4-g64"
    want = (_regression_figures if which == "regression" else _label_figures)(run, name)
    write_html_report(run, out_dir=tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["outputs"] == which
    (v,) = data["variants"]
    for k, x in want.items():
        if k in v["summary"]:
            assert v["summary"][k] == pytest.approx(x, rel=1e-6, abs=1e-12), k
    assert "agreement" not in v["summary"] and "certified_share" not in v["summary"]
    assert v["reliability"] is None and v["flipped"] == [] and v["near_tie"] == []
    html = (tmp_path / "report.html").read_text()
    assert html.count('class="note not-applicable"') == 3  # reliability, near ties, flips
    assert 'data-chart="reliability-' not in html and 'class="note head-figures"' in html
    label = "Spearman ρ of values" if which == "regression" else "worst per-label Brier Δ"
    assert label in html and "agreement ↑" not in html  # the Pareto panels


def test_model_card_of_a_regression_export(regression, tmp_path):
    out = tmp_path / "exp"
    assert main(["export", str(regression), "--variant", "q8-g64", "--out", str(out)]) == 0
    card = (out / "README.md").read_text()
    want = _regression_figures(regression, "q8-g64")
    assert f"| rel-error-max | {want['value_rel_error_max']:.4g} | <= 0.25 |" in card
    assert f"| rank-correlation | {want['value_spearman']:.4g} | >= 0.99 |" in card
    assert "do not apply" in card and "no temperature" in card
    assert "calibration of temperatures" not in card


@pytest.fixture(scope="module")
def regression_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refuse")
    ck = make_head_folder(tmp / "ck", 1, "regression")
    rows = rows_jsonl(tmp / "rows.jsonl", n=170,
                      splits={"fit": 100, "calibration": 30, "eval": 40})
    return model_toml(tmp / "m.toml", ck), rows


@pytest.mark.parametrize("command, said", [
    (["sweep", "--family", "exit"], "--family exit stops on the softmax confidence"),
    (["sweep", "--family", "student"], "--family student distils by KL"),
    (["sweep", "--family", "quant", "--bits", "4", "--quant-method", "dwq"],
     "--quant-method dwq trains the quantization scales on KL"),
    (["search", "--n-search", "60", "--n-fit", "40"], "variants search orders layers"),
    (["sensitivity", "--n-search", "60", "--n-fit", "40"], "per-layer sensitivity measures"),
])
def test_softmax_objectives_are_refused_on_a_regression_head(command, said, regression_inputs,
                                                             tmp_path, capsys):
    toml, rows = regression_inputs
    results = tmp_path / "results"
    extra = ARGS if command[0] == "sweep" else ["--no-progress"]
    rc = main([*command, "--model-config", str(toml), "--data", str(rows), "--results-dir",
               str(results), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert said in err[0]
    assert "but model 'head' outputs one output value per row (regression)" in err[0]
    assert "--family quant" in err[0] or "--quant-method rtn, gptq or awq" in err[0]
    assert not results.exists()

"""End to end: a BERT regression head and a multi-label head (tests/models/head_fixtures.py: the
committed parity folder with config.json's problem_type / num_labels edited and a re-initialised
classifier) swept with their own head on plain rows. The verdict's clauses are the packaged
regression / multi-label ones, and every value is recomputed here from the saved raw logits
(NumPy, scipy.stats.spearmanr): no softmax anywhere."""

import json

import numpy as np
import pytest
from scipy.stats import spearmanr

from tests.models.head_fixtures import make_head_folder, model_toml, rows_jsonl
from variants.cli import main

ARGS = ["--timing-rounds", "1", "--timing-warmup", "0", "--timing-budget-s", "0.5",
        "--cold-start", "none", "--timing-batch-sizes", "1", "--no-progress"]
SPLITS = {"fit": 10, "calibration": 30, "eval": 40}


def _sweep(tmp, n_labels, problem_type, bits, *extra):
    ck = make_head_folder(tmp / "ck", n_labels, problem_type)
    toml = model_toml(tmp / "m.toml", ck, name="head")
    rows = rows_jsonl(tmp / "rows.jsonl", n=80, splits=SPLITS)
    results = tmp / "results"
    rc = main(["sweep", "--model-config", str(toml), "--data", str(rows), "--results-dir",
               str(results), "--bits", bits, *ARGS, *extra])
    assert rc in (0, 1)
    (run,) = [p for p in results.iterdir() if (p / "run.json").is_file()]
    return run


def _logits(run, who):
    with np.load(run / who / "outputs.npz") as f:
        return f["logits"].astype(np.float64)


def _clauses(path):
    verdict = json.loads(path.read_text())
    return verdict, {c["id"]: c for c in verdict["clauses"]}


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("reg"), 1, "regression", "8")


@pytest.fixture(scope="module")
def multi_label(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("ml"), 4, "multi_label_classification", "4")


def test_regression_head_is_judged_on_its_output_value(regression):
    verdict, c = _clauses(regression / "q8-g64" / "verdict.json")
    assert verdict["contract"] == "regression"
    assert list(c) == ["within-tolerance", "rel-error-max", "rel-error-mean", "rank-correlation",
                       "finite-outputs"]
    r, v = _logits(regression, "reference")[:, 0], _logits(regression, "q8-g64")[:, 0]
    assert r.shape == (SPLITS["eval"],) and r.std() > 0
    rel = np.abs(v - r) / r.std()
    assert c["within-tolerance"]["value"] == pytest.approx(np.mean(rel <= 0.05))
    assert c["rel-error-max"]["value"] == pytest.approx(rel.max(), rel=1e-6)
    assert c["rel-error-mean"]["value"] == pytest.approx(rel.mean(), rel=1e-6)
    assert c["rank-correlation"]["value"] == pytest.approx(spearmanr(r, v).statistic, abs=1e-9)
    assert all(x["n"] == SPLITS["eval"] for k, x in c.items() if k != "finite-outputs")
    for x in c.values():  # each status follows its value and bound
        ok = x["value"] >= x["threshold"] if x["op"] == ">=" else x["value"] <= x["threshold"]
        assert x["status"] == ("pass" if ok else "FAIL"), x
    meta = json.loads((regression / "run.json").read_text())
    assert meta["model"]["outputs"] == "regression" and meta["config"]["contract"] == "regression"
    assert meta["temperatures"] == {"1": 1.0}  # no temperature is fitted to a value


def test_check_rejudges_a_regression_run_with_its_contract(regression, tmp_path, capsys):
    assert main(["check", str(regression), "--output-dir", str(tmp_path / "a")]) == 0
    assert (json.loads((tmp_path / "a" / "q8-g64" / "verdict.json").read_text())
            == json.loads((regression / "q8-g64" / "verdict.json").read_text()))
    capsys.readouterr()
    assert main(["check", str(regression), "--contract", "default", "--output-dir",
                 str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "clause 'agreement' measures 'agreement', a metric of a softmax" \
        in err[0] and "--contract regression" in err[0]


def test_a_softmax_contract_on_a_regression_head_is_refused_before_anything_is_written(
        tmp_path, capsys):
    ck = make_head_folder(tmp_path / "ck", 1, None)  # no problem_type, one logit: regression
    results = tmp_path / "results"
    rc = main(["sweep", "--model-config", str(model_toml(tmp_path / "m.toml", ck)), "--data",
               str(rows_jsonl(tmp_path / "rows.jsonl", n=80, splits=SPLITS)), "--results-dir",
               str(results), "--bits", "8", "--contract", "strict", *ARGS])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"{ck}/config.json outputs one output value (regression)" in err[0]
    assert not results.exists()


def test_multi_label_head_is_judged_per_label_through_sigmoids(multi_label):
    verdict, c = _clauses(multi_label / "q4-g64" / "verdict.json")
    assert verdict["contract"] == "multi_label"
    assert list(c) == ["label-set-changes", "label-flips-max", "label-prob-drift-p95",
                       "label-prob-drift-mean", "label-brier-delta", "finite-outputs"]
    zr, zv = _logits(multi_label, "reference"), _logits(multi_label, "q4-g64")
    assert zr.shape == (SPLITS["eval"], 4)
    assert 0 < (zr >= 0).mean() < 1  # both decisions occur: the threshold is exercised
    yr, yv = zr >= 0, zv >= 0
    pr, pv = 1 / (1 + np.exp(-zr)), 1 / (1 + np.exp(-zv))
    assert c["label-set-changes"]["value"] == pytest.approx((yr != yv).any(axis=1).mean())
    assert c["label-flips-max"]["value"] == pytest.approx((yr != yv).mean(axis=0).max())
    drift = np.abs(pv - pr)
    assert c["label-prob-drift-p95"]["value"] == pytest.approx(
        np.percentile(drift.max(axis=1), 95), rel=1e-6)
    assert c["label-prob-drift-mean"]["value"] == pytest.approx(drift.mean(), rel=1e-6)
    brier = ((pv - yr) ** 2 - (pr - yr) ** 2).mean(axis=0)
    assert c["label-brier-delta"]["value"] == pytest.approx(brier.max(), rel=1e-6, abs=1e-12)
    meta = json.loads((multi_label / "run.json").read_text())
    assert meta["model"]["outputs"] == "multi_label" and meta["temperatures"] == {"4": 1.0}

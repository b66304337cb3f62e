"""Issue #39: a variant that answers rows with NaN or inf is a FAIL (``finite-outputs``) with a
report and a complete run; a reference that does is refused in one line with run.json
"incomplete". The model: tests/sweep/nonfinite_model.py (a factory whose variants overflow on
the rows whose first token has an even id)."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from contracts.checker import load_contract
from metrics.finite import finite_part, nonfinite_rows
from runs.judge import judge_outputs
from runs.outputs import DecisionOutputs
from runs.selftest import synthetic_outputs
from variants.cli import main
from variants.sweep.timed_check import compare

ARGS = ["sweep", "--model", "tests.sweep.nonfinite_model:build", "--bits", "8", "--run", "x",
        "--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "1", "--timing-warmup", "1", "--cold-start", "none", "--no-progress"]


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite") / "r"
    code = main([*ARGS, "--results-dir", str(root)])
    return root, code


def _bad_ids(path):
    """Ids of the rows of an outputs file with a NaN logit on a valid option (numpy alone)."""
    with np.load(path) as z:
        bad = np.isnan(np.where(z["option_mask"], z["logits"], 0.0)).any(axis=1)
        return z["ids"][bad].astype(str).tolist()


@pytest.mark.slow
@pytest.mark.html  # the fixture's sweep writes the real report.html (the first test to use it)
def test_a_variant_with_nan_rows_fails_finite_outputs_and_the_run_completes(nan_run):
    root, code = nan_run
    run = root / "x"
    assert code == 0  # a completed sweep exits 0 whatever its verdicts
    assert json.loads((run / "run.json").read_text())["status"] == "complete"
    bad_eval, bad_cal = _bad_ids(run / "q8-g64" / "outputs.npz"), \
        _bad_ids(run / "q8-g64" / "calibration_outputs.npz")
    assert 0 < len(bad_eval) < 40 and 0 < len(bad_cal) < 40
    verdict = json.loads((run / "q8-g64" / "verdict.json").read_text())
    assert verdict["outcome"] == "fail" and "finite-outputs" in verdict["failed"]
    clause = next(c for c in verdict["clauses"] if c["id"] == "finite-outputs")
    assert clause["value"] == len(bad_eval) + len(bad_cal) and clause["n"] == 80
    assert clause["status"].startswith(f"FAIL: NaN or inf outputs on {len(bad_eval)} eval rows "
                                       f"(ids {', '.join(sorted(bad_eval)[:1])}")
    metrics = json.loads((run / "q8-g64" / "metrics.json").read_text())
    assert metrics["nonfinite_rows"] == len(bad_eval) + len(bad_cal)
    assert sorted(metrics["nonfinite_eval_ids"]) == sorted(bad_eval)
    assert sorted(metrics["nonfinite_calibration_ids"]) == sorted(bad_cal)
    # every other clause is judged on the finite rows; ε is inf (a calibration row is unbounded)
    agreement = next(c for c in verdict["clauses"] if c["id"] == "agreement")
    assert agreement["n"] <= 40 - len(bad_eval) and metrics["n_examples"] == 40 - len(bad_eval)
    assert metrics["epsilon"] is None or metrics["epsilon"] == float("inf")
    summary = pd.read_csv(run / "summary.csv")
    assert summary.loc[0, "verdict"] == "FAIL"
    assert summary.loc[0, "nonfinite_rows"] == len(bad_eval) + len(bad_cal)
    report = (run / "q8-g64" / "report.md").read_text()
    assert "finite-outputs" in report and sorted(bad_eval)[0] in report
    # reports written from the final state: none says "running" (run.json is written last)
    assert json.loads((run / "report.json").read_text())["status"] == "complete"
    assert '"status":"complete"' in (run / "report.html").read_text()


@pytest.mark.slow
def test_check_rejudges_the_saved_nan_rows_to_the_same_verdict(nan_run, tmp_path):
    root, _ = nan_run
    out = tmp_path / "again"
    assert main(["check", str(root / "x"), "--output-dir", str(out)]) == 0
    before = json.loads((root / "x" / "q8-g64" / "verdict.json").read_text())
    after = json.loads((out / "q8-g64" / "verdict.json").read_text())
    assert after == before


@pytest.mark.slow
def test_an_unflagged_nan_is_still_a_corrupt_file(nan_run, tmp_path, capsys):
    """The saved flags are what make NaN rows judgeable: a NaN the writer did not flag (a file
    edited by hand, a writer bug) is refused as corrupt, naming the file and the row."""
    root, _ = nan_run
    run = tmp_path / "x"
    shutil.copytree(root / "x", run)
    path = run / "q8-g64" / "outputs.npz"
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "nonfinite_rows"}
    np.savez(path, **arrays)
    assert main(["check", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "logits has NaN or inf on a valid option (row " in err
    assert str(path) in err


def _finite_pair(seed=0):
    cal, ev = synthetic_outputs(n=400, seed=seed)
    return cal, ev, {k: v.copy() for k, v in cal.items()}, {k: v.copy() for k, v in ev.items()}


def _poison(out, rows, value):
    for f in ("logits", "probs", "action_probs", "confidence", "expected_score"):
        a = out[f]
        a[rows] = value
    return out


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_judge_fails_nonfinite_rows_and_judges_the_rest_on_the_finite_rows(value):
    ref_cal, ref_ev, var_cal, var_ev = _finite_pair()
    rows = [3, 17, 250]
    _poison(var_ev, rows, value)
    ev, verdict, eps = judge_outputs(ref_cal, ref_ev, var_cal, var_ev, load_contract(None))
    assert nonfinite_rows(var_ev).nonzero()[0].tolist() == rows
    assert ev.nonfinite["eval"] == [f"eval{i}" for i in rows] and ev.nonfinite["rows"] == 800
    assert verdict.failed == ["finite-outputs"]  # the rest equals the reference: every clause passes
    assert len(ev.per_example) == 397 and ev.summary["nonfinite_rows"] == 3
    # the same evaluation as judging the 397 finite rows alone
    r, v, _ = finite_part(ref_ev, var_ev)
    ev2, verdict2, _ = judge_outputs(ref_cal, r, var_cal, v, load_contract(None))
    assert ev2.summary["agreement"] == ev.summary["agreement"] == 1.0
    assert [c.status for c in verdict2.results] == [
        c.status for c in verdict.results if c.id != "finite-outputs"] + ["pass"]


def test_a_calibration_row_with_nan_makes_epsilon_inf_and_certifies_nothing():
    ref_cal, ref_ev, var_cal, var_ev = _finite_pair()
    _poison(var_cal, [5], np.nan)
    ev, verdict, eps = judge_outputs(ref_cal, ref_ev, var_cal, var_ev, load_contract(None))
    # ε (the max) is inf; the conformal ε is a quantile: one unbounded row of 400 leaves it 0
    assert ev.epsilon == np.inf and eps["all"]["epsilon_conformal"] == 0.0
    assert ev.summary["certified_share"] == 0.0 and ev.nonfinite["calibration"] == ["cal5"]
    assert verdict.failed == ["finite-outputs"]
    res = {c.id: c for c in verdict.results}
    assert res["finite-outputs"].reason == "NaN or inf outputs on 1 calibration row (id cal5)"


def test_every_row_nan_fails_finite_outputs_and_skips_every_other_clause_with_the_reason():
    ref_cal, ref_ev, var_cal, var_ev = _finite_pair()
    _poison(var_ev, slice(None), np.nan)
    ev, verdict, _ = judge_outputs(ref_cal, ref_ev, var_cal, var_ev, load_contract(None))
    assert verdict.failed == ["finite-outputs"] and verdict.outcome == "fail"
    others = [c for c in verdict.results if c.id != "finite-outputs"]
    assert {c.status for c in others} == {
        "skipped: every row has NaN or inf outputs (finite-outputs)"}
    assert ev.n_nonfinite == 400 and len(ev.per_example) == 0


def test_a_reference_with_nan_rows_is_refused_naming_the_split_and_rows():
    ref_cal, ref_ev, var_cal, var_ev = _finite_pair()
    _poison(ref_ev, [0, 1], np.nan)
    with pytest.raises(ValueError, match=r"^the reference's eval outputs have NaN or inf on 2 of "
                       r"400 rows \(ids eval0, eval1\): no variant can be judged"):
        judge_outputs(ref_cal, ref_ev, var_cal, var_ev, load_contract(None))


def test_saved_outputs_flag_their_nonfinite_rows_and_load_back(tmp_path):
    _, ev = synthetic_outputs(n=50)
    out = DecisionOutputs(**{k: v.copy() for k, v in ev.items()})
    out.logits[[2, 9]] = np.nan
    out.probs[[2, 9]] = np.nan
    out.save(tmp_path / "o.npz")
    with np.load(tmp_path / "o.npz") as z:
        assert z["nonfinite_rows"].nonzero()[0].tolist() == [2, 9]
    back = DecisionOutputs.load(tmp_path / "o.npz")
    assert np.isnan(back.logits[2]).all() and nonfinite_rows(back).sum() == 2
    DecisionOutputs(**ev).save(tmp_path / "clean.npz")  # a finite file has no flags (unchanged)
    with np.load(tmp_path / "clean.npz") as z:
        assert "nonfinite_rows" not in z.files


def test_timed_check_matches_nan_with_nan_and_nothing_else():
    _, ev = synthetic_outputs(n=20)
    a = DecisionOutputs(**{k: v.copy() for k, v in ev.items()})
    b = DecisionOutputs(**{k: v.copy() for k, v in ev.items()})
    a.logits[4] = b.logits[4] = np.nan
    a.logits[7, 0] = b.logits[7, 0] = np.inf
    assert compare(a, b) == {"rows": 20, "max_abs_dlogit": 0.0, "label_changes": 0,
                             "nonfinite_rows": 2}
    b.logits[7, 0] = -np.inf  # +inf judged, -inf timed: not the same model
    assert compare(a, b)["max_abs_dlogit"] == np.inf and compare(a, b)["label_changes"] == 1
    b.logits[7, 0], b.logits[4] = np.inf, 0.5  # NaN judged, a number timed
    assert compare(a, b)["max_abs_dlogit"] == np.inf


@pytest.mark.slow
def test_a_reference_with_nan_rows_stops_the_sweep_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VARIANTS_TEST_NONFINITE", "reference")
    root = tmp_path / "r"
    assert main([*ARGS, "--results-dir", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("variants: error: the reference model nonfinite_model-build gives NaN "
                          "or inf outputs on ") and "of the calibration split" in err
    meta = json.loads((root / "x" / "run.json").read_text())
    assert meta["status"] == "incomplete" and "NaN or inf" in meta["error"]["error"]
    assert sorted(p.name for p in (root / "x").iterdir()) == ["run.json"]


def test_a_layer_whose_round_trip_gives_nan_is_as_sensitive_as_a_layer_can_be():
    """The search's per-layer sensitivity (variants.search.sensitivity): a NaN row is an
    unbounded drift, an infinite KL and a flip, not an error that stops the search."""
    from variants.search.sensitivity import _compare

    ref = np.random.default_rng(0).normal(size=(4, 3))
    mask = np.ones((4, 3), bool)
    assert _compare(ref, ref.copy(), mask) == (0.0, 0.0, 0.0)
    out = ref.copy()
    out[1] = np.nan
    assert _compare(ref, out, mask) == (np.inf, np.inf, 0.25)
    assert _compare(ref, np.full((4, 3), np.nan), mask) == (np.inf, np.inf, 1.0)


@pytest.mark.slow
def test_compare_pairs_only_the_rows_both_sides_answered_with_numbers(nan_run, tmp_path, capsys):
    """``variants compare`` of a variant with NaN rows (A) and one without (B, here the
    reference's own outputs in its place): the paired statistics use the rows finite on both
    sides, and each side's finite-outputs count stays its own."""
    root, _ = nan_run
    b = tmp_path / "b"
    shutil.copytree(root / "x", b)
    for name in ("outputs.npz", "calibration_outputs.npz"):
        DecisionOutputs.load(b / "reference" / name).save(b / "q8-g64" / name)
    assert main(["compare", str(root / "x"), str(b), "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    bad = len(_bad_ids(root / "x" / "q8-g64" / "outputs.npz"))
    assert f"{40 - bad} eval rows, the same ids in both" in out
    assert f"{bad} rows left out: NaN or inf outputs on one side or both" in out
    res = json.loads((tmp_path / "c.json").read_text())
    res = res[0] if isinstance(res, list) else res
    finite = next(c for c in res["clauses"] if c["clause"] == "finite-outputs")
    assert finite["b"] == 0 and finite["a"] == bad + len(
        _bad_ids(root / "x" / "q8-g64" / "calibration_outputs.npz"))


@pytest.mark.filterwarnings("error::RuntimeWarning")  # no "Mean of empty slice" lines
def test_compare_with_every_row_nan_on_one_side_has_no_paired_rows_and_does_not_crash():
    """``variants compare`` of a variant whose every eval row is NaN (``VARIANTS_TEST_NONFINITE
    =all``) against any other: no row is left to pair, so every clause's CI is NaN (no
    IndexError from the bootstrap over 0 rows), and finite-outputs still compares the counts."""
    from types import SimpleNamespace

    from runs.compare import clause_differences

    ref_cal, ref_ev, var_cal, var_ev = _finite_pair()
    good = judge_outputs(ref_cal, ref_ev, var_cal, var_ev, load_contract(None))[:2]
    _poison(var_ev, slice(None), np.nan)
    ev_nan = judge_outputs(ref_cal, ref_ev, var_cal, var_ev, load_contract(None))[0]
    keep = np.zeros(400, bool)  # the paired rows: none
    ea = judge_outputs(ref_cal, {k: v[keep] for k, v in ref_ev.items()}, var_cal,
                       {k: v[keep] for k, v in ref_ev.items()}, load_contract(None))[0]
    a = SimpleNamespace(verdict=good[1].to_dict())
    rows = clause_differences(a, a, n_boot=20, evaluations=(ea, ev_nan))
    by = {r["clause"]: r for r in rows}
    assert np.isnan(by["kl-p95"]["ci"]).all() and np.isnan(by["agreement"]["ci"]).all()
    assert by["finite-outputs"]["b"] == 400 and by["finite-outputs"]["ci"] == [400.0, 400.0]


def test_a_contracts_own_nonfinite_rows_bound_is_the_one_applied(tmp_path):
    """A contract with its own clause on ``nonfinite_rows`` (no finite-outputs clause appended)
    is held to its own bound: 3 NaN rows under ``max = 5`` pass it, 8 fail it naming the rows
    (the count failed whatever the bound, "FAIL: ... on 3 eval rows" beside value 3 <= 5)."""
    path = tmp_path / "c.toml"
    path.write_text('name = "c"\n[[clause]]\nid = "few-nan"\nmetric = "nonfinite_rows"\n'
                    'stratum = "all"\nstatistic = "value"\nmax = 5\n')
    contract = load_contract(path)
    assert [c.id for c in contract.clauses] == ["few-nan"]
    for n_bad, status in ((3, "pass"), (8, "FAIL: NaN or inf outputs on 8 eval rows")):
        ref_cal, ref_ev, var_cal, var_ev = _finite_pair()
        _poison(var_ev, list(range(n_bad)), np.nan)
        verdict = judge_outputs(ref_cal, ref_ev, var_cal, var_ev, contract)[1]
        (res,) = verdict.results
        assert res.value == n_bad and res.status.startswith(status)
        assert verdict.passed == (n_bad <= 5)


@pytest.mark.slow
def test_a_factory_models_run_exports(nan_run, tmp_path):
    """Found while breaking #39: export rebuilt the run's model from run.json's display name
    (nonfinite_model-build: "unknown model") instead of its factory; now the factory is used."""
    root, _ = nan_run
    out = tmp_path / "exp"
    assert main(["export", str(root / "x"), "--variant", "q8-g64", "--out", str(out),
                 "--allow-fail"]) == 0
    assert (out / "model.safetensors").is_file() and (out / "manifest.json").is_file()

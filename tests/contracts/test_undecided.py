"""Three outcomes: a clause compared on its interval whose point value meets the threshold but
whose far end does not is undecided — not a pass, not a failure — and says about how many rows
would decide it (contracts.checker, contracts.undecided, ``variants check``)."""

import json
import math

import numpy as np
import pytest

from contracts import check, contract_from_dict
from metrics.decide import rows_to_decide
from metrics.evaluate import evaluate
from metrics.intervals import clopper_pearson
from runs.commands.check import main
from runs.io import write_json, write_npz
from runs.selftest import FAULTS, synthetic_outputs


@pytest.fixture(scope="module")
def noisy():
    cal, ev = synthetic_outputs(n=800, seed=0)
    vc, ve = FAULTS["logit-noise"].apply(cal, ev, np.random.default_rng(0))
    return cal, ev, vc, ve


def _contract(agree, **extra):
    return contract_from_dict({"settings": {"n_bootstrap": 500}, "clause": [
        {"id": "point", "metric": "agreement", "statistic": "rate", "min": agree - 0.005},
        {"id": "bound", "metric": "agreement", "statistic": "rate", "min": agree - 0.005,
         "compare": "ci"},
        {"id": "beyond", "metric": "agreement", "statistic": "rate", "min": agree + 0.001,
         "compare": "ci"}, *extra.get("more", [])]})


def test_point_passes_bound_does_not_is_undecided_not_failed(noisy):
    _, ev, _, ve = noisy
    e = evaluate(ev, ve, epsilon=0.0)
    agree = e.value("agreement")
    v = check(_contract(agree), e)
    by = {r.id: r for r in v.results}
    assert by["point"].passed is True and not by["point"].undecided
    # the far end (Clopper–Pearson lower bound) is below agree - 0.005, the value above it
    assert by["bound"].ci_low < agree - 0.005 < agree
    assert by["bound"].undecided and by["bound"].passed is False
    assert by["beyond"].passed is False and not by["beyond"].undecided  # value itself fails
    assert v.failed == ["beyond"] and v.undecided == ["bound"] and v.outcome == "fail"
    v2 = check(contract_from_dict({"settings": {"n_bootstrap": 500},
                                   "clause": [dict(c) for c in _clauses(agree)[:2]]}), e)
    assert v2.outcome == "undecided" and v2.word == "UNDECIDED" and not v2.passed
    assert v2.failed == [] and v2.undecided == ["bound"]
    d = json.loads(json.dumps(v2.to_dict()))
    assert d["outcome"] == "undecided" and d["undecided"] == ["bound"] and d["passed"] is False
    clause = d["clauses"][1]
    assert clause["undecided"] is True and clause["rows_needed"] > 800
    assert clause["status"] == (f"undecided: about {clause['rows_needed'] - 800:,} more rows "
                                "would decide it")


def _clauses(agree):
    return [{"id": "point", "metric": "agreement", "statistic": "rate", "min": agree - 0.005},
            {"id": "bound", "metric": "agreement", "statistic": "rate", "min": agree - 0.005,
             "compare": "ci"}]


def test_rows_needed_is_exact_for_a_clopper_pearson_rate(noisy):
    """0 flips in 20 rows, max 0.01: the exact upper bound 1 - 0.025^(1/n) meets 0.01 from
    n = 368 (0.025^(1/368) = 0.98002, 1 - that = 0.00998; at 367: 0.01000 > 0.01)."""
    assert clopper_pearson(0, 368)[1] <= 0.01 < clopper_pearson(0, 367)[1]
    assert rows_to_decide("clopper-pearson", k=0, n=20, threshold=0.01, op="<=") == 368
    assert rows_to_decide("clopper-pearson", k=5, n=20, threshold=0.01, op="<=") is None


def test_check_fail_on_violation_says_undecided_and_exits_1(tmp_path, noisy, capsys):
    cal, ev, vc, ve = noisy
    run = tmp_path / "run"
    write_npz(run / "reference" / "calibration_outputs.npz", cal)
    write_npz(run / "reference" / "outputs.npz", ev)
    write_npz(run / "noisy" / "calibration_outputs.npz", vc)
    write_npz(run / "noisy" / "outputs.npz", ve)
    write_json(run / "run.json", {"config": {"near_tie_margin": 0.05}})
    agree = evaluate(ev, ve, epsilon=0.0).value("agreement")
    toml = tmp_path / "c.toml"
    toml.write_text("[settings]\nn_bootstrap = 200\n" + "".join(
        f'[[clause]]\nid = "{c["id"]}"\nmetric = "agreement"\nstatistic = "rate"\n'
        f'min = {c["min"]!r}\n' + (f'compare = "ci"\n' if "compare" in c else "")
        for c in _clauses(agree)))
    assert main(["check", str(run), "--contract", str(toml)]) == 0
    assert main(["check", str(run), "--contract", str(toml), "--fail-on-violation"]) == 1
    cap = capsys.readouterr()
    assert "noisy  UNDECIDED  2/3 clauses pass" in cap.out
    assert "bound undecided: about" in cap.out
    assert "noisy undecided" in cap.err and "not a pass" in cap.err
    verdict = json.loads((run / "noisy" / "verdict.json").read_text())
    assert verdict["outcome"] == "undecided" and verdict["failed"] == []
    md = (run / "noisy" / "report.md").read_text()
    assert md.startswith("# noisy: UNDECIDED") and "undecided: about" in md


def test_summary_row_says_undecided(noisy):
    from runs.report import summary_row

    _, ev, _, ve = noisy
    e = evaluate(ev, ve, epsilon=0.0)
    v = check(contract_from_dict({"settings": {"n_bootstrap": 200},
                                  "clause": _clauses(e.value("agreement"))}), e)
    row = summary_row("noisy", {"family": "quant"}, e.summary, v, {})
    assert row["verdict"] == "UNDECIDED" and row["undecided_clauses"] == "bound"
    assert row["failed_clauses"] == ""


def test_search_names_the_cheapest_undecided_candidate_and_its_rows():
    from variants.search.report import record_word
    from variants.search.run import _undecided_text

    recs = [
        {"id": "a", "name": "q4", "cost": 1.0, "model_bytes": 10, "bits_per_weight": 5.0,
         "passed": False, "failed": ["kl-p95"], "undecided": []},
        {"id": "b", "name": "q6", "cost": 2.0, "model_bytes": 20, "bits_per_weight": 7.0,
         "passed": False, "failed": [], "undecided": ["accuracy-drop"],
         "rows_needed": {"accuracy-drop": 1234}},
        {"id": "c", "name": "q8", "cost": 3.0, "model_bytes": 30, "bits_per_weight": 9.0,
         "passed": False, "failed": [], "undecided": ["agreement"], "rows_needed": {}},
    ]
    assert [record_word(r) for r in recs] == ["FAIL", "UNDECIDED", "UNDECIDED"]
    text = _undecided_text(recs, 800)
    assert text == (" Undecided (not a pass): q6 (7.000 bits/weight) on accuracy-drop (about 1,234 "
                    "rows would decide it), at its observed rates on 800 search-eval rows; give "
                    "more rows (--n-search) to decide it.")
    assert _undecided_text(recs[:1], 800) == ""


@pytest.mark.parametrize("rec", ["x", [1], 5, {"max_abs_logit_diff": True},
                                 {"max_abs_logit_diff": "abc"}, {"max_abs_logit_diff": -1.0},
                                 {"max_abs_logit_diff": float("nan")}, {"max_abs_logit_diff": {}}])
def test_a_malformed_reference_noise_is_one_line_naming_the_key(rec):
    from runs.folder import CheckError
    from runs.settings import numerical_noise

    with pytest.raises(CheckError, match=r"^run.json: reference_noise.max_abs_logit_diff is .*"
                                         r"rerun the sweep") as e:
        numerical_noise({"reference_noise": rec})
    assert "\n" not in str(e.value)
    assert numerical_noise({}) == 0.0
    assert numerical_noise({"reference_noise": {"max_abs_logit_diff": 4e-6}}) == 4e-6


def test_a_bootstrap_clause_detects_from_its_near_end_and_a_count_is_never_undecided(noisy):
    _, ev, _, ve = noisy
    e = evaluate(ev, ve, epsilon=0.0)
    kl95 = e.value("kl", statistic="p95")
    flips = e.value("flip", statistic="count")
    v = check(contract_from_dict({"settings": {"n_bootstrap": 300}, "clause": [
        {"id": "kl", "metric": "kl", "statistic": "p95", "max": kl95 * 2, "compare": "ci"},
        {"id": "cnt", "metric": "flip", "statistic": "count", "max": flips, "compare": "ci"}]}), e)
    kl, cnt, finite = v.results
    assert finite.id == "finite-outputs" and finite.passed  # every contract has it
    # a violation of a max shows once the lower end passes it: value - low past the bound
    assert kl.detectable == pytest.approx(kl.value - kl.ci_low)
    # the count meets its max, its upper bound does not, and more rows only add events: FAIL
    assert cnt.value == flips < cnt.ci_high and cnt.passed is False
    assert not cnt.undecided and cnt.detectable is None and v.failed == ["cnt"]

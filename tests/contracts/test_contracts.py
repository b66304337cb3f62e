"""Tests of contracts/: loading and validating contract TOML, and checking evaluations."""

import re
import json
from importlib import resources

import numpy as np
import pytest

from contracts import ContractError, check, contract_from_dict, load_contract
from metrics import evaluate
from metrics.evaluate import METRIC_STATISTICS

GOOD_CLAUSE = """
[[clause]]
id = "agreement"
metric = "agreement"
stratum = "all"
statistic = "rate"
min = 0.97
why = "choices"
"""


def _outputs(logits, mask, labels, tasks, temperature=0.5):
    """A DecisionOutputs-shaped dict; scores 0..1 over options, 2 actions (option 0 vs the rest)."""
    z = np.where(mask, logits / temperature, -np.inf)
    e = np.where(mask, np.exp(z - z.max(axis=1, keepdims=True)), 0.0)
    probs = e / e.sum(axis=1, keepdims=True)
    scores = np.tile(np.linspace(0.0, 1.0, mask.shape[1]), (len(labels), 1))
    return {
        "ids": np.array([f"ex{i}" for i in range(len(labels))]),
        "task": np.asarray(tasks),
        "logits": np.where(mask, logits, 0.0).astype(np.float32),
        "option_mask": mask,
        "probs": probs.astype(np.float32),
        "expected_score": (probs * scores).sum(axis=1).astype(np.float32),
        "action_probs": np.stack([probs[:, 0], probs[:, 1:].sum(axis=1)], axis=1).astype(np.float32),
        "labels": labels,
    }


@pytest.fixture(scope="module")
def dataset():
    rng = np.random.default_rng(0)
    n, k = 400, 4
    mask = np.arange(k)[None, :] < rng.integers(2, k + 1, size=n)[:, None]
    logits = rng.normal(scale=2.0, size=(n, k))
    labels = np.argmax(np.where(mask, logits + rng.normal(size=(n, k)), -np.inf), axis=1)
    labels[rng.random(n) < 0.2] = -1
    tasks = np.where(rng.random(n) < 0.5, "sentiment-3", "nli-3")
    return logits, mask, labels.astype(np.int64), tasks


def test_default_contract_loads():
    contract = load_contract(None)
    assert contract.name == "default"
    # the foundation's clauses come first, in order; the in-depth ones follow
    assert [c.id for c in contract.clauses][:9] == [
        "agreement", "certified-flips", "negative-flips", "near-tie-flips", "kl-p95", "ece-delta",
        "score-error-max", "action-drift-p95", "accuracy-drop"]
    assert {"bound-violations", "option-mask", "conformal-coverage", "temperature-refit"} <= {
        c.id for c in contract.clauses}
    by_id = {c.id: c for c in contract.clauses}
    assert (by_id["agreement"].op, by_id["agreement"].threshold) == (">=", 0.97)
    assert (by_id["certified-flips"].stratum, by_id["certified-flips"].statistic) == ("certified", "count")
    assert by_id["near-tie-flips"].threshold == 0.25 and by_id["kl-p95"].threshold == 0.05
    assert all(c.why for c in contract.clauses)
    assert all(c.statistic in METRIC_STATISTICS[c.metric] for c in contract.clauses)
    path = resources.files("contracts").joinpath("default.toml")
    assert load_contract(str(path)).clauses == contract.clauses


def test_perfect_variant_passes_every_clause(dataset):
    logits, mask, labels, tasks = dataset
    ref = _outputs(logits, mask, labels, tasks)
    verdict = check(load_contract(None), evaluate(ref, dict(ref), epsilon=0.0))
    assert verdict.passed and verdict.failed == [] and verdict.untested == []
    assert all(r.passed is True for r in verdict.results)
    by_id = {r.id: r for r in verdict.results}
    assert by_id["agreement"].value == 1.0 and by_id["agreement"].n == 400
    assert by_id["negative-flips"].n == int((labels >= 0).sum())
    assert by_id["near-tie-flips"].n > 0 and by_id["certified-flips"].value == 0.0


def test_planted_flips_fail_the_agreement_clause(dataset):
    """Swapping the top two options of 10% of examples must fail agreement (≥ 0.97)."""
    logits, mask, labels, tasks = dataset
    rng = np.random.default_rng(1)
    ref = _outputs(logits, mask, labels, tasks)
    var_logits = logits.copy()
    rows = np.flatnonzero(rng.random(len(labels)) < 0.10)
    order = np.argsort(-np.where(mask, logits, -np.inf), axis=1)
    first, second = order[rows, 0], order[rows, 1]
    var_logits[rows, first], var_logits[rows, second] = logits[rows, second], logits[rows, first]
    ev = evaluate(ref, _outputs(var_logits, mask, labels, tasks), epsilon=0.0)
    verdict = check(load_contract(None), ev)
    by_id = {r.id: r for r in verdict.results}
    assert not verdict.passed and "agreement" in verdict.failed
    assert by_id["agreement"].passed is False
    assert by_id["agreement"].value == pytest.approx(1 - len(rows) / len(labels))
    assert by_id["certified-flips"].value == len(rows)  # ε = 0 certifies every non-tie: all broke


def test_empty_stratum_is_reported_not_failed(dataset, tmp_path):
    logits, mask, labels, tasks = dataset
    ref = _outputs(logits, mask, labels, tasks)
    path = tmp_path / "c.toml"
    path.write_text(GOOD_CLAUSE + """
[[clause]]
id = "no-such-task"
metric = "flip"
stratum = "task:no-such-task"
statistic = "rate"
max = 0.0
""")
    verdict = check(load_contract(path), evaluate(ref, ref, epsilon=0.0))
    result = verdict.results[1]
    assert result.passed is None and result.n == 0 and np.isnan(result.value)
    assert result.status == "no examples" and verdict.passed and verdict.untested == ["no-such-task"]
    d = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    assert d["passed"] is True and d["clauses"][1]["value"] is None
    assert d["clauses"][1]["status"] == "no examples" and d["contract"] == "c"
    frame = verdict.to_frame()
    assert frame["id"].tolist() == ["agreement", "no-such-task", "finite-outputs"]
    assert frame["status"].tolist() == ["pass", "no examples", "pass"]
    assert {"value", "op", "threshold", "passed", "n"} <= set(frame.columns)


def test_bounds_are_inclusive(dataset):
    logits, mask, labels, tasks = dataset
    ref = _outputs(logits, mask, labels, tasks)
    ev = evaluate(ref, ref, epsilon=0.0)
    contract = contract_from_dict({"clause": [
        {"id": "a", "metric": "agreement", "statistic": "rate", "min": 1.0},
        {"id": "b", "metric": "kl", "statistic": "max", "max": 0},
        {"id": "c", "metric": "accuracy_drop", "max": -0.001},  # statistic defaults to 'value'
    ]})
    # and the finite-outputs clause every contract gets (no NaN here: 0 <= 0 passes)
    assert [r.passed for r in check(contract, ev).results] == [True, True, False, True]


BAD = [
    ("not toml [[", "not valid TOML"),
    ('name = "x"\n', "no clauses"),
    ('nmae = "x"\n' + GOOD_CLAUSE, "unknown top-level key.*nmae"),
    (GOOD_CLAUSE.replace('metric = "agreement"', 'metric = "agreemnt"'),
     "clause 'agreement' has unknown metric 'agreemnt'; use one of agreement, flip"),
    (GOOD_CLAUSE.replace('statistic = "rate"', 'statistic = "median"'),
     "clause 'agreement' has statistic 'median', not allowed for metric 'agreement'; use one of rate, count"),
    (GOOD_CLAUSE.replace('statistic = "rate"', 'statistic = "p95"'), "not allowed for metric 'agreement'"),
    (GOOD_CLAUSE.replace('stratum = "all"', 'stratum = "near-ties"'),
     "clause 'agreement' has unknown stratum 'near-ties'; use one of all, near_tie, certified"),
    (GOOD_CLAUSE.replace('stratum = "all"', 'stratum = "task:"'), "unknown stratum 'task:'"),
    (GOOD_CLAUSE.replace("min = 0.97", ""), "neither min nor max"),
    (GOOD_CLAUSE.replace("min = 0.97", "min = 0.97\nmax = 1.0"), "both min and max"),
    (GOOD_CLAUSE.replace("min = 0.97", 'min = "0.97"'), "min = '0.97'; the bound must be a finite number"),
    (GOOD_CLAUSE.replace("min = 0.97", "min = true"), "bound must be a finite number"),
    (GOOD_CLAUSE.replace("min = 0.97", "min = nan"), "bound must be a finite number"),
    (GOOD_CLAUSE + GOOD_CLAUSE, "duplicate clause id 'agreement'"),
    (GOOD_CLAUSE.replace('why = "choices"', 'why = "choices"\nthreshold = 1'),
     r"clause 'agreement' has unknown key\(s\) threshold"),
    (GOOD_CLAUSE.replace('id = "agreement"\n', ""), "clause #1 needs a non-empty string id"),
    ("clause = 3\n", "no clauses"),
    ("clause = [3]\n", "clause #1 must be a \\[\\[clause\\]\\] table"),
]


@pytest.mark.parametrize("text, match", BAD)
def test_bad_contracts_raise(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ContractError, match=match):
        load_contract(path)


def test_missing_contract_file(tmp_path):
    with pytest.raises(ContractError, match="not found; pass an existing .toml path"):
        load_contract(tmp_path / "nope.toml")
    assert issubclass(ContractError, ValueError)


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_contract_name_says_so(path):
    # Path("") is the current folder: "cannot read contract file  (Is a directory)" named nothing
    with pytest.raises(ContractError, match=r"^the contract name is empty; pass a \.toml path or "
                                            r"a packaged contract: default \| strict \| lenient"):
        load_contract(path)


@pytest.mark.parametrize("clause, says", [
    ({"metric": "agreement", "statistic": "rate", "min": 1.5}, "outside [0, 1]: it would never pass"),
    ({"metric": "flip", "statistic": "rate", "max": 2}, "outside [0, 1]: it would always pass"),
    ({"metric": "certified_share", "statistic": "value", "min": -1}, "it would always pass"),
    ({"metric": "flip", "statistic": "count", "max": -1}, "on a count, which is never negative"),
])
def test_a_bound_that_decides_nothing_is_refused(clause, says):
    """Issue #39's attack: a rate bounded outside [0, 1] (or a count below 0) was accepted and
    decided every variant the same way; now the contract is refused naming the clause."""
    with pytest.raises(ContractError, match=r"clause 'x' .*" + re.escape(says)):
        contract_from_dict({"clause": [{"id": "x", **clause}]})

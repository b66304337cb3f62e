"""What the suite refuses, or says it could not judge, about a non-softmax head (issue 40's
reviewer findings): a non-string problem_type, a several-label cross-encoder (pairs are never
fed as a second segment), a softmax stratum in a regression / multi-label contract, labels on a
regression head's rows, a regression config.json without one id2label entry, and a regression
reference whose values are constant. One line and exit 2 through the CLI; hand-computed values
for the constant-reference verdict."""

import json

import numpy as np
import pytest

from contracts.checker import check, contract_from_dict
from metrics.evaluate import evaluate
from metrics.regression import spread
from tests.models.head_fixtures import make_head_folder, model_toml, rows_jsonl
from variants.cli import main
from variants.models.head_output import output_kind
from variants.models.model_config import ModelConfigError

SPLITS = {"fit": 10, "calibration": 30, "eval": 40}
ARGS = ["--bits", "8", "--timing-rounds", "1", "--timing-warmup", "0", "--timing-budget-s",
        "0.5", "--cold-start", "none", "--timing-batch-sizes", "1", "--no-progress"]


def _sweep(tmp, ck, capsys, *extra, rows=None, toml=None):
    """(exit code, stderr lines, results dir) of a tiny sweep of checkpoint ``ck``."""
    results = tmp / "results"
    rc = main(["sweep", "--model-config", str(toml or model_toml(tmp / "m.toml", ck)), "--data",
               str(rows or rows_jsonl(tmp / "rows.jsonl", n=80, splits=SPLITS)),
               "--results-dir", str(results), *ARGS, *extra])
    return rc, capsys.readouterr().err.strip().splitlines(), results


def _refused(tmp, ck, capsys, *extra, **kw):
    rc, err, results = _sweep(tmp, ck, capsys, *extra, **kw)
    assert rc == 2 and len(err) == 1, err
    assert not results.exists()
    return err[0]


# --- #5: problem_type of the wrong type ------------------------------------------------------
@pytest.mark.parametrize("pt", [["regression"], {"kind": "regression"}, 1])
def test_a_problem_type_that_is_no_string_is_refused_in_one_line(pt):
    with pytest.raises(ModelConfigError, match=r"^ck/config.json: problem_type .* is not one "
                       r"transformers knows \(single_label_classification, "):
        output_kind({"problem_type": pt}, 3, where="ck/config.json")


# --- #6: cross-encoders with several labels --------------------------------------------------
@pytest.mark.parametrize("config", [
    {"sentence_transformers": {"version": "4.0"}},
    {"sbert_ce_default_activation_function": "torch.nn.Identity"},
    {"sentence_transformers": {}, "problem_type": "single_label_classification"},
    {"sentence_transformers": {}, "problem_type": "multi_label_classification"},
])
def test_a_pair_classifier_cross_encoder_is_refused(config):
    with pytest.raises(ModelConfigError) as e:
        output_kind(config, 3, where="ck/config.json")
    msg = str(e.value)
    assert msg.startswith("ck/config.json: a sentence-transformers cross-encoder (")
    assert "num_labels 3" in msg and "no second segment" in msg and "delete" in msg
    assert "\n" not in msg


def test_sweep_refuses_an_nli_cross_encoder(tmp_path, capsys):
    ck = make_head_folder(tmp_path / "ck", 3, None,
                          extra={"sentence_transformers": {"version": "4.0"}})
    line = _refused(tmp_path, ck, capsys)
    assert line.startswith(f"variants: error: {ck}/config.json: a sentence-transformers "
                           "cross-encoder ('sentence_transformers', num_labels 3)")


# --- #3: softmax strata in a regression / multi-label contract -------------------------------
def _contract(stratum, metric="value_rel_error"):
    return contract_from_dict({"name": "s", "clause": [
        {"id": "c", "metric": metric, "stratum": stratum, "statistic": "max", "max": 0.25}]})


@pytest.mark.parametrize("stratum", ["near_tie", "not_near_tie", "certified", "uncertified",
                                     "certified_conformal", "epsilon_held", "numerical_tie",
                                     "decided", "human_near_tie", "margin:0-0.5", "labeled",
                                     "options:1"])
def test_a_softmax_stratum_is_refused_on_a_regression_head(stratum):
    from contracts.contract import ContractError
    from contracts.outputs import check_outputs

    with pytest.raises(ContractError) as e:
        check_outputs(_contract(stratum), "regression", where="ck/config.json")
    msg = str(e.value)
    assert msg.startswith(f"contract 's': clause 'c' restricts 'value_rel_error' to stratum "
                          f"'{stratum}', rows chosen by ")
    assert msg.endswith("but ck/config.json outputs one output value (regression), where that "
                        "stratum holds every row or none; use stratum all or task:<task name>")


def test_strata_that_fit_each_head_are_accepted():
    from contracts.outputs import check_outputs

    for stratum in ("all", "task:sentiment-3"):
        check_outputs(_contract(stratum), "regression")
    for stratum in ("all", "labeled", "task:x"):
        check_outputs(_contract(stratum, "label_prob_max_abs_diff"), "multi_label")
    for stratum in ("near_tie", "margin:0-0.5", "certified"):  # softmax: unchanged
        check_outputs(_contract(stratum, "kl"), "softmax")


def test_sweep_refuses_a_near_tie_clause_on_a_multi_label_head(tmp_path, capsys):
    ck = make_head_folder(tmp_path / "ck", 4, "multi_label_classification")
    toml = tmp_path / "c.toml"
    toml.write_text('name = "s"\n[[clause]]\nid = "c"\nmetric = "label_flip"\n'
                    'stratum = "near_tie"\nstatistic = "rate"\nmax = 0.03\n')
    line = _refused(tmp_path, ck, capsys, "--contract", str(toml))
    assert "clause 'c' restricts 'label_flip' to stratum 'near_tie', rows chosen by the " \
        "softmax's top-2 margin" in line
    assert line.endswith("use stratum all or labeled or task:<task name>")


# --- #8: labels on a regression head's rows --------------------------------------------------
@pytest.mark.parametrize("label", [0.5, "LABEL_0", 0])
def test_labels_on_a_regression_head_are_refused(tmp_path, capsys, label):
    ck = make_head_folder(tmp_path / "ck", 1, "regression")
    rows = rows_jsonl(tmp_path / "rows.jsonl", n=80, splits=SPLITS)
    lines = rows.read_text().splitlines()
    lines[3] = json.dumps({**json.loads(lines[3]), "label": label})
    rows.write_text("\n".join(lines) + "\n")
    line = _refused(tmp_path, ck, capsys, rows=rows)
    assert line == (f"variants: error: data file {rows}: line 4, column 'label': a regression "
                    "head is judged against the reference's values, so label cells are not "
                    "read; drop the label column")


def test_unlabelled_cells_on_a_regression_head_are_fine(tmp_path):
    from variants.datasets.own import read_data

    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a", "split": "eval", "label": -1}\n'
                    '{"text": "b", "split": "eval", "label": ""}\n')
    frame = read_data(path, unread="why", require_splits=("eval",))
    assert frame["label"].tolist() == [-1, -1]


# --- #9: a regression head's config.json id2label --------------------------------------------
def _edit(ck, **changes):
    cfg = json.loads((ck / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (ck / "config.json").write_text(json.dumps(cfg))


def test_a_regression_head_without_id2label_is_refused_naming_num_labels(tmp_path, capsys):
    ck = make_head_folder(tmp_path / "ck", 1, "regression")
    _edit(ck, id2label=None, label2id=None)
    line = _refused(tmp_path, ck, capsys)
    assert line == (f"variants: error: {ck}/config.json: a regression head (one output value) "
                    "but config.json has no id2label and no num_labels (transformers reads 2); "
                    "set \"num_labels\": 1 (or \"id2label\": {\"0\": \"LABEL_0\"}) in "
                    "config.json")


def test_a_regression_head_with_several_id2label_names_is_refused(tmp_path, capsys):
    ck = make_head_folder(tmp_path / "ck", 1, "regression")
    _edit(ck, id2label={"0": "a", "1": "b", "2": "c"}, num_labels=1)
    line = _refused(tmp_path, ck, capsys)
    assert line.startswith(f"variants: error: {ck}/config.json: id2label gives 3 names "
                           "(transformers reads num_labels 3) but the regression head makes one "
                           "output value; make id2label one entry")


# --- #7: a regression reference with constant values -----------------------------------------
def _evaluation(r, v):
    """evaluate() of a one-output head's values ``r`` (reference) and ``v`` (variant)."""
    from tests.metrics.test_head_metrics import _outputs

    return evaluate(_outputs(np.array(r, float)[:, None]), _outputs(np.array(v, float)[:, None]),
                    epsilon=0.1, value_tolerance=0.05)


REG = contract_from_dict({"name": "regression", "settings": {"value_tolerance": 0.05}, "clause": [
    {"id": "within", "metric": "within_tolerance", "stratum": "all", "statistic": "rate",
     "min": 0.95},
    {"id": "rel-max", "metric": "value_rel_error", "stratum": "all", "statistic": "max",
     "max": 0.25},
    {"id": "rank", "metric": "value_spearman", "stratum": "all", "statistic": "value",
     "min": 0.99},
    {"id": "abs-max", "metric": "value_abs_error", "stratum": "all", "statistic": "max",
     "max": 0.01}]})


def test_spread_of_equal_values_is_exactly_zero():
    assert spread(np.full(40, 0.1)) == 0.0  # np.std gives ~1.4e-17 here
    assert spread([1.0, 3.0]) == 1.0


def test_a_constant_reference_names_why_its_relative_clauses_are_not_judged():
    ev = _evaluation([0.3] * 4, [0.3, 0.304, 0.298, 0.3])
    v = check(REG, ev, n_bootstrap=0)
    res = {r.id: r for r in v.results}
    for cid in ("within", "rel-max", "rank"):
        assert res[cid].passed is None and res[cid].reason, res[cid]
    assert res["within"].status.startswith(
        "skipped: the reference's values are constant on the 4 eval rows (all 0.3, spread 0)")
    assert res["rank"].reason.startswith("the reference's values are constant on the clause's "
                                         "4 rows (all 0.3): rank correlation is undefined")
    assert res["abs-max"].value == pytest.approx(0.004, abs=1e-6) and res["abs-max"].passed is True
    assert v.untested == ["within", "rel-max", "rank"]
    assert list(v.unjudged.values()) == [["within", "rel-max"], ["rank"]]
    assert v.unjudged_text().startswith("; not judged: within, rel-max: the reference's values")


def test_a_constant_variant_fails_rank_correlation_where_the_reference_varies():
    ev = _evaluation([0.0, 1.0, 2.0, 3.0], [1.5] * 4)
    res = {r.id: r for r in check(REG, ev, n_bootstrap=0).results}
    assert res["rank"].passed is False
    assert res["rank"].status == ("FAIL: the variant's values are constant on the clause's 4 "
                                  "rows (all 1.5) where the reference's vary: the reference's "
                                  "order is lost")
    # |v - r| / s with s = std([0, 1, 2, 3]) = sqrt(1.25): max 1.5 / 1.1180 = 1.3416; the
    # value read through float32 outputs
    assert res["rel-max"].value == pytest.approx(1.5 / np.sqrt(1.25))


def test_sweep_of_a_constant_regression_head_says_which_clauses_were_not_judged(tmp_path, capsys):
    ck = make_head_folder(tmp_path / "ck", 1, "regression", scale=0.0)  # every value is 0
    results = tmp_path / "results"
    rc = main(["sweep", "--model-config", str(model_toml(tmp_path / "m.toml", ck)), "--data",
               str(rows_jsonl(tmp_path / "rows.jsonl", n=80, splits=SPLITS)), "--results-dir",
               str(results), "--run", "r", *ARGS])
    said = capsys.readouterr()
    assert rc == 0
    (line,) = [x for x in (said.out + said.err).splitlines() if x.startswith("q8-g64: PASS")]
    assert line.startswith("q8-g64: PASS; not judged: within-tolerance, rel-error-max, "
                           "rel-error-mean: the reference's values are constant on the 40 eval "
                           "rows (all 0, spread 0)")
    assert line.endswith("; rank-correlation: the reference's values are constant on the "
                         "clause's 40 rows (all 0): rank correlation is undefined (there is no "
                         "order to keep)")
    verdict = json.loads((results / "r" / "q8-g64" / "verdict.json").read_text())
    assert verdict["untested"] == ["within-tolerance", "rel-error-max", "rel-error-mean",
                                   "rank-correlation"]
    status = {c["id"]: c["status"] for c in verdict["clauses"]}
    assert status["rel-error-max"].startswith("skipped: the reference's values are constant on "
                                              "the 40 eval rows (all 0, spread 0)")
    report = (results / "r" / "report.md").read_text()
    assert "Not judged: within-tolerance, rel-error-max, rel-error-mean: the reference's " \
        in report

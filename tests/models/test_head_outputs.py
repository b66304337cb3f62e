"""What a checkpoint's head outputs (variants.models.head_output): config.json's problem_type and
num_labels decide the kind judged; the heads the suite cannot judge are refused in one line."""

import pytest

from variants.models.head_output import MULTI_LABEL, REGRESSION, SOFTMAX, output_kind
from variants.models.model_config import ModelConfigError


@pytest.mark.parametrize("config, n_out, kind", [
    ({}, 3, SOFTMAX),
    ({}, 2, SOFTMAX),
    ({"problem_type": "single_label_classification"}, 3, SOFTMAX),
    ({"problem_type": "multi_label_classification"}, 4, MULTI_LABEL),
    ({"problem_type": "multi_label_classification"}, 1, MULTI_LABEL),  # one sigmoid yes/no
    ({"problem_type": "regression"}, 1, REGRESSION),
    ({}, 1, REGRESSION),  # transformers' own rule: num_labels 1 without problem_type regresses
    ({"problem_type": None}, 1, REGRESSION),
])
def test_kind_from_problem_type_and_num_labels(config, n_out, kind):
    assert output_kind(config, n_out) == kind


@pytest.mark.parametrize("config, n_out, match", [
    ({"problem_type": "single_label_classification"}, 1, r"num_labels 1: a softmax over one "
     r"logit is 1.*\"regression\""),
    ({"problem_type": "regression"}, 3, r"'regression' with num_labels 3.*not judged"),
    ({"problem_type": "ordinal"}, 5, r"problem_type 'ordinal' is not one transformers knows"),
    ({"sentence_transformers": {"activation_fn": "torch.nn.Sigmoid"}}, 1,
     r"cross-encoder \('sentence_transformers', num_labels 1\).*reranker.*\"regression\""),
    ({"sbert_ce_default_activation_function": "torch.nn.Identity"}, 1, r"cross-encoder"),
])
def test_heads_that_cannot_be_judged_are_refused_in_one_line(config, n_out, match):
    with pytest.raises(ModelConfigError, match=match) as e:
        output_kind(config, n_out, where="ck/config.json")
    assert str(e.value).startswith("ck/config.json: ") and "\n" not in str(e.value)


def test_a_cross_encoder_that_says_regression_is_judged_as_one():
    cfg = {"sentence_transformers": {"version": "4.0"}, "problem_type": "regression"}
    assert output_kind(cfg, 1) == REGRESSION


# --- through the sweep: refused before anything is written ----------------------------------
from tests.models.head_fixtures import make_head_folder, model_toml, rows_jsonl  # noqa: E402
from variants.cli import main  # noqa: E402

TINY = ["--n-fit", "0", "--n-calibration", "40", "--n-eval", "40", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none", "--bits", "8",
        "--timing-batch-sizes", "1", "--no-progress"]


@pytest.mark.parametrize("problem_type, extra, match", [
    ("single_label_classification", None, "softmax over one logit"),
    (None, {"sentence_transformers": {"activation_fn": "torch.nn.Sigmoid"}}, "cross-encoder"),
])
def test_sweep_refuses_a_head_it_cannot_judge(tmp_path, capsys, problem_type, extra, match):
    ck = make_head_folder(tmp_path / "ck", 1, problem_type, extra=extra)
    results = tmp_path / "results"
    rc = main(["sweep", "--model-config", str(model_toml(tmp_path / "m.toml", ck)),
               "--data", str(rows_jsonl(tmp_path / "rows.jsonl")), "--results-dir",
               str(results), *TINY])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert match in err[0] and f"{ck}/config.json" in err[0]
    assert not results.exists()

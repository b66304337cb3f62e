"""The model TOML (variants.models.model_config): shipped files, one-line errors, and the CLI flags
--model-config / --model package.module:factory."""

import json
from pathlib import Path

import numpy as np
import pytest

from variants.cli import main
from variants.models.model_config import ModelConfigError, load_model_config

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "variants" / "models"
TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none", "--bits", "8",
        "--timing-batch-sizes", "1", "--no-progress"]
GOOD = ('name = "m"\nlogits = "linear-head"\noptions = ["a", "b", "c"]\nscores = [-1, 0, 1]\n'
        'actions = ["x", "y", "y"]\n')


def test_shipped_sentiment_toml_holds_the_bundled_constants():
    from variants.models import sentiment

    cfg = load_model_config(SHIPPED / "minilm-sentiment.toml")
    assert (cfg.name, cfg.logits, cfg.checkpoint) == ("minilm-sentiment", "linear-head", None)
    assert tuple(cfg.options) == sentiment.OPTIONS and tuple(cfg.scores) == sentiment.SCORES
    assert tuple(cfg.actions) == sentiment.OPTION_ACTION
    assert tuple(cfg.action_names) == sentiment.ACTIONS
    assert cfg.linear_head_C == sentiment.HEAD_C and cfg.temperature_mode == "fit"


def test_shipped_choice_toml_holds_the_bundled_tasks_in_order():
    from variants.models import choice
    from variants.datasets import bundled as data

    cfg = load_model_config(SHIPPED / "minilm-choice.toml")
    assert list(cfg.tasks) == list(choice.TASKS)  # the hash picks tasks by this order
    for k in (2, 3, 5):
        t = cfg.tasks[f"sentiment-{k}"]
        assert tuple(t["options"]) == choice.SENTIMENT_WORDING[k]
        assert tuple(t["scores"]) == choice.SENTIMENT_SCORES[k]
        assert tuple(t["actions"]) == choice.SENTIMENT_ACTIONS[k]
    d = cfg.tasks["domain-4"]
    assert d["options"] == [choice.DOMAIN_WORDING[x] for x in data.DOMAINS]
    assert d["actions"] == [choice.DOMAIN_ACTIONS[x] for x in data.DOMAINS] and d["scores"] is None
    assert cfg.cosine_scale == choice.COSINE_SCALE


@pytest.mark.parametrize("name", ["minilm-sentiment", "minilm-choice"])
def test_shipped_toml_makes_the_same_taskset_as_the_python_model(name):
    """Every field of the TaskSet (fingerprint) equals the one of the former Python models."""
    from variants.datasets import bundled as data
    from variants.models import choice, get_module, sentiment

    frame = data.sample(data.split_frame(data.load_vader(), "eval"), 80, seed=1)
    old = {"minilm-sentiment": sentiment, "minilm-choice": choice}[name].make_taskset(frame)
    new = get_module(name).make_taskset(frame)
    assert new.fingerprint() == old.fingerprint()
    assert len(set(new.task)) == (1 if name == "minilm-sentiment" else 4)


def test_relative_checkpoint_resolves_against_the_toml_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    f = tmp_path / "sub" / "m.toml"
    f.write_text(GOOD + 'checkpoint = "../ck"\n[temperature]\nmode = "fixed"\n'
                 'values = { "3" = 0.1, "2" = 2 }\n')
    cfg = load_model_config(f)
    assert cfg.checkpoint == (tmp_path / "ck").resolve()
    assert cfg.temperature_values == {3: 0.1, 2: 2.0}
    assert cfg.action_names == ["x", "y"]  # default: the actions used, in order
    assert json.loads(json.dumps(cfg.to_dict()))["temperature_values"] == {"3": 0.1, "2": 2.0}


@pytest.mark.parametrize("text, key, fix", [
    (GOOD + "optoins = 1\n", "'optoins'", "did you mean 'options'?"),
    (GOOD + "[linear_head]\nc = 1\n", "[linear_head] 'c'", "did you mean 'C'?"),
    (GOOD.replace("linear-head", "cosin"), "logits", "did you mean 'cosine'?"),
    (GOOD.replace('name = "m"\n', ""), "name", 'add name = "my-model"'),
    (GOOD.replace("[-1, 0, 1]", "[-1, 0]"), "scores", "give one per option"),
    (GOOD + 'action_names = ["x"]\n', "actions", "add it there"),
    (GOOD + '[temperature]\nmode = "fixed"\n', "[temperature] values", '"3" = 0.1'),
    (GOOD + '[temperature]\nmode = "fixed"\nvalues = { "3" = 0 }\n', "[temperature] values.3",
     "> 0"),
    (GOOD + '[temperature]\nmode = "fixed"\nvalues = { "x" = 1 }\n', "values.'x'", "option count"),
    (GOOD + 'prompt = "{txt}"\n', "prompt", "{text}"),
    (GOOD + "[cosine]\nscale = 5\n", "[cosine]", "drop the table"),
    (GOOD.replace("linear-head", "marker") + 'prompt = "{question}"\n', "prompt", "{options}"),
    (GOOD + 'factory = "nocolon"\n', "factory", "package.module:callable"),
    ('name = "m"\nlogits = "linear-head"\n', "options", "is needed"),
    ("name = = 1\n", "not valid TOML", "fix the syntax"),
])
def test_bad_toml_is_one_line_naming_file_key_and_fix(tmp_path, text, key, fix):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ModelConfigError) as e:
        load_model_config(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: ") and "\n" not in msg
    assert key in msg and fix in msg, msg


def test_missing_file_names_the_flag(tmp_path):
    with pytest.raises(ModelConfigError, match="check the path given to --model-config"):
        load_model_config(tmp_path / "none.toml")


@pytest.mark.parametrize("args, message", [
    (["--model-config", "BAD"], "did you mean 'options'?"),
    (["--model", "no_such_module_xyz:build"], "cannot import 'no_such_module_xyz'"),
    (["--model", "examples.own_model:nothing"], "has no callable 'nothing'"),
    (["--model-config", "GOOD", "--model", "minilm-choice"], "pass one of them"),
    (["--checkpoint", "/no/such/folder"], "--checkpoint '/no/such/folder': no such folder"),
    (["--data", "/no/such.jsonl"], "--data '/no/such.jsonl': no such file"),
])
def test_bad_model_flags_exit_2_one_line_nothing_written(tmp_path, capsys, monkeypatch, args,
                                                         message):
    monkeypatch.chdir(ROOT)  # examples.own_model importable as from the repository root
    bad, good = tmp_path / "bad.toml", tmp_path / "good.toml"
    bad.write_text(GOOD + "optoins = 1\n")
    good.write_text(GOOD)
    args = [{"BAD": str(bad), "GOOD": str(good)}.get(a, a) for a in args]
    assert main(["sweep", *args, "--results-dir", str(tmp_path / "r"), *TINY]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()


def test_factory_returning_no_decision_model_exits_2(tmp_path, capsys, monkeypatch):
    (tmp_path / "badfactory_mod.py").write_text("def build(ck):\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["sweep", "--model", "badfactory_mod:build", "--results-dir",
                 str(tmp_path / "r"), *TINY]) == 2
    err = capsys.readouterr().err
    assert "returned int, not a DecisionModel" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_own_factory_sweeps_through_the_cli(tmp_path, capsys, monkeypatch):
    """README's plug-in example through `variants sweep --model examples.own_model:build`:
    run.json records the factory, and its temperatures are a real fit of that model."""
    monkeypatch.chdir(ROOT)
    assert main(["sweep", "--model", "examples.own_model:build", "--results-dir",
                 str(tmp_path / "r"), *TINY]) == 0
    meta = json.loads((tmp_path / "r" / "own_model-build-quant-g64" / "run.json").read_text())
    assert meta["model"] == {"name": "own_model-build", "factory": "examples.own_model:build",
                             "config": None}
    assert meta["identity"]["model"] == "own_model-build" and meta["status"] == "complete"
    assert list(meta["temperatures"]) == ["3"] and meta["temperature_fits"]["3"]["n"] == 40
    assert np.isfinite(meta["temperatures"]["3"]) and meta["temperatures"]["3"] != 1.0


@pytest.mark.slow
def test_marker_toml_on_own_data_through_the_cli(tmp_path, capsys, monkeypatch):
    """examples/model-marker.toml on the example JSONL: run.json records the parsed TOML, the data file and its fingerprint,
    and they are part of the identity."""
    from variants.datasets import own as own_data

    data = ROOT / "examples" / "vader_raters.jsonl"
    monkeypatch.chdir(ROOT)
    assert main(["sweep", "--model-config", "examples/model-marker.toml", "--data", str(data),
                 "--results-dir", str(tmp_path / "r"), *TINY]) == 0
    meta = json.loads((tmp_path / "r" / "my-marker-quant-g64" / "run.json").read_text())
    fp = own_data.data_fingerprint(own_data.read_data(data))
    assert meta["data"]["file"] == {"path": str(data), "fingerprint": fp}
    ident = meta["identity"]
    assert ident["data_fingerprint"] == fp and ident["model_config"] == "examples/model-marker.toml"
    assert ident["model_config_parsed"]["config"]["logits"] == "marker"
    assert meta["model"]["config"]["marker_token"] == "[unused0]"
    assert {s: v["n"] for s, v in meta["data"]["splits"].items()} == {
        "fit": 40, "calibration": 40, "eval": 30}

"""Per-layer low-rank ratios (--ratio-map): parser, names, ranks by hand, errors, CLI exit 2."""

import pytest

from variants.layer_maps import ratio_map
from variants.families.lowrank.family import LowRankConfig, ladder, run_name
from variants.families.lowrank.factorise import break_even


def test_parse_canonical_and_names():
    assert ratio_map.parse("") == ()
    assert ratio_map.parse(r" layers\.0\.=1 , x{1,2}=0.25") == ((r"layers\.0\.", 1.0),
                                                               ("x{1,2}", 0.25))
    assert ratio_map.canonical(" value=0.50 ") == "value=0.5"
    a = LowRankConfig(ratio=0.5, ratio_map="value=0.9").name
    assert a == LowRankConfig(ratio=0.5, ratio_map=" value=0.90 ").name
    assert a.startswith("lr-whitened-p0.50-rmap-") and a != LowRankConfig(ratio=0.5).name
    assert [c.ratio_map for c in ladder(ratios=[0.5, 0.3], ratio_map="value=1")] == ["value=1"] * 4
    assert run_name(ratio_map="value=1").startswith("params-rmap-")


@pytest.mark.parametrize("spec, msg", [
    ("value", "is not PATTERN=RATIO"), ("value=0", "outside (0, 1]"),
    ("value=1.5", "outside (0, 1]"), ("value=x", "must be a number"),
    ("(=0.5", "not a valid regular expression"), ("a=0.5,a=0.6", "given twice")])
def test_bad_maps_name_the_flag(spec, msg):
    with pytest.raises(ValueError) as e:
        LowRankConfig(ratio_map=spec)
    assert str(e.value).startswith("--ratio-map ") and msg in str(e.value)
    assert "\n" not in str(e.value)


def test_map_needs_the_params_rule():
    with pytest.raises(ValueError, match="--rank-rule params"):
        LowRankConfig(rule="energy", ratio_map="value=0.9")


def test_resolve_first_match_wins_and_unmatched_pattern():
    paths = ["encoder.layers.0.attention.value", "encoder.layers.0.intermediate",
             "encoder.layers.1.intermediate"]
    got = ratio_map.resolve(r"layers\.0\.intermediate=1,intermediate=0.9", paths, 0.5)
    assert got == {paths[0]: 0.5, paths[1]: 1.0, paths[2]: 0.9}
    with pytest.raises(ValueError, match="matches no factorisable layer"):
        ratio_map.resolve("nowhere=0.5", paths, 0.5)


@pytest.fixture(scope="module")
def sentiment_model(checkpoint):
    from variants.models import sentiment

    return sentiment.build(checkpoint)  # head untrained: only the encoder's ranks are looked at


def test_per_layer_ranks_follow_the_map(sentiment_model):
    from variants.families.lowrank.build import factorize_module

    spec = r"layers\.0\.intermediate=1,intermediate=0.9"
    _, layers = factorize_module(sentiment_model.module,
                                 LowRankConfig(method="plain", ratio=0.5, ratio_map=spec))
    by = {r["path"]: r for r in layers}
    up0, up1 = by["encoder.layers.0.intermediate"], by["encoder.layers.1.intermediate"]
    assert up0["dense"] and up0["ratio"] == 1.0  # ratio 1 = the break-even rank: kept dense
    m, n = up1["shape"]
    assert up1["rank"] == int(0.9 * break_even(m, n) + 1e-9) and up1["ratio"] == 0.9
    v = by["encoder.layers.3.attention.value"]
    assert v["rank"] == int(0.5 * break_even(*v["shape"]) + 1e-9) and v["ratio"] == 0.5


# ---- the command line and the model TOML ----

TINY = ["--family", "lowrank", "--methods", "plain", "--ratios", "0.5", "--n-fit", "60",
        "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "2", "--timing-warmup", "0", "--cold-start", "none", "--no-progress"]


@pytest.mark.parametrize("extra, message", [
    (["--ratio-map", "nowhere=0.5"], "--ratio-map pattern 'nowhere' matches no factorisable"),
    (["--ratio-map", "value=2"], "--ratio-map entry 'value=2': ratio 2 is outside (0, 1]"),
    # (TINY's --ratios is refused first under --rank-rule rank: issue #39)
    (["--ratio-map", "value=0.5", "--rank-rule", "rank"], "read only with --rank-rule params")])
def test_cli_bad_ratio_maps_exit_2_and_write_nothing(tmp_path, capsys, extra, message):
    from variants.cli import main

    out = tmp_path / "r"
    assert main(["sweep", *TINY, *extra, "--results-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("variants: error: ") and err.count("\n") == 1
    assert not out.exists()


GOOD = ('name = "m"\nlogits = "linear-head"\noptions = ["a", "b", "c"]\nscores = [-1, 0, 1]\n'
        'actions = ["x", "y", "y"]\n')


def test_toml_ratio_map_is_the_default_and_the_flag_wins(tmp_path):
    from variants.models.model_config import ModelConfigError, load_model_config
    from variants.sweep.config import SweepConfig

    plain = tmp_path / "plain.toml"
    plain.write_text(GOOD)
    assert "lowrank_ratio_map" not in load_model_config(plain).to_dict()  # old cache keys kept
    f = tmp_path / "m.toml"
    f.write_text(GOOD + '[lowrank]\nratio_map = " value=0.90 "\n')
    assert load_model_config(f).lowrank_ratio_map == "value=0.9"
    kw = dict(model_config=str(f), timing_batch_sizes=(1,), family="lowrank")
    cfg = SweepConfig(params={"ratios": [0.5], "methods": ["plain"]}, **kw).validate()
    assert [v.ratio_map for v in cfg.variants] == ["value=0.9"]
    cfg = SweepConfig(params={"ratios": [0.5], "methods": ["plain"], "ratio_map": "query=1"},
                      **kw).validate()
    assert [v.ratio_map for v in cfg.variants] == ["query=1"]
    f.write_text(GOOD + '[lowrank]\nratio_map = "value=0"\n')
    with pytest.raises(ModelConfigError, match=r"m\.toml: \[lowrank\] ratio_map: entry "
                                                r"'value=0': ratio 0 is outside"):
        load_model_config(f)

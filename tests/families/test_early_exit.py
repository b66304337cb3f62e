"""Early-exit builder: a rule that never fires is the reference, the batch really
shrinks, B=1 matches the batch, thresholds come from the calibration split only, bad input."""

import mlx.core as mx
import numpy as np
import pytest
from sentiment_fit import fitted_sentiment, sentiment_splits
from mlx.utils import tree_flatten

from variants.datasets import bundled as data
from variants.families.exit import build as ee
from variants.families.exit import family as exit_family
from variants.families.exit import heads as exit_heads, rules as exit_rules
from variants.families.exit.family import ExitConfig
from variants.cli import main
from variants.models import choice, sentiment
from runs.outputs import DecisionOutputs, finish_outputs


@pytest.fixture(scope="module")
def splits():
    return sentiment_splits(80, 48, 16)


@pytest.fixture(scope="module")
def model(checkpoint, splits):
    return fitted_sentiment(checkpoint, splits)


@pytest.fixture(scope="module")
def built(model, splits, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    variant, info = ee.build(model, ExitConfig("entropy", target=0.95),
                             calibration=splits["calibration"], cache_dir=cache,
                             fit=splits["fit"])
    return variant, info, cache


@pytest.fixture(scope="module")
def batch(model, splits):
    return model.prepare(splits["eval"], batch_size=16)[0][0]


def _net(variant, rule, threshold):
    w = variant.module
    return ee.ExitNet(w.base, w.exit_heads, w._layers, rule, threshold)


@pytest.mark.parametrize("rule, threshold", [("entropy", 0.0), ("margin", 1.0),
                                             ("patience", 6)])
def test_rule_that_never_fires_reproduces_reference(model, built, batch, rule, threshold):
    net = _net(built[0], rule, threshold)  # entropy never < 0, margin never > 1, t > 5 heads
    out = np.array(net(batch.input_ids, batch.attention_mask, batch.token_type_ids))
    np.testing.assert_array_equal(out, np.array(model.forward(batch)))  # the reference's forward
    assert (net.last_exit_layer == 6).all() and net.heads_run == 0


@pytest.mark.parametrize("threshold", [0.0, 0.3])
def test_batch_shrinks_as_examples_exit(built, batch, threshold):
    net = _net(built[0], "margin", threshold)  # 0.0 fires for every row at the first head
    trace = []
    net.forward_trace(batch.input_ids, batch.attention_mask, batch.token_type_ids, trace=trace)
    el = net.last_exit_layer
    assert (el < 6).any()
    for i, shape in trace:  # layer i (0-based) sees exactly the rows that have not exited
        assert shape[0] == int((el > i).sum())
    assert len(trace) == min(6, int(el.max()))  # no layer runs once every row has exited
    assert trace[0][1][0] == 16


def test_batched_matches_single_examples(built, batch):
    net = built[0].module
    out = np.array(net(batch.input_ids, batch.attention_mask, batch.token_type_ids))
    layers = net.last_exit_layer.copy()
    for i in range(0, 16, 5):
        n = int(batch.attention_mask[i].sum().item())
        one = np.array(net(batch.input_ids[i:i + 1, :n], batch.attention_mask[i:i + 1, :n],
                           batch.token_type_ids[i:i + 1, :n]))
        np.testing.assert_allclose(one[0], out[i], rtol=1e-4, atol=1e-4)
        assert net.last_exit_layer[0] == layers[i]


def test_info_reports_cost_histogram_and_near_ties(built, splits):
    _, info, cache = built
    assert info["threshold_fitted_on"] == "calibration"
    assert info["calibration_agreement"] >= 0.95
    assert sum(info["exit_histogram"].values()) == len(splits["calibration"])
    assert info["ideal_speedup"] == pytest.approx(1 / info["expected_cost"])
    # the most one batch can gain: every row leaves at the earliest exit
    assert info["max_speedup"] == info["n_layers"] / min(info["exit_layers"])
    assert info["max_speedup"] >= info["ideal_speedup"]
    assert list((cache / "exit_heads").glob("*.npz"))  # heads cached


def _param_bytes(module):
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


def test_model_bytes_count_the_exit_heads(model, built):
    variant, info, _ = built
    heads = sum(_param_bytes(h) for h in variant.module.exit_heads)
    assert heads == 5 * (3 * 384 + 3) * 4 and info["exit_head_bytes"] == heads
    assert info["model_bytes"] == _param_bytes(variant.module) == _param_bytes(model.module) + heads


def test_model_bytes_count_the_exit_heads_quantized(model, built, splits):
    variant, info = ee.build(model, ExitConfig("entropy", target=0.95, bits=8), mode="native",
                             calibration=splits["calibration"], cache_dir=built[2],
                             fit=splits["fit"])
    heads = sum(_param_bytes(h) for h in variant.module.exit_heads)
    assert heads == info["exit_head_bytes"] > 0
    assert info["model_bytes"] == _param_bytes(variant.module) == \
        info["quant"]["model_bytes"] + heads


def test_thresholds_use_calibration_split_only(model, splits, tmp_path, monkeypatch):
    seen = []
    real_prepare = type(model).prepare

    def spy(self, taskset, batch_size=32):
        seen.append(taskset.fingerprint())
        return real_prepare(self, taskset, batch_size)

    monkeypatch.setattr(type(model), "prepare", spy)
    _, info = ee.build(model, ExitConfig("margin", target=0.9), calibration=splits["calibration"],
                       cache_dir=tmp_path, fit=splits["fit"])
    assert splits["eval"].fingerprint() not in seen
    assert set(seen) <= {splits["fit"].fingerprint(), splits["calibration"].fingerprint()}
    assert info["n_calibration"] == len(splits["calibration"])


def test_fit_threshold_picks_cheapest_meeting_target():
    rng = np.random.default_rng(0)
    final = rng.normal(size=(200, 3)) * 3
    ref = final.argmax(1)
    heads = [final + rng.normal(size=final.shape) * s for s in (3.0, 1.0)]
    t, agree, cost = ee.fit_threshold(heads, final, ref, "entropy", 0.95, (1, 2), 3)
    assert agree >= 0.95
    el, lg = ee.simulate(heads, final, "entropy", t, (1, 2), 3)
    assert el.mean() / 3 == pytest.approx(cost) and cost < 1
    assert ee.fit_threshold(heads, final, ref, "patience", 1.0, (1, 2), 3)[0] == 3.0  # never


def test_fit_threshold_out_of_reach_returns_closest():
    # A quantized base already disagrees with the reference: 10 of 200 final labels differ, so no
    # threshold reaches 0.99; the closest comes back: at least never-exit's 0.95, and among equal
    # agreements the cheapest.
    rng = np.random.default_rng(1)
    final = rng.normal(size=(200, 3)) * 3
    ref = final.argmax(1)
    ref[:10] = (ref[:10] + 1) % 3
    heads = [final + rng.normal(size=final.shape) * 3.0]
    t, agree, cost = ee.fit_threshold(heads, final, ref, "entropy", 0.99, (1,), 2)
    assert 0.95 <= agree < 0.99 and cost <= 1.0
    el, lg = ee.simulate(heads, final, "entropy", t, (1,), 2)
    assert (ee.predictions(lg) == ref).mean() == pytest.approx(agree)
    never = ee.fit_threshold(heads, final, ref, "entropy", 0.0, (1,), 2)  # any threshold meets 0
    assert never[2] <= cost + 1e-12  # the cheapest overall is at most as costly


def test_fixed_threshold_that_never_fires_on_calibration(model, splits, tmp_path):
    with pytest.raises(ValueError, match=r"exit_threshold=1e-09 \(entropy\) fires on none"):
        ee.build(model, ExitConfig("entropy", target=None, threshold=1e-9),
                 calibration=splits["calibration"], cache_dir=tmp_path, fit=splits["fit"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(rule="oracle"), "exit rule 'oracle' is not known"),
    (dict(target=1.5), r"--exit-targets 1.5 is outside \(0, 1\]"),
    (dict(target=None, threshold=0.0), r"--exit-thresholds 0.0 for rule entropy is outside"),
    (dict(rule="margin", target=None, threshold=1.0), "for rule margin is outside"),
    (dict(rule="patience", target=None, threshold=1), "must be an integer >= 2"),
    (dict(target=None), "give exactly one of --exit-targets"),
])
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ExitConfig(**kwargs)


def test_names_encode_parameters():
    names = [c.name for c in exit_family.ladder(exit_targets=[0.99], exit_bits=[None, 4])]
    assert names[:2] == ["exit-entropy-ag0.99", "exit-entropy-ag0.99-q4"]
    assert ExitConfig("patience", None, 3, exit_layers=(2, 4), label_mix=0.3).name == \
        "exit-patience-t3-h2.4-mix0.30"
    # today's names of the common values stay (existing result folders resume)
    assert [c.name for c in exit_family.ladder()] == [f"exit-{r}-ag{a}" for r in exit_rules.RULES
                                             for a in ("0.99", "0.97")]
    assert [c.name for c in exit_family.ladder(exit_rules=["margin"], exit_thresholds=[0.3, 1e-9])] == \
        ["exit-margin-t0.3", "exit-margin-t1e-09"]


def test_names_are_unique_and_faithful():
    # .3g used to name 0.1231 and 0.1234 both t0.123 (one variant silently dropped)
    cfgs = exit_family.ladder(exit_rules=["entropy"], exit_thresholds=[0.1231, 0.1234])
    assert [c.name for c in cfgs] == ["exit-entropy-t0.1231", "exit-entropy-t0.1234"]
    assert [c.threshold for c in cfgs] == [0.1231, 0.1234]
    cfgs = exit_family.ladder(exit_rules=["margin"], exit_targets=[0.9991, 0.9994], exit_label_mix=0.125)
    assert [c.name for c in cfgs] == ["exit-margin-ag0.9991-mix0.125",
                                      "exit-margin-ag0.9994-mix0.125"]
    for c in cfgs:  # the number in the name reads back as the value
        assert float(c.name.split("-ag")[1].split("-")[0]) == c.target
    assert ExitConfig(target=1 / 3).name == f"exit-entropy-ag{1 / 3!r}"
    # exact repeats are one variant
    assert len(exit_family.ladder(exit_rules=["entropy"], exit_thresholds=[0.3, 0.3])) == 1


def test_two_configs_with_one_name_are_refused():
    # the group size is not in the name without bits: two such configs would share a folder
    with pytest.raises(ValueError, match=r"share the name 'exit-entropy-ag0.99'.*"
                                         r"--exit-group-size \(64 vs 32\)"):
        exit_family.unique_by_name([ExitConfig(), ExitConfig(group_size=32)],
                          {"group_size": "--exit-group-size"})


@pytest.mark.parametrize("kwargs, message", [
    (dict(exit_rules=["patience"], exit_thresholds=[float("inf")]),
     "--exit-thresholds inf is not a finite number"),
    (dict(exit_rules=["entropy"], exit_thresholds=[float("nan")]),
     "--exit-thresholds nan is not a finite number"),
    (dict(exit_thresholds=[0.3], exit_targets=[0.9]), "pass one or the other"),
    (dict(exit_thresholds=[0.3]), r"patience is among the --exit-rules \(by default: entropy "
                                  r"margin patience\).* pass --exit-rules entropy margin"),
    (dict(exit_rules=["patience", "entropy"], exit_thresholds=[2]),
     r"for rule entropy is outside.*pass --exit-rules entropy for"),
])
def test_ladder_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        exit_family.ladder(**kwargs)


def test_ladder_targets_default_only_without_thresholds():
    assert [c.target for c in exit_family.ladder(exit_rules=["entropy"])] == list(exit_family.DEFAULT_TARGETS)
    cfgs = exit_family.ladder(exit_rules=["entropy"], exit_thresholds=[0.3])
    assert [(c.target, c.threshold) for c in cfgs] == [(None, 0.3)]


@pytest.mark.parametrize("args, message", [
    (["--exit-layers", "6"], "exit_layers [6] are outside [1, 6)"),
    (["--exit-rules", "patience", "--exit-thresholds", "9"], "exceeds the 5 exit heads"),
    (["--exit-thresholds", "0"], "--exit-thresholds 0.0 for rule entropy is outside (0, 1]"),
    (["--exit-rules", "margin", "--exit-thresholds", "1"], "for rule margin is outside [0, 1)"),
    (["--exit-rules", "patience", "--exit-layers", "2", "4", "--exit-thresholds", "3"],
     "exceeds the 2 exit heads"),
    (["--model", "minilm-choice", "--exit-layers", "3", "7"], "exit_layers [7] are outside"),
    (["--model", "minilm-choice", "--exit-rules", "patience", "--exit-thresholds", "6"],
     "exceeds the 5 exit heads"),
    (["--exit-targets", "1.2"], "--exit-targets 1.2 is outside (0, 1]"),
    (["--exit-rules", "patience", "--exit-thresholds", "inf"],
     "--exit-thresholds inf is not a finite number"),
    (["--exit-layers", "2", "--exit-rules", "patience", "--exit-thresholds", "2"],
     "rule patience needs at least 2 exit heads (t >= 2 consecutive heads must agree) but "
     "--exit-layers 2 gives 1; pass two or more, e.g. --exit-layers 1 2, or leave "
     "--exit-layers out for every layer 1..5"),
    (["--exit-rules", "entropy", "--exit-thresholds", "0.3", "--exit-targets", "0.9"],
     "--exit-targets and --exit-thresholds were both given: pass one or the other"),
    (["--exit-thresholds", "0.3"], "rule patience is among the --exit-rules (by default: "
                                   "entropy margin patience)"),
    (["--exit-thresholds", "0.3"], "pass --exit-rules entropy margin for τ thresholds"),
])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    code = main(["sweep", "--family", "exit", "--results-dir", str(tmp_path / "r"),
                 "--n-fit", "20", "--n-calibration", "20", "--n-eval", "20", "--no-progress",
                 "--timing-batch-sizes", "1", "16",
                 *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "r").exists()


# -- minilm-choice: cosine exit heads ------------------------------------------------------------

@pytest.fixture(scope="module")
def choice_splits():
    fr = data.load_vader()
    return {s: choice.make_taskset(data.sample(data.split_frame(fr, s), n, seed=1))
            for s, n in (("fit", 80), ("calibration", 60), ("eval", 20))}


@pytest.fixture(scope="module")
def choice_model(checkpoint, choice_splits):
    m = choice.build(checkpoint)
    m.calibrate(choice_splits["calibration"])
    return m


@pytest.fixture(scope="module")
def choice_built(choice_model, choice_splits, tmp_path_factory):
    cache = tmp_path_factory.mktemp("choice-cache")
    variant, info = ee.build(choice_model, ExitConfig("margin", target=0.9),
                             calibration=choice_splits["calibration"], cache_dir=cache,
                             fit=choice_splits["fit"])
    return variant, info, cache


@pytest.fixture(scope="module")
def choice_batch(choice_model, choice_splits):
    return choice_model.prepare(choice_splits["eval"], batch_size=20)[0][0]


def _choice_variant(choice_model, choice_built, rule, threshold):
    w = choice_built[0].module
    net = ee.ExitNet(w.base, w.exit_heads, w._layers, rule, threshold, kind="cosine",
                     temperatures=choice_model.temperatures)
    return choice_model.replace_module(net), net


def test_choice_cosine_scale_matches_model():
    assert exit_heads.COSINE_SCALE == choice.COSINE_SCALE


def test_choice_info_and_cache(choice_built, choice_splits):
    _, info, cache = choice_built
    assert info["head_kind"] == "cosine" and info["threshold_fitted_on"] == "calibration"
    assert info["calibration_agreement"] >= 0.9
    assert sum(info["exit_histogram"].values()) == len(choice_splits["calibration"])
    assert list(info["exit_histogram"]) == [1, 2, 3, 4, 5, 6]
    assert list((cache / "exit_heads").glob("minilm-choice-*.npz"))
    heads = choice_built[0].module.exit_heads
    assert len(heads) == 5 and heads[0].weight.shape == (384, 384)  # map into embedding space



def test_choice_model_bytes_count_the_cosine_heads(choice_model, choice_built):
    variant, info, _ = choice_built
    assert info["model_bytes"] == _param_bytes(variant.module) == \
        _param_bytes(choice_model.module) + 5 * (384 * 384 + 384) * 4  # 90,261,504 + 2,956,800


@pytest.mark.parametrize("rule, threshold", [("entropy", 0.0), ("margin", 1.0)])
def test_choice_never_firing_rule_reproduces_reference(choice_model, choice_built, choice_batch,
                                                       rule, threshold):
    variant, net = _choice_variant(choice_model, choice_built, rule, threshold)
    out = np.array(variant.forward(choice_batch))
    np.testing.assert_allclose(out, np.array(choice_model.forward(choice_batch)), rtol=0,
                               atol=1e-5)
    assert net.heads_run == 0 and (net.last_exit_layer == 6).all()


def test_choice_slow_path_never_exiting_matches_reference(choice_model, choice_built,
                                                          choice_batch):
    # a rule that could fire but does not (entropy below 1e-12): every head runs, the batch
    # stays whole, the final cosine logits equal the reference's to round-off
    variant, net = _choice_variant(choice_model, choice_built, "entropy", 1e-12)
    trace = []
    valid = choice_batch.option_index >= 0
    opts = variant._options()[mx.maximum(choice_batch.option_index, 0)]
    out = net.forward_trace(choice_batch.input_ids, choice_batch.attention_mask,
                            choice_batch.token_type_ids, trace, options=opts, option_valid=valid)
    np.testing.assert_allclose(np.array(out), np.array(choice_model.forward(choice_batch)),
                               rtol=1e-5, atol=1e-4)
    assert net.heads_run == 5 and [s[0] for _, s in trace] == [20] * 6


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_choice_batch_shrinks_and_matches_single_rows(choice_model, choice_built, choice_batch,
                                                      threshold):
    variant, net = _choice_variant(choice_model, choice_built, "margin", threshold)
    valid = choice_batch.option_index >= 0
    opts = variant._options()[mx.maximum(choice_batch.option_index, 0)]
    assert opts.shape == (20, 5, 384)
    trace = []
    out = np.array(net.forward_trace(choice_batch.input_ids, choice_batch.attention_mask,
                                     choice_batch.token_type_ids, trace, options=opts,
                                     option_valid=valid))
    el = net.last_exit_layer.copy()
    assert (el < 6).any()
    for i, shape in trace:
        assert shape[0] == int((el > i).sum())
    for i in range(0, 20, 7):
        n = int(choice_batch.attention_mask[i].sum().item())
        one = np.array(net.option_logits(choice_batch.input_ids[i:i + 1, :n],
                                         choice_batch.attention_mask[i:i + 1, :n],
                                         choice_batch.token_type_ids[i:i + 1, :n],
                                         opts[i:i + 1], valid[i:i + 1]))
        np.testing.assert_allclose(one[0], out[i], rtol=1e-4, atol=1e-4)
        assert net.last_exit_layer[0] == el[i]
    assert (out[~np.array(valid)] == 0).all()  # no logit for a missing option


def test_choice_outputs_record_exit_layer(choice_model, choice_built, choice_splits, tmp_path):
    variant, info, _ = choice_built
    ev = choice_splits["eval"]
    out = variant.outputs(ev)
    assert out.exit_layer.shape == (len(ev),) and out.exit_layer.dtype == np.int64
    assert set(out.exit_layer.tolist()) <= {1, 2, 3, 4, 5, 6}
    s = exit_rules.exit_summary(out.exit_layer, 6, choice_model.raw_logits(ev), ev.option_mask,
                                layers=info["exit_layers"])
    assert sum(s["exit_histogram"].values()) == len(ev)
    assert s["expected_cost"] == pytest.approx(out.exit_layer.mean() / 6)
    assert 0 <= s["n_near_tie"] <= len(ev)
    out.save(tmp_path / "o.npz")
    back = DecisionOutputs.load(tmp_path / "o.npz")
    np.testing.assert_array_equal(back.exit_layer, out.exit_layer)
    assert back.subset(np.arange(3)).exit_layer.shape == (3,)
    ref = choice_model.outputs(ev)
    assert ref.exit_layer is None and choice_model.last_exit_layer is None
    ref.save(tmp_path / "ref.npz")  # an old-style file (no exit_layer) still loads
    assert "exit_layer" not in np.load(tmp_path / "ref.npz").files
    assert DecisionOutputs.load(tmp_path / "ref.npz").exit_layer is None
    assert ref.subset(np.arange(2)).exit_layer is None


def test_choice_thresholds_use_calibration_split_only(choice_model, choice_splits, tmp_path,
                                                      monkeypatch):
    seen = []
    real_prepare = type(choice_model).prepare

    def spy(self, taskset, batch_size=32):
        seen.append(taskset.fingerprint())
        return real_prepare(self, taskset, batch_size)

    monkeypatch.setattr(type(choice_model), "prepare", spy)
    _, info = ee.build(choice_model, ExitConfig("entropy", target=0.95, exit_layers=(2, 4)),
                       calibration=choice_splits["calibration"], cache_dir=tmp_path,
                       fit=choice_splits["fit"])
    assert choice_splits["eval"].fingerprint() not in seen
    assert set(seen) <= {choice_splits["fit"].fingerprint(),
                         choice_splits["calibration"].fingerprint()}
    assert info["n_calibration"] == len(choice_splits["calibration"])
    assert sum(info["exit_histogram"].values()) == len(choice_splits["calibration"])


def test_cosine_head_distillation_lowers_kl():
    rng = np.random.default_rng(0)
    n, D, K = 150, 32, 4
    X = rng.normal(size=(n, D))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    E = X @ rng.normal(size=(D, D)) * 0.05 + rng.normal(size=(n, D)) * 0.3
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    U = rng.normal(size=(6, D))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    O = U[rng.integers(0, 6, size=(n, K))]
    M = np.ones((n, K), bool)
    M[:40, 2:] = False
    T = np.where(np.arange(n) < 40, 0.8, 1.5)
    soft = exit_rules.masked_probs(20 * np.einsum("nd,nkd->nk", E, O), M, T)

    def kl(head):
        q = exit_rules.masked_probs(exit_heads.head_logits("cosine", head, X, O, M), M, T)
        return float((soft * (np.log(np.clip(soft, 1e-30, 1)) - np.log(np.clip(q, 1e-30, 1))))
                     .sum(1).mean())

    start = exit_heads.ridge_map(X, E)
    head = exit_heads.fit_cosine_head(X, E, O, M, T, soft)
    assert head[0].shape == (D, D) and head[1].shape == (D,)
    assert kl(head) < 0.5 * kl(start)


# -- rules, statistics, validation -------------------------------------------------------------

def test_masked_rule_statistics():
    lg = np.array([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0], [-3.0, -4.0, 0.0]])
    mask = np.array([[True, True, True], [True, True, False], [True, True, False]])
    h = exit_rules.rule_statistic(lg, "entropy", mask)
    assert h[1] == pytest.approx(1.0)  # a 2-way tie over valid options: maximal entropy
    m = exit_rules.rule_statistic(lg, "margin", mask, temperature=np.ones(3))
    assert m[2] == pytest.approx(1 / (1 + np.e) * (np.e - 1))  # padding 0 is not an option
    assert exit_rules.predictions(lg, mask)[2] == 0


@pytest.mark.parametrize("rule, threshold, never", [
    ("entropy", 0.0, True), ("entropy", 1e-9, False), ("margin", 1.0, True),
    ("margin", 0.99, False), ("patience", 6, True), ("patience", 5, False)])
def test_never_fires(rule, threshold, never):
    assert exit_rules.never_fires(rule, threshold, 5) is never


def test_exit_summary_counts_and_near_ties():
    el = np.array([1, 6, 6, 3, 6, 2])
    ref = np.array([[5.0, 0.0], [0.2, 0.0], [0.1, 0.5], [4.0, 0.0], [0.0, 0.3], [0.0, 9.0]])
    s = exit_rules.exit_summary(el, 6, ref, near_tie_margin=1.0)
    assert s["exit_histogram"] == {1: 1, 2: 1, 3: 1, 4: 0, 5: 0, 6: 3}
    assert sum(s["exit_histogram"].values()) == len(el)
    assert s["expected_cost"] == pytest.approx(el.mean() / 6)
    assert s["n_near_tie"] == 3 and s["near_tie_mean_exit_layer"] == 6.0
    assert s["other_mean_exit_layer"] == pytest.approx(2.0) and s["near_tie_ran_all_share"] == 1
    assert any("near ties" in line for line in exit_rules.summary_lines(s, "eval"))


def test_model_without_per_layer_access_is_refused(model, splits):
    class Flat:
        pass

    with pytest.raises(ValueError, match=r"--model minilm-sentiment: its encoder Flat has no "
                                         r"per-layer access"):
        ee.check_model(Flat(), [ExitConfig()], model="minilm-sentiment")
    flat = model.replace_module(sentiment.SentimentNet.__new__(sentiment.SentimentNet))
    import mlx.nn as nn
    nn.Module.__init__(flat.module)
    with pytest.raises(ValueError, match="--model minilm-sentiment: .* no per-layer access"):
        ee.build(flat, ExitConfig(), calibration=splits["calibration"])


def test_describe_lists_calibration_and_eval_exits(built):
    _, info, _ = built
    ev = exit_rules.exit_summary(np.array([6, 1, 2]), 6, np.array([[0.0, 0.1], [3, 0], [0, 5]]))
    text = exit_family.describe(info, None, eval_summary=ev)
    assert "calibration: agreement" in text and "eval exit histogram L1: 1, L2: 1" in text
    assert "eval near ties" in text


def test_run_report_and_plot_read_eval_exit_layer(tmp_path):
    import json

    import pandas as pd

    from runs import plots

    run = tmp_path / "run"
    (run / "reference").mkdir(parents=True)
    (run / "v").mkdir()
    (run / "run.json").write_text(json.dumps({"config": {"near_tie_margin": 1.0}}))
    pd.DataFrame({"variant": ["v"], "family": ["exit"], "verdict": ["PASS"]}).to_csv(
        run / "summary.csv", index=False)
    logits = np.array([[5.0, 0.0], [0.2, 0.0], [0.1, 0.5], [4.0, 0.0]], np.float32)
    # complete outputs files (the plots' reader validates every DecisionOutputs field)
    common = dict(option_mask=np.ones((4, 2), bool), temperature=np.ones(4),
                  option_scores=np.full((4, 2), np.nan), action_map=np.eye(2)[None].repeat(4, 0),
                  ids=[f"e{i}" for i in range(4)], task=["t"] * 4, labels=[0, 0, 1, 0],
                  human_dist=np.full((4, 2), np.nan))
    finish_outputs(logits, **common).save(run / "reference" / "outputs.npz")
    finish_outputs(logits, **common, exit_layer=[1, 6, 6, 2]).save(run / "v" / "outputs.npz")
    (run / "v" / "build.json").write_text(json.dumps({"n_layers": 6, "exit_layers": [1, 2, 3]}))
    s = plots.exit_summaries(plots.load_run(run))["v"]
    assert s["exit_histogram"] == {1: 1, 2: 1, 3: 0, 6: 2} and s["n_near_tie"] == 2
    md = plots.exit_markdown(run)
    assert "| v | 1/1/0/2 | 0.625 | 1.60× | 50% | 2 | 6.00 / 1.50 | 100% / 0% |" in md
    fig = plots.FAMILY_PLOTS["exit"](plots.load_run(run))
    assert fig is not None
    (run / "plots").mkdir()
    png = run / "plots" / "family_exit.png"
    png.write_bytes(b"")
    assert "Early exit on the eval split" in plots.plots_markdown([png], run)

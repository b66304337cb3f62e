"""The composed family: recipes (text <-> dict, refusals), the fixed build order against the
families' builders by hand, token pruning inside the exit loop, the latency model by hand and
the latency walk's order and skips on a synthetic oracle."""

import numpy as np
import pytest
from sentiment_fit import fitted_sentiment, sentiment_splits

from variants.families.composed import recipe
from variants.families.family import BuildInputs


@pytest.mark.parametrize("text, config", [
    ("w8a8", {"w8a8": {"smooth": False}}),
    ("prune:2:0.5+w8a8:sq", {"w8a8": {"smooth": True},
                             "prune": {"after_layer": 2, "keep_ratio": 0.5}}),
    ("exit:entropy:0.99+emb:8:32+w8a8+prune:1:0.7",
     {"w8a8": {"smooth": False}, "embeddings": {"bits": 8, "group_size": 32},
      "prune": {"after_layer": 1, "keep_ratio": 0.7}, "exit": {"rule": "entropy", "target": 0.99}}),
    ("lowrank:0.5:plain+q:4", {"lowrank": {"ratio": 0.5, "method": "plain"},
                               "quant": {"bits": 4}}),
])
def test_recipe_text_and_dict_round_trip(text, config):
    got = recipe.parse(text)
    assert got == config and list(got) == [k for k in recipe.ORDER if k in config]
    assert recipe.parse(recipe.recipe_of(got)) == got


def test_recipe_numbers_are_never_rounded():
    a, b = recipe.parse("prune:2:0.7000001"), recipe.parse("prune:2:0.7")
    assert recipe.recipe_of(a) == "prune:2:0.7000001" and recipe.name_of(a) != recipe.name_of(b)
    from variants.families.composed.family import ComposedConfig

    assert ComposedConfig("lowrank:0.9999999").recipe == "lowrank:0.9999999"
    assert recipe.parse(recipe.recipe_of(recipe.parse("exit:entropy:0.9999999"))) == \
        {"exit": {"rule": "entropy", "target": 0.9999999}}


def test_recipe_names_follow_the_build_order():
    assert recipe.name_of(recipe.parse("exit:margin:0.99+prune:2:0.5+w8a8:sq+emb:8")) == \
        "w8a8-sq+emb8+prune-a2-r0.5+exit-margin-ag0.99"


@pytest.mark.parametrize("text, message", [
    ("", "the recipe is empty"),
    ("w8a8+int4", "'int4' is not a piece"),
    ("w8a8+w8a8", "'w8a8' is given twice"),
    ("q:8+w8a8", "quant and w8a8 do not combine"),
    ("lowrank:0.5+w8a8", "lowrank and w8a8 do not combine"),
    ("prune:0:0.5", "needs a layer >= 1"),
    ("prune:2:1.5", "keep ratio in (0, 1]"),
    ("prune:2", "is not prune:AFTER_LAYER:KEEP_RATIO"),
    ("exit:patience:2", "RULE one of"),
    ("exit:entropy:nan", "where a finite number goes"),
    ("emb:7", "emb:BITS[:GROUP]"),
    ("w8a8:fast", "is not w8a8 or w8a8:sq"),
])
def test_bad_recipes_are_one_line_naming_compose(text, message):
    with pytest.raises(ValueError) as e:
        recipe.parse(text)
    assert message in str(e.value) and "--compose" in str(e.value)
    assert len(str(e.value).splitlines()) == 1


# ---- the build against the builders by hand ----

@pytest.fixture(scope="module")
def splits():
    return sentiment_splits(80, 40, 24)


@pytest.fixture(scope="module")
def model(checkpoint, splits):
    return fitted_sentiment(checkpoint, splits)


def _logits(m, ts):
    return np.array(m.raw_logits(ts))


def test_w8a8_emb_prune_is_the_builders_by_hand(model, splits):
    import mlx.nn as nn

    from variants.families.composed.build import build, summary
    from variants.families.prune import build as prune
    from variants.families.prune.family import PruneConfig
    from variants.families.w8a8 import build as w8a8
    from variants.families.w8a8.family import W8A8Config

    cal = splits["calibration"]
    config = recipe.parse("w8a8+emb:8+prune:3:0.5")
    got, infos = build(model, config, BuildInputs(calibration=cal), mode="native")
    assert [n for n, _ in infos] == ["w8a8", "embeddings", "prune"]
    v1, i1 = w8a8.build(model, W8A8Config(), mode="native")
    module = v1.module
    tables = [p for p, m in module.named_modules() if isinstance(m, nn.Embedding)]
    nn.quantize(module, group_size=64, bits=8, class_predicate=lambda p, m: p in tables)
    v2, _ = prune.build(v1.replace_module(module), PruneConfig(after_layer=3, keep_ratio=0.5),
                        calibration=cal)
    np.testing.assert_array_equal(_logits(got, splits["eval"]), _logits(v2, splits["eval"]))
    # bytes: W8A8's stored encoder minus what 8-bit tables (codes + fp32 scale and bias per
    # 64 values) save on the fp32 tables
    emb = infos[1][1]
    assert sorted(emb["tables"]) == sorted(tables)
    dims = [dict(model.module.named_modules())[p].weight.shape for p in tables]
    saved = sum(r * c * 4 - (r * c + 2 * 4 * r * c // 64) for r, c in dims)
    s = summary(infos)
    assert emb["saved_bytes"] == saved
    assert s["model_bytes"] == i1["model_bytes"] - saved
    assert s["int8_share"] == i1["int8_share"] == 1.0
    from variants.search.composed import costs
    from variants.search.costs import CostTable
    from variants.search.sensitivity import quantizable_layers

    linears = [p for p in quantizable_layers(model.module) if "embeddings" not in p]
    c = costs(CostTable(model.module, linears, (8,), 64), s)
    # bits per encoder Linear weight: int8 codes + fp32 scale + int32 column sum per channel
    assert c["bits"] == pytest.approx(8 * sum(o * (i + 8) for o, i in (
        dict(model.module.named_modules())[p].weight.shape for p in linears)) / sum(
        dict(model.module.named_modules())[p].weight.size for p in linears), rel=1e-3)


def test_exit_with_pruning_inside_equals_pruning_when_no_head_fires(model, splits, tmp_path):
    """Exit heads that never fire (threshold 1e-9 on normalised entropy): the exit net with
    pruning inside is the pruned net, bit for bit; with heads that fire, rows leave and the
    kept tokens shrink."""
    from variants.families.exit import build as early_exit
    from variants.families.exit.family import ExitConfig
    import mlx.core as mx

    from variants.families.prune.build import PrunedNet, protected_ids

    cal, fit, ev = splits["calibration"], splits["fit"], splits["eval"]
    ids = protected_ids(model.tokenizer)
    pruned = model.replace_module(PrunedNet(model.module, ((2, 0.5),), protected_ids=ids))
    prune = {"points": [[2, 0.5]], "score": "received", "protected_ids": list(ids)}
    from variants.families.exit.net import ExitNet

    fires, _ = early_exit.build(model, ExitConfig("entropy", target=0.9), calibration=cal,
                                fit=fit, cache_dir=tmp_path)
    f = fires.module  # the same heads, a threshold no normalised entropy is below
    never = model.replace_module(ExitNet(f.base, f.exit_heads, f._layers, "entropy", 1e-30,
                                         prune=prune))
    np.testing.assert_array_equal(_logits(never, ev), _logits(pruned, ev))
    fires.module.set_prune(prune)
    batches, _ = fires.prepare(ev, 24)
    b = batches[0]
    trace = []
    fires.module.forward_trace(*(mx.array(a) for a in (b.input_ids, b.attention_mask,
                                                        b.token_type_ids)), trace=trace)
    shapes = [s for _, s in trace]
    assert shapes[2][1] < shapes[1][1]  # tokens pruned after (1-based) layer 2
    assert (fires.module.last_exit_layer < 6).any()  # some rows exited


# ---- the latency model and the walk ----

def test_latency_model_prediction_by_hand():
    from variants.search.latency_model import predict

    m = {"forward_ms": 100.0, "gemm_fp32_ms": 80.0, "gemm_int8_ms": 40.0, "n_layers": 6,  # g 0.5
         "gemm_share": 0.7, "rest_layer_share": 0.2}
    # t = 0.1 + d (0.7 g + 0.2)
    assert predict(m, {"w8a8": {}}) == pytest.approx(1 / (0.1 + 0.35 + 0.2))
    d = (2 + 4 * 0.5) / 6
    assert predict(m, {"w8a8": {}, "prune": {"after_layer": 2, "keep_ratio": 0.5}}) == \
        pytest.approx(1 / (0.1 + d * 0.55))
    built = {"prune_work_ratio": 0.6, "exit_expected_cost": 0.5}
    assert predict(m, {"prune": {"after_layer": 2, "keep_ratio": 0.5}, "exit": {}}, built) == \
        pytest.approx(1 / (0.1 + 0.3 * 0.9))
    no_profile = dict(m, gemm_share=None, rest_layer_share=None)  # p_g 0.8, p_r 0.8 x 0.2
    assert predict(no_profile, {"w8a8": {}}) == pytest.approx(1 / (0.04 + 0.4 + 0.16))
    # the two whole forwards give g: 60 / 100 = 0.1 + 0.2 + 0.7 g -> g = 3 / 7
    measured = dict(m, w8a8_forward_ms=60.0)
    assert predict(measured, {"w8a8": {}}) == pytest.approx(100 / 60)


def test_latency_walk_order_and_skips():
    """The walk on a synthetic oracle: bases by predicted time then bytes, the first passing
    base kept, each piece from its mildest setting, settings at least as aggressive as a failed
    one skipped, then both pieces together."""
    from types import SimpleNamespace

    from variants.search.driver import SearchOptions
    from variants.search.latency_walk import LatencySearch

    s = LatencySearch.__new__(LatencySearch)
    s.opts = SearchOptions(cost="latency-b32", max_candidates=60, batch=1)
    s.log = lambda m: None
    s._model = {"forward_ms": 100.0, "gemm_fp32_ms": 80.0, "gemm_int8_ms": 40.0, "n_layers": 6,
                "gemm_share": 0.7, "rest_layer_share": 0.2, "batch_size": 32, "seq_len": 40}
    s.latency_path = "-"
    s.state = {"reference": SimpleNamespace(module=None)}
    seen = []

    def passes(c):  # emb at group 64 fails; pruning only keeping >= 0.7 after layer >= 3
        if c.get("embeddings", {}) == {"bits": 8}:
            return False
        p = c.get("prune")
        return p is None or (p["keep_ratio"] >= 0.7 and p["after_layer"] >= 3)

    def evaluate_configs(configs, step):
        seen.extend(recipe.recipe_of(c) for c in configs)
        return [{"config": c, "passed": passes(c), "name": recipe.name_of(c)} for c in configs]

    s.evaluate_configs = evaluate_configs
    recs = s.walk()
    # equal predicted time: the smaller first (8-bit tables at group 64 fail here)
    assert seen[:3] == ["w8a8+emb:8", "w8a8:sq+emb:8", "w8a8+emb:8:32"]  # the third: the base
    prune = [r for r in seen if "prune" in r]
    assert prune[0] == "w8a8+emb:8:32+prune:4:0.9"  # the mildest first
    # prune:1:0.9 fails: prune:1:0.7 and 1:0.5 are never tried; prune:4:0.5 fails: nor 3:0.5
    assert "w8a8+emb:8:32+prune:1:0.9" in prune and "w8a8+emb:8:32+prune:4:0.5" in prune
    assert not {"w8a8+emb:8:32+prune:1:0.7", "w8a8+emb:8:32+prune:1:0.5",
                "w8a8+emb:8:32+prune:3:0.5"} & set(prune)
    assert seen[-1] == "w8a8+emb:8:32+prune:3:0.7+exit:entropy:0.99"  # both pieces
    assert len(recs) == len(seen)


def test_exact_piece_outputs_the_rest_of_the_recipe(model, splits):
    """``exact:cache:N`` around W8A8: rows are computed once (a repeated row is a hit), and the
    outputs are the W8A8 variant's, row for row."""
    from variants.families.composed.build import build

    cfg = recipe.parse("w8a8+exact:cache:64")
    got, infos = build(model, cfg, BuildInputs(), mode="native")
    plain, _ = build(model, recipe.parse("w8a8"), BuildInputs(), mode="native")
    assert [n for n, _ in infos] == ["w8a8", "exact"]
    ev = splits["eval"]
    twice = ev.subset(np.concatenate([np.arange(len(ev)), np.arange(len(ev))]))
    np.testing.assert_array_equal(_logits(got, ev), _logits(plain, ev))
    hits, stores = got.exact_cache.hits, got.exact_cache.stores
    np.testing.assert_array_equal(_logits(got, twice)[len(ev):], _logits(plain, ev))
    # each row twice in the call: de-duplicated to the 24 distinct, every one a cache hit
    assert got.exact_cache.hits - hits == len(ev) and got.exact_cache.stores == stores


def test_workload_price_by_hand():
    from variants.search.workload_price import price, unique_rate

    texts = ["a", "b", "a", "c", "a", "b", "d", "e"]  # 5 distinct of 8
    assert unique_rate(texts) == (8, 5, 0.625)
    w = price(texts, 2.0)
    assert w["speedup_with_cache"] == pytest.approx(2.0 / 0.625)  # hits free: S / u
    w = price(texts, 2.0, epsilon=0.1)  # 1 / (0.625 / 2 + 0.375 x 0.1)
    assert w["speedup_with_cache"] == pytest.approx(1 / (0.3125 + 0.0375))
    assert price(["x", "y"], 2.0)["speedup_with_cache"] == 2.0  # no repeats: S as it is
    assert price(texts, None) is None


def test_the_latency_walk_never_builds_a_candidate_over_budget(monkeypatch):
    """``--budget`` (ms): candidates predicted over it are recorded as failing, not built."""
    from types import SimpleNamespace

    from variants.search.driver import SearchOptions
    from variants.search.latency_walk import LatencySearch
    from variants.search.optuna_search import OptunaSearch

    s = LatencySearch.__new__(LatencySearch)
    s.opts = SearchOptions(cost="latency-b32", max_candidates=60, batch=1, budget=50.0)
    s.log = lambda m: None
    s._build = None
    s._model = {"forward_ms": 100.0, "gemm_fp32_ms": 80.0, "gemm_int8_ms": 40.0, "n_layers": 6,
                "gemm_share": 0.7, "rest_layer_share": 0.2, "batch_size": 32, "seq_len": 40}
    s.costs = None
    s.state = {"reference": SimpleNamespace(module=None),
               "parts": {"search-eval": list(range(10))}}
    built = []
    monkeypatch.setattr(OptunaSearch, "evaluate_configs", lambda self, cfgs, step: [
        built.append(c) or {"config": c, "passed": True} for c in cfgs])
    w8 = {"w8a8": {"smooth": False}}  # predicted 100 / (0.1 + 0.35 + 0.2) = 65 ms: over
    fast = {**w8, "prune": {"after_layer": 1, "keep_ratio": 0.5}}  # 100 x (0.1 + 0.583 x
    # 0.55) = 42 ms: under
    recs = s.evaluate_configs([w8, fast], 1)
    assert built == [fast]
    assert recs[0]["failed"] == ["over --budget"] and recs[0]["cost"] == pytest.approx(65.0)
    assert recs[1]["passed"]

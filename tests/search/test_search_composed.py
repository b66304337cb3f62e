"""variants search across families: a composed candidate is the families' builders chained by
hand, its costs by hand, the Optuna study (deterministic for a seed, valid configs only,
resumable) and the flag combinations it refuses (exit 2, one line, nothing written)."""

import json

import numpy as np
import pytest
from sentiment_fit import fitted_sentiment, sentiment_splits

from variants.families.family import BuildInputs
from variants.models import sentiment
from variants.search import composed

pytest.importorskip("optuna")

# ---- a composed candidate is the families built by hand, in order ----


@pytest.fixture(scope="module")
def splits():
    return sentiment_splits(80, 40, 16)


@pytest.fixture(scope="module")
def model(checkpoint, splits):
    return fitted_sentiment(checkpoint, splits)


def _logits(m, ts):
    return np.array(m.raw_logits(ts))


def test_lowrank_prune_quant_is_the_builders_by_hand(model, splits):
    from variants.families.lowrank import build as lowrank
    from variants.families.prune import build as prune
    from variants.families.lowrank.family import LowRankConfig
    from variants.families.prune.family import PruneConfig

    cal = splits["calibration"]
    config = {"lowrank": {"ratio": 0.5, "method": "plain"},
              "prune": {"keep_ratio": 0.5, "after_layer": 2}, "quant": {"bits": 4}}
    got, infos = composed.build(model, config, BuildInputs(calibration=cal))
    assert [n for n, _ in infos] == ["lowrank", "prune"]
    v1, i1 = lowrank.build(model, LowRankConfig(method="plain", ratio=0.5, bits=4),
                           calibration=cal)
    v2, i2 = prune.build(v1, PruneConfig(after_layer=2, keep_ratio=0.5), calibration=cal)
    np.testing.assert_array_equal(_logits(got, splits["eval"]), _logits(v2, splits["eval"]))
    assert not np.allclose(_logits(got, splits["eval"]), _logits(model, splits["eval"]), atol=1e-3)
    s = composed.summary(infos)
    # bytes: the low-rank build's quantized factors (every factor quantized: ranks are whole
    # groups); flops ratio: sum k(m+n) / sum mn
    assert s["model_bytes"] == i1["model_bytes"] == i1["quant"]["model_bytes"]
    assert all(r["dense"] or r["rank"] % 64 == 0 for r in i1["layers"])
    assert not [p for p, _ in i1["quant"]["skipped"] if p.startswith("encoder.layers.")]
    rows = i1["layers"]
    ratio = sum(r["shape"][0] * r["shape"][1] if r["dense"] else
                r["rank"] * (r["shape"][0] + r["shape"][1]) for r in rows) / \
        sum(r["shape"][0] * r["shape"][1] for r in rows)
    assert s["linear_flop_ratio"] == pytest.approx(ratio, rel=1e-12) and ratio < 0.6
    assert s["prune_work_ratio"] == i2["calibration_work_ratio"] and s["exit_expected_cost"] == 1


def test_lowrank_exit_quant_is_the_builders_by_hand(model, splits, tmp_path):
    from variants.families.exit import build as early_exit
    from variants.families.lowrank import build as lowrank
    from variants.families.exit.family import ExitConfig
    from variants.families.lowrank.family import LowRankConfig

    cal, fit = splits["calibration"], splits["fit"]
    config = {"lowrank": {"ratio": 0.7, "method": "plain"},
              "exit": {"target": 0.95, "rule": "entropy"}, "quant": {"bits": 8}}
    got, infos = composed.build(model, config, BuildInputs(calibration=cal, fit=fit,
                                                           cache_dir=tmp_path))
    v1, i1 = lowrank.build(model, LowRankConfig(method="plain", ratio=0.7, bits=8),
                           calibration=cal)
    v2, i2 = early_exit.build(v1, ExitConfig("entropy", target=0.95), calibration=cal,
                              fit=fit, cache_dir=tmp_path)
    np.testing.assert_array_equal(_logits(got, splits["eval"]), _logits(v2, splits["eval"]))
    s = composed.summary(infos)
    # the quantized factors as stored natively + the fp32 exit heads
    assert s["model_bytes"] == i1["quant"]["model_bytes"] + i2["exit_head_bytes"]
    assert i2["exit_head_bytes"] > 0
    assert s["exit_expected_cost"] == i2["expected_cost"] <= 1


def test_prune_and_exit_compose_the_exit_net_prunes_inside(model, splits, tmp_path):
    cal, fit = splits["calibration"], splits["fit"]
    config = {"prune": {"keep_ratio": 0.5, "after_layer": 2}, "exit": {"target": 0.95}}
    got, infos = composed.build(model, config, BuildInputs(calibration=cal, fit=fit,
                                                           cache_dir=tmp_path))
    assert [n for n, _ in infos] == ["exit"]
    net = got.module
    assert net._prune["points"] == [[2, 0.5]]
    s = composed.summary(infos)
    assert s["prune_work_ratio"] == pytest.approx((2 + 4 * 0.5) / 6)


# ---- costs by hand ----

def test_composed_costs_by_hand(checkpoint):
    from variants.families.quant.family import QuantConfig
    from variants.families.quant.build import quantize_module
    from variants.search.costs import CostTable
    from variants.search.sensitivity import quantizable_layers

    module = sentiment.build(checkpoint).module
    layers = quantizable_layers(module)
    table = CostTable(module, layers, (4, 8), 64)
    weights = 6 * (4 * 384 * 384 + 2 * 384 * 1536)  # MiniLM-L6: 6 x (q k v o + up + down)
    dense_flops = 2.0 * weights
    fixed = table.total_bytes - 4 * weights  # fp32 encoder Linear weights are what changes
    c = composed.costs(table, {"model_bytes": 10_000_000, "linear_flop_ratio": 0.5,
                               "prune_work_ratio": 0.8, "exit_expected_cost": 0.6})
    assert c["bytes"] == 10_000_000
    assert c["bits"] == pytest.approx(8 * (10_000_000 - fixed) / weights, rel=1e-12)
    assert c["flops"] == pytest.approx(dense_flops * 0.5 * 0.8 * 0.6, rel=1e-12)
    # quant alone: the same numbers as the per-layer CostTable (build.json's)
    _, info = quantize_module(module, QuantConfig(bits=4), mode="native")
    q = composed.costs(table, composed.summary([("quant", info)]))
    lb = {p: 4 for p in layers}
    assert q["bytes"] == table.model_bytes(lb) == info["model_bytes"]
    assert q["bits"] == pytest.approx(table.bits_per_weight(lb), rel=1e-12) == \
        pytest.approx(5.0)
    assert q["flops"] == table.flops(lb) == dense_flops


# ---- the Optuna study: deterministic, valid configs, a known oracle ----

class _Layers:
    def __init__(self, n):
        self.encoder = type("E", (), {"layers": list(range(n))})()


def _study(seed, oracle, families=("quant", "lowrank", "prune"), n=14, batch=1, store=None):
    """OptunaSearch.walk on a synthetic oracle (no model): passes per ``oracle(config)``, cost
    = a flops-like product. ``store``: {id: record} shared across runs (resume)."""
    from types import SimpleNamespace

    from variants.search.driver import SearchOptions
    from variants.search.optuna_search import OptunaSearch

    s = OptunaSearch.__new__(OptunaSearch)
    s.opts = SearchOptions(strategy="optuna", families=tuple(families), seed=seed,
                           max_candidates=n, bits=(4, 6, 8), batch=batch, cost="flops")
    s.log = lambda m: None
    s.state = {"reference": SimpleNamespace(module=_Layers(6))}
    store = {} if store is None else store
    evaluated = []

    def evaluate_configs(configs, step):
        out = []
        for cfg in configs:
            cid = composed.composed_id(cfg)
            if cid in store:
                out.append(dict(store[cid], reused=True))
                continue
            evaluated.append(cfg)
            cost = (cfg.get("quant", {}).get("bits", 32) * cfg.get("lowrank", {}).get("ratio", 1)
                    * (1 - (1 - cfg.get("prune", {}).get("keep_ratio", 1))
                       * (1 - cfg.get("prune", {}).get("after_layer", 0) / 6)))
            ok = oracle(cfg)
            store[cid] = {"id": cid, "config": cfg, "cost": cost, "passed": ok,
                          "slack": 0.1 if ok else -0.2, "reused": False}
            out.append(store[cid])
        return out

    s.evaluate_configs = evaluate_configs
    return s.walk({}), evaluated


def _oracle(cfg):  # passes iff >= 6 bits and low rank keeps >= 0.7 and prune keeps >= 0.7
    return (cfg["quant"]["bits"] >= 6 and cfg.get("lowrank", {}).get("ratio", 1) >= 0.7
            and cfg.get("prune", {}).get("keep_ratio", 1) >= 0.7)


def test_optuna_is_deterministic_for_a_seed_and_proposes_valid_configs():
    from variants.search.optuna_search import EXIT_TARGETS, KEEP_RATIOS, LOWRANK_RATIOS

    a, _ = _study(0, _oracle)
    b, _ = _study(0, _oracle)
    c, _ = _study(1, _oracle)
    ids = [r["id"] for r in a]
    assert ids == [r["id"] for r in b] and ids != [r["id"] for r in c]
    assert len(ids) == len(set(ids)) == 14  # distinct, capped by --max-candidates
    for r in a + c:
        cfg = r["config"]
        assert cfg["quant"]["bits"] in (4, 6, 8)  # the first family is always on
        assert set(cfg) <= {"quant", "lowrank", "prune"}
        if "lowrank" in cfg:
            assert cfg["lowrank"]["ratio"] in LOWRANK_RATIOS
            assert cfg["lowrank"]["method"] in ("whitened", "plain")
        if "prune" in cfg:
            assert cfg["prune"]["keep_ratio"] in KEEP_RATIOS
            assert 1 <= cfg["prune"]["after_layer"] <= 5
        composed.family_configs(cfg)  # the families' own validation accepts it
    ex, _ = _study(3, lambda cfg: True, families=("lowrank", "exit"), n=8)
    for r in ex:
        assert "lowrank" in r["config"] and "prune" not in r["config"]
        assert r["config"].get("exit", {"target": 0.99})["target"] in EXIT_TARGETS
        composed.family_configs(r["config"])
    assert any(r["passed"] for r in a)


def test_optuna_resume_retraces_the_path_without_evaluating():
    store = {}
    first, ev1 = _study(5, _oracle, n=6, store=store)
    longer, ev2 = _study(5, _oracle, n=10, store=store)  # "interrupted" at 6, then resumed
    assert len(ev1) == 6 and len(ev2) == 4
    assert [r["id"] for r in longer[:6]] == [r["id"] for r in first]
    assert all(r["reused"] for r in longer[:6]) and not any(r["reused"] for r in longer[6:])
    fresh, _ = _study(5, _oracle, n=10)
    assert [r["id"] for r in fresh] == [r["id"] for r in longer]


def test_optuna_small_space_stops_when_exhausted():
    recs, ev = _study(0, lambda cfg: True, families=("quant",), n=50)
    assert sorted(r["config"]["quant"]["bits"] for r in recs) == [4, 6, 8] and len(ev) == 3


def test_constraint_is_the_distance_to_passing():
    from variants.search.optuna_search import constraint_of

    assert constraint_of({"passed": True, "slack": 0.3, "cost": 5.0}) == 0
    assert constraint_of({"passed": False, "slack": -0.25, "cost": 5.0}) == 0.25
    assert constraint_of({"passed": False, "slack": None, "cost": 5.0}) == 1.0
    assert constraint_of({"passed": True, "slack": 0.1, "cost": 6.0}, budget=4.0) == 0.5


# ---- CLI: combinations refused; a tiny cross-family search end to end ----

@pytest.mark.parametrize("argv, message", [
    (["--families", "student"], "--families student: the search covers"),
    (["--families", "quant", "lowrank"], "--strategy bisect searches per-layer bits"),  # default
    (["--strategy", "bisect", "--families", "prune"], "--strategy bisect searches"),
    (["--strategy", "latency", "--cost", "bytes"], "--strategy latency walks the composed"),
    (["--cost", "latency-b1", "--families", "quant", "prune"], "drop --families / --w8a8"),
    (["--strategy", "optuna", "--families", "lowrank", "--cost", "latency-b1"],
     "--cost latency-b1 is a quant-kernel cost model"),
])
def test_cli_bad_family_strategy_exit_2(tmp_path, capsys, argv, message):
    from variants.cli import main

    out = tmp_path / "s"
    assert main(["search", *argv, "--results-dir", str(tmp_path / "r"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "r").exists()


# --select value: on 20 search-eval rows no rate clause's bound can pass (agreement needs 122)
SMALL = ["--n-fit", "100", "--n-calibration", "40", "--n-eval", "40", "--n-search", "40",
         "--chunk-size", "10", "--bits", "4", "8", "--no-finalize", "--no-progress",
         # the widths alone, fp32 scales (issue #42's dimensions: tests/search/test_row_lowering.py)
         "--scale-dtype", "float32", "--modes", "none", "--no-unseen-rows",
         "--select", "value"]


def test_tiny_optuna_search_quant_prune_resumes(tmp_path, capsys):
    from variants.cli import main

    argv = ["search", *SMALL, "--strategy", "optuna", "--families", "quant", "prune",
            "--cost", "flops", "--max-candidates", "3", "--results-dir", str(tmp_path / "r"),
            "--out", str(tmp_path / "s")]
    assert main(argv) == 0
    first = json.loads((tmp_path / "s" / "search.json").read_text())
    recs = first["candidates"]
    assert len(recs) == 3 and first["totals"]["evaluated"] == 3
    dense = 2.0 * 6 * (4 * 384 * 384 + 2 * 384 * 1536)
    for r in recs:
        assert r["config"]["quant"]["bits"] in (4, 8)
        assert (tmp_path / "s" / "candidates" / f"{r['id']}.json").exists()
        if "prune" in r["config"]:
            assert r["cost"] == pytest.approx(dense * r["build"]["prune_work_ratio"])
            assert r["cost"] < dense
        else:
            assert r["cost"] == dense
        assert r["bits_per_weight"] == pytest.approx(5.0 if r["config"]["quant"]["bits"] == 4
                                                     else 9.0)
    assert main(argv) == 0  # resume: everything reused, the same path
    again = json.loads((tmp_path / "s" / "search.json").read_text())
    assert again["totals"]["evaluated"] == 0 and again["totals"]["reused"] == 3
    assert [r["id"] for r in again["candidates"]] == [r["id"] for r in recs]


def test_one_width_is_enough_when_other_families_vary():
    from variants.search.driver import SearchOptions

    SearchOptions(strategy="optuna", families=("quant", "lowrank"), bits=(8,)).validate()
    with pytest.raises(ValueError, match="give at least two widths"):
        SearchOptions(strategy="optuna", families=("quant",), bits=(8,)).validate()


def test_tiny_latency_search_walks_composed_candidates_and_resumes(tmp_path):
    """``--cost latency-b1`` with no strategy: the latency walk (measured model cached, the
    composed bases in predicted order, each candidate's predicted time as its cost, bits per
    weight over the W8A8 Linears), resumed without evaluating again."""
    from variants.cli import main

    argv = ["search", *SMALL, "--cost", "latency-b1", "--max-candidates", "2",
            "--results-dir", str(tmp_path / "r"), "--out", str(tmp_path / "s")]
    assert main(argv) == 0
    res = json.loads((tmp_path / "s" / "search.json").read_text())
    assert res["settings"]["strategy"] == "latency"
    recs = res["candidates"]
    assert recs[0]["recipe"] == "w8a8+emb:8"  # equal predicted time: the smallest first
    # passing, it is the base and pruning comes next from its mildest setting; else the next base
    assert recs[1]["recipe"] == ("w8a8+emb:8+prune:4:0.9" if recs[0]["passed"]
                                 else "w8a8:sq+emb:8")
    (model,) = (tmp_path / "r" / ".cache" / "search").glob("latency-model-*-B1.json")
    m = json.loads(model.read_text())
    assert m["batch_size"] == 1 and m["w8a8_forward_ms"] > 0 and m["gemm_share"] > 0.3
    for r in recs:
        assert r["cost"] == pytest.approx(m["forward_ms"] / r["predicted_speedup"])
        # int8 codes + fp32 scale + int32 column sum per output channel: 8 + 64 / in bits
        assert 8.0 < r["bits_per_weight"] < 8.2
    assert main(argv) == 0
    again = json.loads((tmp_path / "s" / "search.json").read_text())
    assert again["totals"]["evaluated"] == 0 and again["totals"]["reused"] == 2

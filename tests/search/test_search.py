"""variants search: exact sequential stopping (stopped == full verdicts on many perturbed
candidates), the strategies on a known oracle, costs against the quant builder's own sums,
the resumable store, bad input (exit 2, nothing written) and a tiny end-to-end search."""

import json

import math

import numpy as np
import pytest

from contracts.checker import contract_from_dict, load_contract
from runs.judge import judge_outputs
from runs.outputs import finish_outputs
from runs.settings import resolve_settings
from variants.search import sequential, strategies
from variants.search.store import Store, candidate_id


# ---- exact sequential stopping ----

@pytest.fixture(scope="module")
def splits():
    """Real sentiment rows (options, scores, actions, labels) with synthetic reference logits:
    160 calibration and 160 eval rows."""
    from variants.datasets import bundled as data
    from variants.models import resolve

    src = resolve(model="minilm-sentiment")
    frame = data.load_vader()
    out = {}
    rng = np.random.default_rng(0)
    for split in ("calibration", "eval"):
        ts = src.make_taskset(data.sample(data.split_frame(frame, split), 160, seed=1))
        logits = rng.normal(0, 2.5, ts.option_mask.shape).astype(np.float32)
        out[split] = (ts, logits)
    return out


def _outputs(ts, logits):
    o = finish_outputs(np.where(ts.option_mask, logits, 0).astype(np.float32), ts.option_mask,
                       np.ones(len(ts), np.float32), ts.option_scores, ts.action_map,
                       ids=ts.ids, task=ts.task, labels=ts.labels, human_dist=ts.human_dist)
    return {k: np.asarray(getattr(o, k)) for k in sequential.OUTPUT_FIELDS}


def _candidates(splits, n):
    """(var_cal, var_eval) pairs: dense noise of many scales, plus sparse spikes (what breaks a
    max clause on one example)."""
    rng = np.random.default_rng(42)
    for i in range(n):
        scale = [0.0005, 0.002, 0.01, 0.03, 0.08, 0.2][i % 6]
        pair = []
        for split in ("calibration", "eval"):
            ts, logits = splits[split]
            noise = rng.normal(0, scale, logits.shape)
            if split == "eval" and i % 4 == 3:  # one large drift somewhere in the split
                noise[rng.integers(len(ts)), :] += rng.normal(0, 1.5, logits.shape[1])
            pair.append(_outputs(ts, (logits + noise).astype(np.float32)))
        yield pair


def test_settleable_clauses_by_rule():
    c = contract_from_dict({"name": "t", "clause": [
        {"id": "a", "metric": "abs_score_error", "statistic": "max", "max": 0.1},
        {"id": "b", "metric": "kl", "statistic": "p95", "max": 0.05},
        {"id": "c", "metric": "agreement", "statistic": "rate", "min": 0.97},
        {"id": "d", "metric": "flip", "stratum": "certified", "statistic": "count", "max": 0},
        {"id": "e", "metric": "kl", "statistic": "mean", "max": 0.05},
        {"id": "f", "metric": "ece_delta", "statistic": "value", "max": 0.02},
        {"id": "g", "metric": "accuracy_drop", "statistic": "value", "max": 0.01},
        {"id": "h", "metric": "agreement", "statistic": "rate", "max": 0.5},  # against direction
        {"id": "i", "metric": "flip", "stratum": "epsilon_held", "statistic": "rate", "max": 0.1},
        {"id": "j", "metric": "agreement", "statistic": "rate", "min": 0.9, "compare": "ci"},
        {"id": "k", "metric": "kl", "statistic": "p95", "max": 0.05, "compare": "ci"},
    ]})
    got = {cl.id: sequential.settleable(cl) for cl in c.clauses}
    # k: a percentile's bootstrap upper end is monotone in each row (resample indices depend
    # on the seed and N only), so it settles like the value
    # finite-outputs (every contract's): a count of NaN / inf rows, settled by the first one
    assert got == {"a": True, "b": True, "c": True, "d": True, "e": False, "f": False,
                   "g": False, "h": False, "i": False, "j": True, "k": True,
                   "finite-outputs": True}


@pytest.mark.parametrize("n, sizes, least, select", [
    (16, (40,), (3, 2), "value"),
    # the search's default rule: every interval-bearing clause compared on its bound
    (16, (40,), (3, 0), "bound"),  # on 160 rows no bound passes; every settle is checked
    # 24 candidates: every (noise scale, spike) combination of _candidates twice, each checked
    # at every 10-row prefix (was 48, 33-48 s: ~700 judge calls; half the calls, same cases)
    pytest.param(24, (10, 40), (10, 5), "value", marks=pytest.mark.slow),
])
def test_stopped_and_full_verdicts_never_differ(splits, n, sizes, least, select):
    from variants.search.bounds import bounded

    contract = load_contract(None)  # the default contract: 16 clauses of every kind
    if select == "bound":
        contract = bounded(contract)
    st = dict(resolve_settings(contract), n_bootstrap=200)
    ref_cal = _outputs(*splits["calibration"])
    ref_eval = _outputs(*splits["eval"])
    stopped = passed = 0
    for var_cal, var_eval in _candidates(splits, n):
        _, full, _ = judge_outputs(ref_cal, ref_eval, var_cal, var_eval, contract, settings=st)
        for size in sizes:
            settled = []
            for n in range(size, 160, size):
                seen = {k: v[:n] for k, v in var_eval.items()}
                settled = sequential.settled_failures(ref_cal, ref_eval, var_cal, seen, contract,
                                                      st)
                if settled:
                    break
            if settled:  # stopped: the full verdict does not pass either, on (at least) those
                stopped += 1  # clauses: each fails there or is undecided (the value passes)
                assert not full.passed and set(settled) <= set(full.failed) | set(full.undecided)
        passed += full.passed
    # both outcomes occur, so the assertion above is exercised (and can fail)
    print(f"{n} candidates: {stopped} stopped runs, {passed} passing")
    assert stopped >= least[0] and passed >= least[1]


def test_completion_is_the_reference_after_the_prefix(splits):
    ref = _outputs(*splits["eval"])
    var = _outputs(splits["eval"][0], splits["eval"][1] + 1.0)
    best = sequential.complete(ref, {k: v[:30] for k, v in var.items()})
    np.testing.assert_array_equal(best["logits"][:30], var["logits"][:30])
    np.testing.assert_array_equal(best["logits"][30:], ref["logits"][30:])
    with pytest.raises(ValueError, match="prefix"):
        sequential.complete(ref, {k: v[5:30] for k, v in var.items()})


# ---- strategies on a known oracle ----

LAYERS = [f"l{i}" for i in range(6)]
W = [4, 6, 8]
# sensitivity: l3 most, then l1, then the others; lower at higher widths
SENS = {(p, b): {"l3": 1.0, "l1": 0.5}.get(p, 0.01 * (i + 1)) / (b - 3) ** 2
        for i, p in enumerate(LAYERS) for b in W}


def _run(gen, oracle):
    tried = []
    try:
        maps = next(gen)
        while True:
            tried += maps
            maps = gen.send([oracle(m) for m in maps])
    except StopIteration:
        pass
    return tried


def _cheapest(tried, oracle):
    return min((m for m in tried if oracle(m)), key=lambda m: sum(m.values()))


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_raises_the_sensitive_layers_then_lowers(batch):
    def oracle(m):  # passes iff l3 at 8 and l1 at >= 6
        return m["l3"] == 8 and m["l1"] >= 6
    tried = _run(strategies.greedy(LAYERS, W, SENS, batch), oracle)
    best = _cheapest(tried, oracle)
    assert best == {"l0": 4, "l1": 6, "l2": 4, "l3": 8, "l4": 4, "l5": 4}
    assert tried[0] == {p: 4 for p in LAYERS}  # the cheapest everywhere first


def test_greedy_lowering_drops_a_needless_raise():
    # l3 is most sensitive but the contract only needs l1 at 8: greedy raises l3 first (to 6,
    # then 8 as its sensitivity at 6 still leads), then l1; lowering must give l3 back
    def oracle(m):
        return m["l1"] == 8
    tried = _run(strategies.greedy(LAYERS, W, SENS, 1), oracle)
    assert _cheapest(tried, oracle) == {p: (8 if p == "l1" else 4) for p in LAYERS}


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_bisect_finds_the_cheapest_passing_threshold_map(batch):
    maps = [m for _, m in strategies.threshold_maps(LAYERS, W, SENS)]
    costs = [sum(m.values()) for m in maps]
    assert costs == sorted(costs, reverse=True) and maps[0] == {p: 8 for p in LAYERS}
    assert maps[-1] == {p: 4 for p in LAYERS}
    need = maps[len(maps) // 2]

    def oracle(m):  # monotone: passes iff at least as wide as `need` everywhere
        return all(m[p] >= need[p] for p in LAYERS)
    tried = _run(strategies.bisect(LAYERS, W, SENS, batch), oracle)
    assert _cheapest(tried, oracle) == need
    assert len(tried) <= 2 + 2 * int(np.ceil(np.log2(len(maps)))) * batch


def test_bisect_stops_when_the_most_expensive_fails():
    tried = _run(strategies.bisect(LAYERS, W, SENS, 1), lambda m: False)
    assert len(tried) == 2


# ---- costs: the quant builder's own sums ----

def test_cost_table_matches_quantize_module(checkpoint):
    from variants.families.quant.family import QuantConfig
    from variants.families.quant.build import quantize_module
    from variants.models import sentiment
    from variants.search.costs import CostTable
    from variants.search.driver import spec_of
    from variants.search.sensitivity import quantizable_layers

    module = sentiment.build(checkpoint).module
    layers = quantizable_layers(module)
    table = CostTable(module, layers, (4, 6, 8), 64)
    lb = {p: (8 if "intermediate" in p else 6 if "value" in p else 4) for p in layers}
    spec = spec_of(lb)
    assert spec["default_bits"] == 4 and spec["id"] == candidate_id(dict(reversed(lb.items())))
    _, info = quantize_module(module, QuantConfig(bits=spec["default_bits"], group_size=64,
                                                  bits_map=spec["bits_map"]), mode="native")
    assert table.model_bytes(lb) == info["model_bytes"]
    assert table.bits_per_weight(lb) == pytest.approx(info["bits_per_weight"], rel=1e-12)
    assert table.bits_per_weight({p: 8 for p in layers}) == pytest.approx(9.0)  # 8 + 64/64
    assert table.bits_per_weight({p: 4 for p in layers}) == pytest.approx(5.0)
    # FLOPs: 2 * in * out per token, the same for every map (quantization keeps the GEMMs)
    assert table.flops(lb) == table.flops({p: 8 for p in layers}) == \
        2 * 6 * (4 * 384 * 384 + 2 * 384 * 1536)


# ---- store ----

def test_store_refuses_other_settings_and_rereads_records(tmp_path):
    s = Store(tmp_path)
    s.check_settings({"seed": 0})  # nothing there yet
    s.write_settings({"seed": 0, "cost": "bytes"})
    s.check_settings({"seed": 0, "cost": "bytes"})
    with pytest.raises(ValueError, match="cost='bytes', not 'bits'"):
        s.check_settings({"seed": 0, "cost": "bits"})
    # a setting left out at its plain value is said as that value, not None
    with pytest.raises(ValueError, match=r"quant_methods=\['rtn'\], not \['gptq'\]"):
        s.check_settings({"seed": 0, "cost": "bytes", "quant_methods": ["gptq"]},
                         plain={"quant_methods": ["rtn"]})
    s.put({"id": "abc", "passed": True})
    assert s.get("abc")["passed"] is True and s.get("nope") is None
    (tmp_path / "candidates" / "abc.json").write_text("{half")
    assert s.get("abc") is None  # a corrupt record is evaluated again


# ---- CLI: bad input ----

@pytest.mark.parametrize("argv, message", [
    (["--cost", "watts"], "--cost 'watts' is unknown"),
    (["--strategy", "anneal"], "--strategy 'anneal' is unknown"),
    (["--families", "prune"], "--families prune"),
    (["--seed", "-1"], "--seed -1 is out of range"),
    (["--max-candidates", "0"], "--max-candidates 0 is out of range"),
    (["--bits", "5", "8"], "--bits 5 is not supported"),
])
def test_cli_bad_flags_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    from variants.cli import main

    out = tmp_path / "s"
    assert main(["search", *argv, "--results-dir", str(tmp_path / "r"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "r").exists()


# --select value: on 20 search-eval rows no rate clause's bound can pass (agreement needs 122
# rows; the search stops before it begins, tests/search/test_search_rows.py)
SMALL = ["--n-fit", "100", "--n-calibration", "40", "--n-eval", "40", "--n-search", "40",
         "--chunk-size", "10", "--bits", "4", "8", "--no-finalize", "--no-progress",
         # the widths alone, fp32 scales (issue #42's dimensions: tests/search/test_row_lowering.py)
         "--scale-dtype", "float32", "--modes", "none", "--no-unseen-rows",
         "--strategy", "greedy", "--select", "value"]


@pytest.mark.parametrize("argv, message", [
    (["--budget", "1000"], "--budget 1000 is below the cheapest candidate's bytes"),
    (["--n-search", "100000"], "--n-search 100000 is more than the"),
    (["--contract", "strict", "--n-calibration", "100", "--n-search", "80"],  # alpha 0.01: 99
     "--n-search 80 gives 40 search-calibration rows, but the contract's alpha=0.01 needs at "
     "least 99"),
])
def test_cli_dead_budget_and_too_few_rows_exit_2(tmp_path, capsys, argv, message):
    from variants.cli import main

    out = tmp_path / "s"
    assert main(["search", *SMALL, *argv, "--results-dir", str(tmp_path / "r"), "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


# ---- a tiny search, end to end ----

def test_tiny_search_resumes_and_is_deterministic(tmp_path, monkeypatch, capsys):
    """Synthetic sensitivity (the real table is covered in test_mixed_precision), 40 search
    rows, 3 candidates: search.json lists each with its cost and examples; a rerun evaluates
    nothing and gives the same records; other settings are refused."""
    from variants.cli import main
    from variants.search import driver

    def fake_sensitivity(self):
        self.sens_path = "synthetic"
        return {(p, b): (1.0 / (i + 1)) / b for i, p in enumerate(self.layers)
                for b in self.opts.bits}
    monkeypatch.setattr(driver.Search, "sensitivity", fake_sensitivity)
    argv = ["search", *SMALL, "--max-candidates", "3", "--results-dir", str(tmp_path / "r"),
            "--out", str(tmp_path / "s")]
    assert main(argv) == 0
    first = json.loads((tmp_path / "s" / "search.json").read_text())
    recs = first["candidates"]
    assert len(recs) == 3 and first["totals"]["evaluated"] == 3
    assert recs[0]["bits_per_weight"] == pytest.approx(5.0)  # every unit at 4 bits first
    # the units: the three embedding tables first, then the 36 encoder Linears (head kept)
    units = list(recs[0]["layer_bits"])
    assert len(units) == 39 and units[:3] == ["encoder.embeddings.position_embeddings",
                                              "encoder.embeddings.token_type_embeddings",
                                              "encoder.embeddings.word_embeddings"]
    assert "head" not in units
    # greedy raised the "most sensitive" unit (the first in this table) first
    assert recs[1]["layer_bits"]["encoder.embeddings.position_embeddings"] == 8
    for r in recs:
        assert 0 < r["n_used"] <= r["n_total"] == 20 and r["n_used"] % 10 == 0
        assert r["stopped"] == (r["n_used"] < 20) and (not r["stopped"] or not r["passed"])
        assert (tmp_path / "s" / "candidates" / f"{r['id']}.json").exists()
    assert (tmp_path / "s" / "search.md").exists() and (tmp_path / "s" / "search.png").exists()
    parts = first["totals"]["parts_s"]  # the search's time by part (no finalists here)
    assert list(parts) == ["load and check", "reference on the search split",
                           "per-layer sensitivity", "candidates"]
    assert all(v >= 0 for v in parts.values()) and sum(parts.values()) <= \
        first["totals"]["wall_s"]
    md = (tmp_path / "s" / "search.md").read_text()
    assert "| per-layer sensitivity |" in md
    assert first["kept"] == [["head", "decision head (outside the encoder) kept full precision"]]
    assert "Kept as they are (not units of the search): `head` (decision head" in md
    assert main(argv) == 0  # resume: everything reused, the same path
    again = json.loads((tmp_path / "s" / "search.json").read_text())
    assert again["totals"]["evaluated"] == 0 and again["totals"]["reused"] == 3
    strip = ("reused", "schema_version")
    assert [{k: v for k, v in r.items() if k not in strip} for r in again["candidates"]] == \
        [{k: v for k, v in r.items() if k not in strip} for r in recs]
    capsys.readouterr()
    bad = [a if a != "3" else "4" for a in argv]
    assert main(bad) == 2
    assert "max_candidates=3, not 4" in capsys.readouterr().err


@pytest.mark.slow
def lenient_finalized_search(tmp_path, monkeypatch, rounds, budget_s):
    """search.json of a tiny search, finalized, under a lenient contract (agreement >= 0.5: every
    layer at 4 bits passes at once) with a synthetic sensitivity table, its finalists timed with
    ``rounds`` rounds within ``budget_s`` s at B=1; OUT is ``tmp_path / "s"``."""
    from variants.cli import main
    from variants.search import driver

    monkeypatch.setattr(driver.Search, "sensitivity", lambda self: setattr(
        self, "sens_path", "synthetic") or {(p, b): 1.0 / b for p in self.layers
                                           for b in self.opts.bits})
    contract = tmp_path / "c.toml"
    contract.write_text('name = "lenient"\n[[clause]]\nid = "agreement"\nmetric = "agreement"\n'
                        'statistic = "rate"\nmin = 0.5\n')
    argv = ["search", *[a for a in SMALL if a != "--no-finalize"], "--contract", str(contract),
            "--timing-rounds", str(rounds), "--timing-warmup", "0", "--timing-budget-s",
            str(budget_s), "--timing-batch-sizes", "1", "--results-dir", str(tmp_path / "r"),
            "--out", str(tmp_path / "s")]
    assert main(argv) == 0
    return json.loads((tmp_path / "s" / "search.json").read_text())


def test_tiny_search_finalist_is_judged_by_the_sweep(tmp_path, monkeypatch):
    """A lenient contract: every layer at 4 bits passes at once; the winner's folder is a sweep
    variant's (outputs, build.json, timing.json, verdict.json, report.md) under OUT/final."""
    res = lenient_finalized_search(tmp_path, monkeypatch, 1, 0.5)
    assert res["winner"]["name"] == "q4-g64-emb" and res["totals"]["candidates"] == 1
    assert res["finalists"][0]["passed_eval"] and not res["overfitted"]
    # one timing round: no segment profile, so no Amdahl table (tests/search/test_amdahl_table)
    assert "--timing-rounds 1 < 3" in res["amdahl"]["skipped"]
    folder = tmp_path / "s" / "final" / "q4-g64-emb"
    for f in ("outputs.npz", "calibration_outputs.npz", "build.json", "timing.json",
              "verdict.json", "report.md"):
        assert (folder / f).exists(), f
    build = json.loads((folder / "build.json").read_text())
    assert build["bits_per_weight"] == pytest.approx(res["winner"]["bits_per_weight"])
    assert build["model_bytes"] == res["winner"]["model_bytes"]
    # one reference: the search fitted it, its final sweep read the same state from the cache
    fit = res["reference_fit"]
    final = json.loads((tmp_path / "s" / "final" / "run.json").read_text())["reference_fit"]
    assert fit["source"] == "fitted" and final["source"] == "cache"
    assert final["sha256"] == fit["sha256"] and final["from"] == fit["from"]


def test_latency_cost_model_sums_cached_kernel_times(checkpoint, tmp_path, monkeypatch):
    from variants.models import sentiment
    from variants.search import costs
    from variants.search.sensitivity import quantizable_layers

    module = sentiment.build(checkpoint).module
    layers = quantizable_layers(module)
    calls = []

    def fake(i, o, b, g, rows, repeats=5):
        calls.append((i, o, b, rows))
        return i * o * b / 1e6
    monkeypatch.setattr(costs, "kernel_ms", fake)
    table = costs.CostTable(module, layers, (4, 8), 64)
    path = table.load_latency("latency-b32", (4, 8), tmp_path)
    # 3 shapes (384x384, 384->1536, 1536->384) x 2 widths, on 32 x 128 token rows
    assert len(calls) == 6 and {c[3] for c in calls} == {32 * costs.TOKENS}
    lb = {p: 4 for p in layers}
    want = 6 * (4 * 384 * 384 + 2 * 384 * 1536) * 4 / 1e6
    assert table.of("latency-b32", lb) == pytest.approx(want)
    again = costs.CostTable(module, layers, (4, 8), 64)
    assert again.load_latency("latency-b32", (4, 8), tmp_path) == path and len(calls) == 6
    assert again.of("latency-b32", lb) == pytest.approx(want)


def test_search_margin_tightens_max_clauses_only():
    from variants.search.margin import tighten

    c = load_contract(None)
    t = tighten(c, 0.25)
    for a, b in zip(c.clauses, t.clauses):
        if a.statistic == "max":
            assert b.threshold == pytest.approx(a.threshold * 0.75) and a.op == "<="
        else:
            assert b == a
    assert {a.id for a in c.clauses if a.statistic == "max"} == {"score-error-max"}
    assert tighten(c, 0.0) is c
    with pytest.raises(ValueError, match="--search-margin 1.0 must be in"):
        tighten(c, 1.0)


def test_slack_and_pareto_by_hand():
    import pandas as pd

    from variants.search.report import pareto, slack

    assert slack("<=", 0.1, 0.08) == pytest.approx(0.2)
    assert slack(">=", 0.97, 0.9603) == pytest.approx(-0.01)
    assert slack("<=", 0, 0) is None and slack("<=", 0, 2) == -2
    f = pd.DataFrame({"cost": [1, 2, 3, 4], "slack": [-0.5, 0.1, 0.05, 0.3]})
    assert pareto(f).index.tolist() == [0, 1, 3]


@pytest.mark.parametrize("where", ["file", "under-a-file", "proc"])
def test_cli_unwritable_out_exits_2_naming_it(tmp_path, capsys, where):
    import os

    from variants.cli import main

    if where == "proc" and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    (tmp_path / "f").write_text("x")
    out = {"file": tmp_path / "f", "under-a-file": tmp_path / "f" / "s",
           "proc": "/proc/x"}[where]
    assert main(["search", *SMALL, "--results-dir", str(tmp_path / "r"), "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {out}" in err and "pass a" in err
    assert (tmp_path / "f").read_text() == "x" and not os.path.exists("/proc/x")
    assert not (tmp_path / "r").exists()  # no cache written either


def test_units_cover_embeddings_and_the_head_by_role_for_every_kind(checkpoint):
    """Every model kind is searchable: the three embedding tables and the 36 encoder Linears
    are units; the head (by role: ``head``, ``classifier``, ``scorer``, a factory's ``proto``)
    is kept with its reason unless --quantize-head, when its Linears join at the end. Bytes of
    a map with quantized embeddings equal the builder's own sum."""
    from variants.families.quant.family import QuantConfig
    from variants.families.quant.build import quantize_module
    from variants.models.heads import DEFAULT
    from variants.models import marker, sentiment
    from variants.search.costs import CostTable
    from variants.search.driver import spec_of
    from variants.search.units import search_units
    from examples.own_model import Prototypes

    sent = sentiment.build(checkpoint)
    mk = marker.MarkerNet(checkpoint.encoder)
    proto = Prototypes(checkpoint.encoder)
    for module, head in ((sent.module, "head"), (mk, "scorer"), (proto, "proto")):
        u = search_units(module)
        assert len(u.paths) == 39 and u.heads == (head,) and u.head_why == DEFAULT
        assert u.kept == [(head, DEFAULT)]
        with_head = search_units(module, quantize_head=True)
        assert with_head.paths == u.paths + [head] and with_head.kept == []
    u = search_units(sent.module)
    assert u.embeddings(sent.module) == u.paths[:3]
    table = CostTable(sent.module, u.paths, (4, 8), 64)
    lb = {p: (8 if "word" in p or "value" in p else 4) for p in u.paths}
    cfg = spec_of(lb)
    _, info = quantize_module(sent.module, QuantConfig(
        bits=cfg["default_bits"], group_size=64, bits_map=cfg["bits_map"],
        quantize_embeddings=True), mode="native")
    assert table.model_bytes(lb) == info["model_bytes"]
    assert info["layer_bits"]["encoder.embeddings.word_embeddings"] == [8, 64]
    assert ("head", DEFAULT) in info["skipped"] and info["head"]["paths"] == ["head"]
    # word embeddings 30522 x 384 at 8 bits: packed 1 byte + 2 fp32 (scale, bias) per 64
    assert table.q_bytes["encoder.embeddings.word_embeddings", 8] == 30522 * 384 * 9 // 8
    # a lookup adds no FLOPs: the same as the Linears alone
    assert table.flops(lb) == 2 * 6 * (4 * 384 * 384 + 2 * 384 * 1536)


def test_bound_rule_compares_intervals_and_bootstraps_the_refit(splits):
    """Under the bound rule every interval-bearing clause is compared on its far end, counts on
    the observed count; the temperature refit gets a bootstrap interval. A variant whose logits
    are the reference's x 1.02 plus noise (refit log ratio 0.026, near log 1.02, < 0.04) passes
    the refit clause on its value and fails it on its bound (160 rows: the refit is noisy)."""
    from variants.search.bounds import bounded, complete_bounds

    contract = load_contract(None)
    b = bounded(contract)
    compare = {c.id: c.compare for c in b.clauses}
    assert compare["agreement"] == compare["kl-p95"] == compare["temperature-refit"] == "ci"
    assert compare["certified-flips"] == compare["bound-violations"] == "value"  # counts
    rng = np.random.default_rng(3)

    def informative(ts):  # logits that know the label, so the refit has an interior optimum
        return (2.0 * np.eye(ts.option_mask.shape[1])[np.maximum(ts.labels, 0)]
                + rng.normal(0, 1.0, ts.option_mask.shape)).astype(np.float32)
    ts, ts_e = splits["calibration"][0], splits["eval"][0]
    logits, logits_e = informative(ts), informative(ts_e)
    ref_cal, ref_eval = _outputs(ts, logits), _outputs(ts_e, logits_e)
    var_cal = _outputs(ts, logits * 1.02)
    noise = np.random.default_rng(5).normal(0, 0.1, logits_e.shape)
    var_eval = _outputs(ts_e, (logits_e * 1.02 + noise).astype(np.float32))
    st = dict(resolve_settings(b), n_bootstrap=200)
    _, by_value, _ = judge_outputs(ref_cal, ref_eval, var_cal, var_eval, contract, settings=st)
    ev, raw, _ = judge_outputs(ref_cal, ref_eval, var_cal, var_eval, b, settings=st)
    assert next(r for r in raw.results if r.id == "temperature-refit").passed is None  # no CI
    done = complete_bounds(ev, raw)
    v = next(r for r in by_value.results if r.id == "temperature-refit")
    r = next(r for r in done.results if r.id == "temperature-refit")
    assert v.passed is True and v.value == pytest.approx(np.log(1.02), abs=0.01)
    assert r.ci_low <= r.value <= r.ci_high and r.compared_value == r.ci_high
    assert r.passed is (r.ci_high <= 0.04) and r.passed is False
    assert r.interval == "bootstrap-percentile"
    # issue #39's attack (--n-search 40): a bound the resamples cannot give (NaN) left the
    # rows estimate at "half_width must be >= 0, got nan"; now no estimate, no crash
    import variants.search.bounds as bounds_mod
    from metrics import bootstrap

    real = bootstrap.bootstrap_ci
    try:
        bootstrap.bootstrap_ci = lambda *a, **k: (float("nan"), float("nan"))
        nan_done = complete_bounds(ev, raw)
    finally:
        bootstrap.bootstrap_ci = real
    assert bounds_mod  # the module reads bootstrap_ci from metrics.bootstrap at call time
    n = next(r for r in nan_done.results if r.id == "temperature-refit")
    assert n.passed is False and n.rows_needed is None and math.isnan(n.ci_high)


def test_a_map_entry_naming_an_embedding_table_quantizes_it(checkpoint):
    """The map's units are the search's: an entry naming an embedding table quantizes that
    table at its width without --quantize-embeddings; the other tables stay fp32."""
    import mlx.nn as nn

    from variants.families.quant.family import QuantConfig
    from variants.families.quant.build import quantize_module
    from variants.models import sentiment

    module = sentiment.build(checkpoint).module
    q, info = quantize_module(module, QuantConfig(bits=8, bits_map=r"word_embeddings=6"),
                              mode="native")
    emb = q.encoder.embeddings
    assert isinstance(emb.word_embeddings, nn.QuantizedEmbedding)
    assert emb.word_embeddings.bits == 6
    assert type(emb.position_embeddings) is nn.Embedding
    assert info["layer_bits"]["encoder.embeddings.word_embeddings"] == [6, 64]
    assert ("encoder.embeddings.position_embeddings", "embeddings kept full precision") in \
        info["skipped"]


def test_rows_a_rate_bound_needs_by_hand():
    """Clopper–Pearson at 95%: n of n agree has lower bound 0.025^(1/n) >= 0.97 from n = 122
    (0.025^(1/121) = 0.96996); 0 of n negative flips has upper bound 1 - 0.025^(1/n) <= 0.02
    from n = 183."""
    from metrics.intervals import clopper_pearson
    from variants.search.bounds import bounded, rows_needed, unreachable

    b = bounded(load_contract(None))
    by_id = {c.id: c for c in b.clauses}
    assert rows_needed(by_id["agreement"]) == 122
    assert rows_needed(by_id["negative-flips"]) == 183
    assert rows_needed(by_id["kl-p95"]) is None and rows_needed(by_id["certified-flips"]) is None
    assert clopper_pearson(122, 122)[0] >= 0.97 > clopper_pearson(121, 121)[0]
    assert clopper_pearson(0, 183)[1] <= 0.02 < clopper_pearson(0, 182)[1]
    assert unreachable(b, 150) == [("negative-flips", 183, 150)]
    assert {i for i, _, _ in unreachable(b, 100)} == {"agreement", "negative-flips",
                                                        "action-agreement"}
    assert unreachable(b, 400) == []
    # negative flips count the labelled rows; with none the clause has no examples (no FAIL)
    assert unreachable(b, 400, n_labelled=150) == [("negative-flips", 183, 150)]
    assert [i for i, _, _ in unreachable(b, 100, n_labelled=0)] == ["agreement",
                                                                    "action-agreement"]


# ---- one search at a time per output folder ----

def test_a_second_search_on_the_same_out_exits_2_and_touches_nothing(tmp_path, capsys,
                                                                      monkeypatch):
    """OUT/.lock is held as a sweep holds its run folder's (runs.lock): while another process
    holds it, a search on the same --out exits 2 naming the holder and the fix, and writes
    nothing into OUT (search_settings.json, candidates/, temp-file clean-up). ``prepare`` is
    the real one's outcome on an already-checked input (nothing loaded here)."""
    import os
    import subprocess
    import sys

    from variants.cli import main
    from variants.search import driver

    out = tmp_path / "s"
    out.mkdir()
    (out / ".search.json.abcd1234.tmp").write_text("{")  # a live writer's temp file, as named

    def prepare(self):
        self.out, self.store = out, Store(out)
        self.settings = {"model": "minilm-sentiment"}
    monkeypatch.setattr(driver.Search, "prepare", prepare)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from runs import lock\n"
         "with lock.hold(sys.argv[1], command='variants search --out s'):\n"
         "    print('held', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        assert main(["search", "--out", str(out), "--results-dir", str(tmp_path / "r"),
                     "--no-progress", "--no-finalize"]) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"variants: error: {out} is in use by pid "
                                               f"{holder.pid}")
    assert err[0].endswith("wait for it to finish, or pass another --out")
    assert sorted(p.name for p in out.iterdir()) == before  # the holder's .lock, the temp file


def test_bisect_also_tries_the_uniform_interior_widths():
    """Every layer at 6 (of 4, 6, 8) is no threshold map of this table (l0's KL at 4 bits is
    below others' at 6), yet it is the cheapest passing map here: bisect tries it after the
    ends, once, and the search's winner is the cheapest passing over every round."""
    maps = [m for _, m in strategies.threshold_maps(LAYERS, W, SENS)]
    six = {p: 6 for p in LAYERS}
    assert six not in maps

    def oracle(m):  # passes iff every layer is at 6 or wider
        return all(b >= 6 for b in m.values())
    tried = _run(strategies.bisect(LAYERS, W, SENS, 1), oracle)
    assert tried[:3] == [maps[-1], maps[0], six] or tried[:3] == [maps[0], maps[-1], six]
    assert tried.count(six) == 1
    assert _cheapest(tried, oracle) == six
    # not tried when an end decides: the cheapest passes, or the most expensive fails
    assert six not in _run(strategies.bisect(LAYERS, W, SENS, 1), lambda m: True)
    assert six not in _run(strategies.bisect(LAYERS, W, SENS, 1), lambda m: False)


@pytest.mark.parametrize("batch", [1, 2])
def test_bisect_walks_the_wider_widths_when_the_uniform_map_fails(batch):
    """Every layer at 6 fails, every layer at 6 but the most sensitive (l3) at 8 passes: no
    threshold map over 4, 6, 8 is that map, the 6-and-8 walk after the main one finds it."""
    six_l3 = {p: (8 if p == "l3" else 6) for p in LAYERS}
    assert six_l3 not in [m for _, m in strategies.threshold_maps(LAYERS, W, SENS)]

    def oracle(m):
        return all(b >= 6 for b in m.values()) and m["l3"] == 8
    tried = _run(strategies.bisect(LAYERS, W, SENS, batch), oracle)
    assert _cheapest(tried, oracle) == six_l3
    sub = [m for _, m in strategies.threshold_maps(LAYERS, [6, 8], SENS)]
    assert len(sub) == 7 and sub[1] == {p: (6 if p == "l0" else 8) for p in LAYERS}
    # the ends, the uniform map, the main bisection, then between the sub-walk's ends (all at
    # 8: passed, all at 6: failed) at most ceil(log2(7)) = 3 rounds
    n_maps = len(strategies.threshold_maps(LAYERS, W, SENS))
    assert len(tried) <= 3 + int(np.ceil(np.log2(n_maps))) * batch + 3 * batch
    # not walked when the uniform map passes: every map tried is a main-walk one or uniform
    main = [m for _, m in strategies.threshold_maps(LAYERS, W, SENS)] + [{p: 6 for p in LAYERS}]
    assert all(m in main for m in _run(strategies.bisect(LAYERS, W, SENS, batch),
                                       lambda m: all(b >= 6 for b in m.values())))
    assert any(m not in main for m in tried)


def test_rows_needed_at_an_exact_power_threshold_is_what_the_interval_passes():
    """At threshold 0.025^(1/100) the closed form ceil(log 0.025 / log t) gives 100, but the
    Clopper–Pearson bound of 100 of 100 falls an ulp short: the count is the interval's own."""
    import dataclasses

    from metrics.intervals import clopper_pearson
    from variants.search.bounds import bounded, rows_needed

    b = bounded(load_contract(None))
    agree = next(c for c in b.clauses if c.id == "agreement")
    for t in (0.025 ** (1 / 100), 0.025 ** (1 / 57), 0.9, 0.999):
        c = dataclasses.replace(agree, threshold=t)
        n = rows_needed(c)
        assert clopper_pearson(n, n)[0] >= t > clopper_pearson(n - 1, n - 1)[0], (t, n)

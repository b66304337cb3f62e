"""The search winner's Amdahl table (variants.search.amdahl) on synthetic profiles, by hand."""

import json

import pytest

from variants.search import amdahl

# 4 layers; the segments sum to 0.95, so 0.05 is unattributed
PROFILE = {"n_layers": 4, "batch_size": 32, "share": {
    "tokenisation": 0.05, "embeddings": 0.05, "qkv_proj": 0.2, "attention_core": 0.1,
    "out_proj": 0.1, "mlp_gemm": 0.3, "mlp_act": 0.05, "norms": 0.05, "pooling": 0.02,
    "head": 0.01, "postprocess": 0.02}}
# GEMMs 95 % of the time, nothing unattributed
GEMM_HEAVY = {"n_layers": 4, "share": {"qkv_proj": 0.3, "out_proj": 0.15, "mlp_gemm": 0.5,
                                       "attention_core": 0.03, "norms": 0.02}}


def test_quant_winner_shares_ceiling_and_distance_from_10x():
    t = amdahl.table(PROFILE, {"quant": {"fraction": 1.0}}, measured=1.5)
    # quant acts on qkv + out + mlp GEMMs: 0.2 + 0.1 + 0.3 = 0.6, ceiling 1 / 0.4 = 2.5
    assert t["pieces"] == [{"piece": "quant", "share": pytest.approx(0.6),
                            "ceiling": pytest.approx(2.5)}]
    assert t["accelerated_share"] == pytest.approx(0.6)
    assert t["untouched_share"] == pytest.approx(0.4) and t["ceiling"] == pytest.approx(2.5)
    # 1 / (0.4 + 0.6 / s) = 1.5  =>  0.6 / s = 2/3 - 0.4  =>  s = 2.25
    assert t["implied_piece_speedup"] == pytest.approx(2.25)
    assert t["gap"] == pytest.approx(10 / 1.5) and not t["reachable"]
    assert t["needed_piece_speedup"] is None
    assert t["untouched"][0] == {"segment": "attention_core", "share": pytest.approx(0.1)}
    assert {"segment": "unattributed", "share": pytest.approx(0.05)} in t["untouched"]
    # 0.4 untouched down to 0.1: attention (0.1) and four 0.05 shares must go
    assert t["must_go"] == ["attention_core", "tokenisation", "embeddings", "mlp_act", "norms"]
    md = "\n".join(amdahl.markdown(t, 32))
    assert "| quant | 60.0% | 2.50× |" in md and "10× needs 6.67× more" in md
    assert "at 2.25× its reference speed" in md and "attention_core, tokenisation" in md


def test_composed_pieces_union_scales_prune_by_depth():
    t = amdahl.table(PROFILE, {"quant": {"fraction": 1.0}, "prune": {"after_layer": 1}})
    rows = {r["piece"]: r for r in t["pieces"]}
    # prune after layer 1 of 4 touches 3/4 of the per-layer segments (0.8): 0.6, ceiling 2.5
    assert rows["prune"]["share"] == pytest.approx(0.6)
    # union: GEMMs all (0.6) + 3/4 of attention, act and norms (0.2 x 0.75 = 0.15)
    assert t["accelerated_share"] == pytest.approx(0.75) and t["ceiling"] == pytest.approx(4.0)
    assert t["measured"] is None and t["gap"] is None and t["implied_piece_speedup"] is None


def test_10x_within_the_ceiling_needs_s_of_p_over_p_minus_09():
    t = amdahl.table(GEMM_HEAVY, {"w8a8": {}}, measured=3.0)
    assert t["accelerated_share"] == pytest.approx(0.95) and t["ceiling"] == pytest.approx(20)
    assert t["reachable"] and t["needed_piece_speedup"] == pytest.approx(0.95 / 0.05)  # 19
    assert t["implied_piece_speedup"] == pytest.approx(0.95 / (1 / 3 - 0.05))
    assert t["must_go"] == [] and t["gap"] == pytest.approx(10 / 3)
    assert "at least 19.00× faster" in "\n".join(amdahl.markdown(t))


def test_pieces_of_a_per_linear_map_with_int8_and_embeddings():
    winner = {"layer_bits": {"encoder.embeddings.word_embeddings": 8, "l0.query": "int8",
                             "l0.key": 4, "l0.value": 4, "l0.out": 4}}
    pieces = amdahl.pieces_of(winner)
    assert pieces == {"quant": {"fraction": 0.75}, "w8a8": {"fraction": 0.25},
                      "embeddings": {}}
    t = amdahl.table(PROFILE, pieces)
    rows = {r["piece"]: r["share"] for r in t["pieces"]}
    assert rows == pytest.approx({"quant": 0.45, "w8a8": 0.15, "embeddings": 0.05})
    assert t["accelerated_share"] == pytest.approx(0.65)  # disjoint widths add: 0.6 + 0.05
    composed = {"config": {"quant": {"bits": 4}, "exit": {"target": 0.99, "rule": "entropy"}}}
    assert amdahl.pieces_of(composed) == {"quant": {"bits": 4},
                                         "exit": {"target": 0.99, "rule": "entropy"}}


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="'exact' is not a piece"):
        amdahl.table(PROFILE, {"exact": {}})
    with pytest.raises(ValueError, match="after_layer must be an integer in"):
        amdahl.table(PROFILE, {"prune": {"after_layer": 5}})
    with pytest.raises(ValueError, match="no shares or layer count"):
        amdahl.table({"skipped": "x"}, {"quant": {}})


def test_answer_reads_the_finalists_sweep(tmp_path):
    final = tmp_path / "final"
    (final / "q4").mkdir(parents=True)
    (final / "run.json").write_text(json.dumps({"segment_profile": PROFILE}))
    (final / "q4" / "timing.json").write_text(json.dumps({"end_to_end": {
        "1": {"speedup": {"speedup_median": 1.2}},
        "32": {"speedup": {"speedup_median": 1.5}}}}))
    winner = {"name": "q4", "layer_bits": {"l0.query": 4}}
    a = amdahl.answer(tmp_path, winner, {"cost": "latency-b1"})
    assert a["measured"] == 1.2 and a["measured_batch_size"] == 1 and a["batch_size"] == 32
    a = amdahl.answer(tmp_path, winner, {"cost": "bits"})  # the profiled batch size
    assert a["measured"] == 1.5 and a["ceiling"] == pytest.approx(2.5)
    assert "skipped" in amdahl.answer(tmp_path / "none", winner)


@pytest.mark.slow
def test_tiny_search_winner_has_its_amdahl_table(tmp_path, monkeypatch):
    """A lenient contract (every layer at 4 bits passes at once) and 3 timing rounds: the
    finalists' sweep profiles the reference, and search.json / search.md carry the winner's
    table, its shares those of final/run.json's profile and its speed-up timing.json's."""
    from tests.search.test_search import lenient_finalized_search

    res = lenient_finalized_search(tmp_path, monkeypatch, 3, 0.1)
    assert res["winner"]["name"] == "q4-g64-emb"
    a = res["amdahl"]
    prof = json.loads((tmp_path / "s" / "final" / "run.json").read_text())["segment_profile"]
    timing = json.loads((tmp_path / "s" / "final" / "q4-g64-emb" / "timing.json").read_text())
    rows = {r["piece"]: r["share"] for r in a["pieces"]}
    gemm = sum(prof["share"][s] for s in amdahl.GEMM_SEGMENTS)
    assert rows == pytest.approx({"quant": gemm, "embeddings": prof["share"]["embeddings"]})
    assert a["accelerated_share"] == pytest.approx(gemm + prof["share"]["embeddings"])
    assert a["ceiling"] == pytest.approx(1 / (1 - a["accelerated_share"]))
    assert a["measured"] == timing["end_to_end"]["1"]["speedup"]["speedup_median"]
    assert a["measured_batch_size"] == 1 and a["batch_size"] == prof["batch_size"]
    md = (tmp_path / "s" / "search.md").read_text()
    assert "## Amdahl: where the winner's speed-up comes from" in md
    assert f"| quant | {gemm:.1%} |" in md

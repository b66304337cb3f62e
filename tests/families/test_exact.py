"""The exact family: row keys and de-duplication, the LRU cache's accounting, the Zipf workload,
output selection, the variants' exactness on real models, and its bad-input errors."""

import numpy as np
import pytest

from variants.families.exact.keys import ResultCache, dedup, row_keys
from variants.families.exact.workload import repeat_rate, workload_rows, zipf_rows


def _arrays(ids, mask=None, types=None, opt=None, **extra):
    ids = np.array(ids, np.int32)
    mask = np.ones_like(ids) if mask is None else np.array(mask, np.int32)
    types = np.zeros_like(ids) if types is None else np.array(types, np.int32)
    opt = np.tile([0, 1, 2], (len(ids), 1)).astype(np.int32) if opt is None \
        else np.array(opt, np.int32)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, option_index=opt,
                **{k: np.array(v, np.int32) for k, v in extra.items()})


# -- keys and de-duplication ------------------------------------------------------------------

def test_dedup_maps_duplicates_back_in_order():
    a = _arrays([[1, 5, 6, 2], [1, 7, 2, 0], [1, 5, 6, 2], [1, 7, 2, 0], [1, 5, 6, 2]],
                mask=[[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    first, inverse = dedup(row_keys(a))
    assert first.tolist() == [0, 1]
    assert inverse.tolist() == [0, 1, 0, 1, 0]
    # outputs of the unique rows gathered by inverse give every row its own row's output
    out_unique = np.array([[10.0], [20.0]])
    assert out_unique[inverse, 0].tolist() == [10, 20, 10, 20, 10]


def test_rows_differing_only_in_mask_types_options_or_marker_do_not_merge():
    base = [1, 5, 6, 2]
    a = _arrays([base] * 6,
                mask=[[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1],
                      [1, 1, 1, 1]],
                types=[[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0],
                       [0, 0, 0, 0]],
                opt=[[0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1, -1], [0, 1, 2], [0, 1, 2]],
                marker_pos=[[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 0], [1, 2, 3], [1, 3, 2]])
    first, inverse = dedup(row_keys(a))
    # row 4 equals row 0; every other row differs in exactly one array
    assert first.tolist() == [0, 1, 2, 3, 5]
    assert inverse.tolist() == [0, 1, 2, 3, 0, 4]


def test_key_ignores_trailing_padding_only_and_takes_the_namespace():
    short = _arrays([[1, 5, 2]])
    padded = _arrays([[1, 5, 2, 0, 0]], mask=[[1, 1, 1, 0, 0]])
    assert row_keys(short) == row_keys(padded)  # same real tokens, other padded length
    hole = _arrays([[1, 5, 2, 0, 9]], mask=[[1, 1, 1, 0, 1]])
    assert row_keys(hole) != row_keys(padded)  # a real token after a hole is read
    assert row_keys(short, b"model-a") != row_keys(short, b"model-b")
    with pytest.raises(ValueError, match="option_index"):
        row_keys({k: v for k, v in short.items() if k != "option_index"})


# -- the cache's accounting -------------------------------------------------------------------

def test_lru_cache_hit_miss_and_eviction_by_hand():
    c = ResultCache(2)
    seq = ["a", "b", "a", "c", "b", "a", "a"]
    got = []
    for k in seq:
        row = c.get(k)
        got.append(row is not None)
        if row is None:
            c.put(k, np.array([len(got)], np.float32))
    # a miss, b miss, a hit (a MRU), c miss evicts b, b miss evicts a, a miss evicts c, a hit
    assert got == [False, False, True, False, False, False, True]
    assert c.counters() == {"lookups": 7, "hits": 2, "stores": 5, "evictions": 3, "size": 2,
                            "maxsize": 2}
    assert c.get("a").tolist() == [6.0]  # stored at the 6th lookup
    with pytest.raises(ValueError, match="--cache-sizes"):
        ResultCache(0)


# -- the Zipf workload ------------------------------------------------------------------------

def test_zipf_workload_is_deterministic_and_repeats_as_scipy_says():
    from scipy.stats import zipfian

    r1, r2 = zipf_rows(50, 4000, 1.1, seed=7), zipf_rows(50, 4000, 1.1, seed=7)
    assert np.array_equal(r1, r2) and not np.array_equal(r1, zipf_rows(50, 4000, 1.1, seed=8))
    assert r1.min() >= 0 and r1.max() < 50
    # the most drawn row holds rank 1: its share is the bounded-Zipf pmf at 1 (4000 draws)
    share = np.bincount(r1, minlength=50).max() / len(r1)
    p1 = zipfian(1.1, 50).pmf(1)
    assert abs(share - p1) < 4 * np.sqrt(p1 * (1 - p1) / len(r1))
    assert repeat_rate([3, 3, 1, 2, 3, 1]) == pytest.approx(0.5)  # 3 distinct of 6
    assert repeat_rate(r1) == pytest.approx(1 - len(np.unique(r1)) / 4000)
    w = workload_rows(10, 4, 5, 1.1, 0)
    assert w["eval"].tolist() == list(range(10)) and len(w["zipf"]) == 20
    with pytest.raises(ValueError, match="--zipf-exponent"):
        zipf_rows(10, 5, 0.0, 0)


# -- the family's config and ladder -----------------------------------------------------------

def test_ladder_names_and_bad_values():
    from variants.families import get_family

    fam = get_family("exact")
    names = [c.name for c in fam.ladder(exact_kinds=["dedup", "cache", "outsel"],
                                        cache_sizes=[16, 4096, 16])]
    assert names == ["dedup", "cache-16", "cache-4096", "outsel"]
    for kw, flag in ((dict(cache_sizes=[0]), "--cache-sizes"),
                     (dict(zipf_exponent=-1.0), "--zipf-exponent"),
                     (dict(workload_calls=0), "--workload-calls"),
                     (dict(exact_kinds=[]), "--exact-kinds")):
        with pytest.raises(ValueError, match=flag):
            fam.ladder(**kw)


# -- exactness on real models -----------------------------------------------------------------

@pytest.fixture(scope="module")
def sentiment(checkpoint):
    from variants.datasets import bundled as data
    from variants.models import sentiment

    frame = data.load_vader()
    ts = sentiment.make_taskset(frame.iloc[:40])
    model = sentiment.build(checkpoint)
    model.fit_head(ts)
    model.temperatures = {3: 1.0}
    return model, ts


def test_dedup_and_cache_variants_give_the_references_logits(sentiment):
    from variants.families import get_family
    from variants.families.exact.family import ExactConfig

    model, ts = sentiment
    rows = np.array([0, 1, 2, 0, 3, 1, 0, 4, 5, 2])  # 10 rows, 6 distinct
    sub = ts.subset(rows)
    batches, _ = model.prepare(sub, batch_size=len(sub))
    ref = model.raw_logits(sub, batches)
    fam = get_family("exact")
    dd, info = fam.build(model, ExactConfig("dedup"))
    assert "bit-identical" in info["exactness"]
    out = dd.raw_logits(sub, batches)
    assert dd.exact_stats == dict(calls=1, rows=10, unique=6, cache_hits=0, computed=6)
    # duplicates of one row get the same logits; all within float round-off of the reference
    assert np.array_equal(out[np.flatnonzero(rows == 0)], np.repeat(out[[0]], 3, axis=0))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)
    # without repeats the reference's own call runs: bit-identical
    uniq = ts.subset(np.arange(6))
    ub, _ = model.prepare(uniq, batch_size=6)
    assert np.array_equal(dd.raw_logits(uniq, ub), model.raw_logits(uniq, ub))

    c, _ = fam.build(model, ExactConfig("cache", 4))
    first = c.raw_logits(sub, batches)  # 6 distinct, LRU of 4: all computed, 2 evicted
    second = c.raw_logits(sub, batches)
    s = c.exact_stats
    # prepare() sorts the rows by length: in batch order the 6 texts first occur as d[0..5].
    # call 1: all miss, stored in that order; the LRU of 4 keeps d[2..5]. call 2 looks all
    # up first: d[0], d[1] miss (2 computed), d[2..5] hit: every row not holding d[0] or d[1]
    in_order = rows[batches[0].index]
    d = list(dict.fromkeys(in_order.tolist()))
    assert s["computed"] == 6 + 2 and s["unique"] == 12
    assert s["cache_hits"] == int(np.isin(rows, d[2:]).sum())
    assert s["cache_hits"] < 10 - 2  # the two evicted texts cover at least 2 rows
    np.testing.assert_allclose(first, ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(second, ref, rtol=0, atol=1e-5)
    big, _ = fam.build(model, ExactConfig("cache", 64))
    big_first = big.raw_logits(sub, batches)
    again = big.raw_logits(sub, batches)
    assert big.exact_stats == dict(calls=2, rows=20, unique=12, cache_hits=10, computed=6)
    np.testing.assert_array_equal(again, big_first)  # a hit returns the stored row as it is


def test_output_selection_equals_the_full_last_layer_on_a_cls_fixture():
    import mlx.core as mx

    from variants.families.exact.outsel import OutputSelectNet, reads_of
    from variants.checkpoints.load import load_checkpoint
    from variants.models.classifier import ClassifierNet

    ck = load_checkpoint("tests/fixtures/hf/bert")
    net = ClassifierNet(ck.encoder, ck.classifier)
    assert reads_of(net) == "cls"
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 2900, (3, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    args = (mx.array(ids), mx.array(mask), mx.zeros_like(mx.array(ids)))
    full = np.array(net(*args))
    sel = np.array(OutputSelectNet(net, "cls")(*args))
    np.testing.assert_allclose(sel, full, rtol=0, atol=1e-5)
    assert np.abs(full).max() > 1e-3  # not a trivial zero head


def test_outsel_variant_of_a_cls_classifier_toml_keeps_every_answer(tmp_path):
    """A model TOML (logits = "classifier") on the BERT parity fixture: the family's outsel
    variant gives the reference's logits to float round-off on VADER texts, every argmax kept."""
    from pathlib import Path

    from variants.datasets import bundled as data
    from variants.families import get_family
    from variants.families.exact.family import ExactConfig
    from variants.checkpoints.load import load_checkpoint
    from variants.models import resolve

    fixture = Path(__file__).parents[1] / "fixtures" / "hf" / "bert"
    toml = tmp_path / "bert-cls.toml"
    toml.write_text(f'name = "bert-cls"\nlogits = "classifier"\ncheckpoint = "{fixture}"\n'
                    'options = ["negative", "neutral", "positive"]\n'
                    'scores = [-1.0, 0.0, 1.0]\n[temperature]\nmode = "fixed"\n'
                    'values = { "3" = 1.0 }\n')
    source = resolve(model_config=toml)
    ck = load_checkpoint(fixture)
    source.bind(ck)
    ref = source.build(ck)
    ts = source.make_taskset(data.load_vader().iloc[:24])
    ref.calibrate(ts)
    fam = get_family("exact")
    fam.check_model(ref.module, [ExactConfig("outsel")])
    var, info = fam.build(ref, ExactConfig("outsel"))
    assert info["reads"] == "cls" and "round-off" in info["exactness"]
    batches, _ = ref.prepare(ts, batch_size=8)  # padded batches: keys/values masked as usual
    a, b = ref.raw_logits(ts, batches), var.raw_logits(ts, batches)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    assert (a.argmax(1) == b.argmax(1)).all() and np.ptp(a) > 1e-3


def test_output_selection_equals_the_full_last_layer_at_marker_positions(checkpoint):
    import mlx.core as mx

    from variants.families.exact.outsel import OutputSelectNet, reads_of
    from variants.models.marker import MarkerNet

    net = MarkerNet(checkpoint.encoder)
    mx.random.seed(0)
    net.scorer.weight = mx.random.normal(net.scorer.weight.shape)
    assert reads_of(net) == "marker"
    rng = np.random.default_rng(1)
    ids = rng.integers(1000, 20000, (2, 16)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 10:] = 0
    pos = mx.array(np.array([[3, 7, 15], [1, 4, 9]], np.int32))
    args = (mx.array(ids), mx.array(mask), mx.zeros_like(mx.array(ids)), pos)
    np.testing.assert_allclose(np.array(OutputSelectNet(net, "marker")(*args)),
                               np.array(net(*args)), rtol=0, atol=1e-4)


def test_output_selection_refuses_mean_pooled_models_in_one_line(checkpoint):
    from variants.families import get_family
    from variants.families.exact.family import ExactConfig
    from variants.models import choice, sentiment

    fam = get_family("exact")
    for module in (sentiment.build(checkpoint).module, choice.build(checkpoint).module):
        with pytest.raises(ValueError, match="mean pooling") as e:
            fam.check_model(module, [ExactConfig("dedup"), ExactConfig("outsel")])
        assert "\n" not in str(e.value) and "--exact-kinds dedup cache" in str(e.value)
        fam.check_model(module, [ExactConfig("dedup"), ExactConfig("cache", 8)])  # no limits


def test_outsel_on_a_mean_pooled_model_exits_2_and_writes_nothing(tmp_path, capsys):
    from variants.cli import main

    code = main(["sweep", "--model", "minilm-sentiment", "--family", "exact", "--exact-kinds",
                 "outsel", "--results-dir", str(tmp_path / "r"), "--n-fit", "40",
                 "--n-calibration", "40", "--n-eval", "30", "--cold-start", "none",
                 "--timing-batch-sizes", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "mean pooling" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize("argv,variants", [
    (["--model", "minilm-sentiment"], ["dedup", "cache-64"]),
    (["--model-config", "examples/model-marker.toml", "--data", "examples/vader_raters.jsonl",
      "--exact-kinds", "dedup", "outsel"], ["dedup", "outsel"])])
def test_exact_sweep_passes_with_zero_drift(argv, variants, tmp_path, monkeypatch):
    """A tiny exact sweep: every variant PASS, 0 flips, logits within float round-off of the
    reference's, the workloads side by side in timing.json and family.md."""
    import json
    from pathlib import Path

    import pandas as pd

    from runs.outputs import DecisionOutputs
    from variants.cli import main

    monkeypatch.chdir(Path(__file__).parents[2])
    argv = argv + (["--cache-sizes", "64"] if "--exact-kinds" not in argv else [])
    assert main(["sweep", *argv, "--family", "exact", "--results-dir", str(tmp_path),
                 "--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds",
                 "1", "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none",
                 "--timing-batch-sizes", "1", "--workload-calls", "3", "--workload-batch", "8",
                 "--no-progress"]) == 0
    run = next(tmp_path.glob("*-exact-*"))
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary["variant"]) == variants
    ref = DecisionOutputs.load(run / "reference" / "outputs.npz")
    for v in variants:
        assert json.loads((run / v / "verdict.json").read_text())["passed"] is True
        out = DecisionOutputs.load(run / v / "outputs.npz")
        np.testing.assert_allclose(out.logits, ref.logits, rtol=0, atol=1e-4)
        assert (out.probs.argmax(1) == ref.probs.argmax(1)).all()
        timing = json.loads((run / v / "timing.json").read_text())
        text = (run / v / "family.md").read_text()
        if v != "outsel":
            wl = timing["workloads"]
            assert wl["eval"]["rows"] == 24 and wl["zipf"]["rows"] == 24
            assert "| eval |" in text and "| zipf |" in text
            # U: distinct rows per call of 8, summed (the 30 eval texts are distinct)
            z = workload_rows(30, 8, 3, 1.1, seed=0)["zipf"]
            u = sum(len(np.unique(z[i:i + 8])) for i in range(0, 24, 8))
            assert wl["zipf"]["unique"] == u < 24 and wl["eval"]["unique"] == 24
            assert wl["zipf"]["repeat_rate"] == pytest.approx(repeat_rate(z))
        else:
            assert "workloads" not in timing and "`marker` positions" in text


def test_describe_puts_the_workloads_side_by_side_with_the_cost_model():
    from variants.families.exact.family import describe

    def stream(rows, U, computed, ref, var):
        return dict(rows=rows, repeat_rate=0.5, U_over_N=U / rows, ideal_dedup_speedup=rows / U,
                    h=1 - computed / rows, ideal_speedup=rows / computed,
                    model_relative_latency=None, measured_relative_latency=var / ref,
                    ref_mean_ms=ref, var_mean_ms=var, speedup_mean=ref / var,
                    speedup_median=ref / var, cold_first_call_ms={"ref": ref, "var": var})

    wl = {"settings": dict(calls=2, batch_size=4, zipf_exponent=1.1, seed=0, n_eval=8),
          "eval": stream(8, 8, 8, 10.0, 10.0), "zipf": stream(8, 4, 2, 10.0, 4.0),
          "hit_cost": dict(epsilon=0.02, rows=4, hit_median_ms=0.2, miss_median_ms=10.0,
                           miss_overhead=1.01, ref_median_ms=9.9)}
    for name in ("eval", "zipf"):  # 1 − h + h·ε: eval h = 0 -> 1; zipf h = 0.75 -> 0.265
        h = wl[name]["h"]
        wl[name]["model_relative_latency"] = 1 - h + h * 0.02
    text = describe({"kind": "cache", "cache_size": 16, "exactness": "float round-off"},
                    {"workloads": wl})
    rows = [ln for ln in text.splitlines() if ln.startswith("| eval") or ln.startswith("| zipf")]
    assert rows[0].split("|")[1:10] == [" eval ", " 8 ", " 0.50 ", " 1.000 ", " 1.00× ", " 0.000 ",
                                        " 1.00× ", " 1.000 ", " 1.000 "]
    assert rows[1].split("|")[1:10] == [" zipf ", " 8 ", " 0.50 ", " 0.500 ", " 2.00× ", " 0.750 ",
                                        " 4.00× ", " 0.265 ", " 0.400 "]
    assert "ε = 0.020" in text and "same request repeated on purpose" in text
    assert "U/N" in describe({"kind": "dedup", "cache_size": None, "exactness": "x"},
                             {"workloads": wl})


def test_cache_sizes_without_the_cache_kind_is_refused():
    from variants.families import get_family

    fam = get_family("exact")
    with pytest.raises(ValueError, match="--cache-sizes") as e:
        fam.ladder(exact_kinds=["dedup", "outsel"], cache_sizes=[64])
    assert "add cache to --exact-kinds or drop --cache-sizes" in str(e.value)
    # not given: the default size when cache is asked for, nothing otherwise
    assert [c.name for c in fam.ladder(exact_kinds=["cache"])] == ["cache-4096"]
    assert [c.name for c in fam.ladder(exact_kinds=["dedup"])] == ["dedup"]


def test_cache_sizes_without_the_cache_kind_exits_2_and_writes_nothing(tmp_path, capsys):
    from variants.cli import main

    code = main(["sweep", "--family", "exact", "--exact-kinds", "dedup", "--cache-sizes", "64",
                 "--results-dir", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "--cache-sizes" in err and "add cache to --exact-kinds" in err
    assert not (tmp_path / "r").exists()


def test_repeated_exact_kinds_and_cache_sizes_are_recorded_once():
    from dataclasses import asdict

    from variants.cli import build_parser
    from variants.commands.sweep import config_from_args

    argv = ["sweep", "--family", "exact", "--exact-kinds", "dedup", "cache", "dedup",
            "--cache-sizes", "16", "64", "16"]
    cfg = config_from_args(build_parser(argv).parse_args(argv))
    # run.json's config is asdict(cfg) (variants.sweep.meta.run_metadata)
    assert asdict(cfg)["params"]["exact_kinds"] == ["dedup", "cache"]
    assert asdict(cfg)["params"]["cache_sizes"] == [16, 64]
    assert [v.name for v in cfg.variants] == ["dedup", "cache-16", "cache-64"]
    assert cfg.run == "minilm-sentiment-exact-dedup-cache"

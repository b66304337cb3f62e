"""Mixed precision (--bits-map): parser, recipes, errors, stored sizes by hand, native ==
simulated, one raised layer changes only that layer; per-layer sensitivity."""

import mlx.core as mx
import numpy as np
import pandas as pd
import pytest

from variants.layer_maps import bits_map
from variants.families.quant.family import QuantConfig, ladder, run_name
from variants.families.quant.build import quantize_module
from variants.models import sentiment

V, O = 384 * 384, 1536 * 384  # MiniLM: value (384x384), FFN down projection (384x1536)
ALL = 6 * (4 * V + 2 * O)  # 36 encoder Linears


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)


# ---- parser ----

def test_parse_patterns_recipes_and_canonical_form():
    assert bits_map.parse("") == (None, ())
    assert bits_map.parse("mixed_4_8") == ("mixed_4_8", ())
    recipe, rules = bits_map.parse(r" layers\.0\.=8 , value=6:32,x{1,2}=4")
    assert recipe is None
    assert rules == (bits_map.Rule(r"layers\.0\.", 8), bits_map.Rule("value", 6, 32),
                     bits_map.Rule("x{1,2}", 4))  # the comma inside {} stays in the pattern
    assert bits_map.canonical(" value=6:32 ") == "value=6:32"
    # the same map, written differently, gives the same variant name; another map another one
    a = QuantConfig(4, bits_map="value=8").name
    assert a == QuantConfig(4, bits_map=" value=8 ").name and a.startswith("q4-g64-map-")
    assert QuantConfig(4, bits_map="value=6").name != a
    assert QuantConfig(4, bits_map="mixed_4_8").name.startswith("q4-g64-mixed_4_8-")
    assert [c.name for c in ladder(bits_map="mixed_3_6")] == [QuantConfig(3, bits_map="mixed_3_6")
                                                              .name]
    assert [c.bits for c in ladder(bits=[2, 4], bits_map="value=8")] == [2, 4]
    assert run_name(bits_map="mixed_4_8").startswith("g64-mixed_4_8-")


@pytest.mark.parametrize("spec,match", [
    ("nosuch", "neither a recipe"),
    ("value=5", r"bits=5 is not supported"),
    ("value=4:48", "group size 48 is not supported"),
    ("value=x", "must be integers"),
    ("=4", "is not PATTERN=BITS"),
    ("(=4", "not a valid regular expression"),
    ("value=4,value=8", "given twice"),
])
def test_bad_maps_name_the_flag(spec, match):
    with pytest.raises(ValueError, match=match) as e:
        QuantConfig(4, bits_map=spec)
    assert str(e.value).startswith("--bits-map ") and "\n" not in str(e.value)


def test_recipe_and_bits_conflict():
    with pytest.raises(ValueError, match="--bits 2 and --bits-map mixed_4_8"):
        ladder(bits=[2], bits_map="mixed_4_8")
    with pytest.raises(ValueError, match="drop --bits"):
        QuantConfig(8, bits_map="mixed_4_8")


def test_pattern_matching_no_layer_is_an_error(model):
    with pytest.raises(ValueError, match="'nowhere' matches no quantizable layer"):
        quantize_module(model.module, QuantConfig(4, bits_map="value=8,nowhere=8"))
    with pytest.raises(ValueError, match="'head' matches no quantizable layer"):  # head kept fp32
        quantize_module(model.module, QuantConfig(4, bits_map="head=8"))
    with pytest.raises(ValueError) as e:  # echoed as typed, the head's flag named
        quantize_module(model.module, QuantConfig(4, bits_map=r"^head\.x$=8"))
    assert "pattern '^head\\.x$' matches no quantizable layer" in str(e.value)
    assert "--quantize-head" in str(e.value) and "\n" not in str(e.value)


def test_recipe_layers_for_six_and_24_layers():
    assert [i for i in range(6) if bits_map.use_more_bits(i, 6)] == [0, 2, 5]
    # 24 layers (mlx-lm's rule unchanged for deep models): first 3, last 3, every third
    assert [i for i in range(24) if bits_map.use_more_bits(i, 24)] == \
        [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]


# ---- sizes from what is stored: a hand count ----

def test_family_md_shows_the_per_layer_widths(model):
    from variants.families.quant.family import describe

    _, info = quantize_module(model.module, QuantConfig(4, bits_map="mixed_4_8"), "native")
    text = describe(info)
    assert "36 Linears, 6 at 8 bits, 30 at 4; stored 5.833 bits per weight" in text
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    header = rows["| layer"].strip("| ").split(" | ")
    for i in range(6):
        cells = dict(zip(header[1:], rows[f"| {i}"].strip("| ").split(" | ")[1:]))
        high = "8" if i in (0, 2, 5) else "4"
        assert cells["attention.value"] == cells["output"] == high and cells["intermediate"] == "4"
    _, uniform = quantize_module(model.module, QuantConfig(4), "native")
    assert describe(uniform) is None  # a uniform variant adds nothing to the report


def test_mixed_recipe_bits_per_weight_and_bytes_by_hand(model):
    q, info = quantize_module(model.module, QuantConfig(4, bits_map="mixed_4_8"), "native")
    high = {p for p, (b, g) in info["layer_bits"].items() if b == 8}
    assert high == {f"encoder.layers.{i}.{s}" for i in (0, 2, 5)
                    for s in ("attention.value", "output")}
    n_high = 3 * (V + O)
    # b bits per weight + one fp32 scale and one fp32 bias per 64 weights (1 bit per weight)
    stored_bits = n_high * (8 + 1) + (ALL - n_high) * (4 + 1)
    assert info["quantized_params"] == ALL
    assert info["bits_per_weight"] == pytest.approx(stored_bits / ALL, abs=1e-12)  # 5.8333
    assert info["bits_per_weight"] == pytest.approx(5.833333333333, abs=1e-9)
    _, uni = quantize_module(model.module, QuantConfig(4), "native")
    assert info["model_bytes"] - uni["model_bytes"] == n_high * 4 // 8  # +4 bits per raised weight


def test_group_size_per_layer_counts_its_own_scales(model):
    _, info = quantize_module(model.module, QuantConfig(4, bits_map=r"layers\.1\.output=4:32"),
                              "native")
    # that layer: 4 + 64/32 = 6 bits per weight; the others 5
    assert info["bits_per_weight"] == pytest.approx((O * 6 + (ALL - O) * 5) / ALL, abs=1e-12)


# ---- native == simulated; one raised layer changes only itself ----

def test_native_and_simulated_agree_for_a_mixed_map(model, checkpoint):
    encs, _ = checkpoint.tokenizer.encode(["Great food.", "The soup was cold and bland."])
    batch = tuple(mx.array(a) for a in checkpoint.tokenizer.batch(encs))
    cfg = QuantConfig(3, bits_map=r"value=8,layers\.[02]\.intermediate=6:32,output=2:128")
    nat, _ = quantize_module(model.module, cfg, "native")
    sim, _ = quantize_module(model.module, cfg, "simulated")
    a, b = np.array(nat(*batch)), np.array(sim(*batch))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert np.abs(b - np.array(model.module(*batch))).max() > 1e-4  # a real approximation


def test_one_layer_at_8_bits_changes_only_that_layer(model):
    layer = "encoder.layers.3.attention.value"
    uni, _ = quantize_module(model.module, QuantConfig(4), "simulated")
    mix, _ = quantize_module(model.module, QuantConfig(4, bits_map=r"layers\.3\.attention\.value"
                                                                   "=8"), "simulated")
    u, m = dict(uni.named_modules()), dict(mix.named_modules())
    ref = dict(model.module.named_modules())
    changed = [p for p in u if hasattr(u[p], "weight") and
               not np.array_equal(np.array(u[p].weight), np.array(m[p].weight))]
    assert changed == [layer]
    w = np.array(ref[layer].weight)  # and it is the 8-bit round trip, closer to the fp32 weight
    assert np.abs(np.array(m[layer].weight) - w).max() < np.abs(np.array(u[layer].weight) - w).max() / 8


# ---- per-layer sensitivity ----

@pytest.fixture(scope="module")
def fitted(model):
    from variants.datasets import bundled as data

    frame = data.sample(data.split_frame(data.load_vader(), "calibration"), 24, seed=0)
    from variants.models import resolve

    ts = resolve(model="minilm-sentiment").make_taskset(frame)
    return model, ts


def test_sensitivity_table_and_cache(fitted, tmp_path):
    from variants.search import sens_cache, sensitivity

    model, ts = fitted
    paths = sensitivity.quantizable_layers(model.module, r"layers\.(0|5)\.attention\.value")
    calls = []
    t = sens_cache.measure_cached(model, ts, tmp_path, paths=paths, bits=(2, 8),
                                  progress=calls.append)
    frame = t.frame
    assert (t.cached, t.measured) == (0, 4) and calls == [2, 2]
    assert list(frame.columns) == ["layer", "bits", "group_size", "max_abs_dlogit", "kl_mean",
                                   "flip_rate", "n"]
    assert frame["layer"].tolist() == ["encoder.layers.0.attention.value"] * 2 + \
        ["encoder.layers.5.attention.value"] * 2
    assert (frame["n"] == 24).all() and (frame["group_size"] == 64).all()
    for _, g in frame.groupby("layer"):
        lo, hi = g.set_index("bits").loc[2], g.set_index("bits").loc[8]
        assert hi.max_abs_dlogit < lo.max_abs_dlogit and hi.kl_mean < lo.kl_mean
        assert 0 < hi.max_abs_dlogit and hi.flip_rate <= lo.flip_rate
    # one pandas-readable file per unit; read back exactly, nothing measured the second time
    again = sens_cache.measure_cached(model, ts, tmp_path, paths=paths, bits=(8, 2),
                                      progress=calls.append)
    assert (again.cached, again.measured, again.folder) == (4, 0, t.folder)
    assert len(calls) == 2 and sorted(p.name for p in t.folder.iterdir()) == \
        [f"{p}.csv" for p in paths]
    pd.testing.assert_frame_equal(again.frame, frame)
    # a unit and a width more: only the rows missing are measured, the others read
    more = sens_cache.measure_cached(model, ts, tmp_path, bits=(2, 4, 8),
                                     paths=[*paths, "encoder.layers.1.output"])
    assert (more.cached, more.measured) == (4, 5) and len(more.frame) == 9
    pd.testing.assert_frame_equal(more.frame[more.frame["bits"] != 4].iloc[:4]
                                  .reset_index(drop=True), frame)
    # the reference's module was not modified: re-measuring gives the same numbers
    again2 = sensitivity.measure(model, ts, bits=(8,), layers=r"layers\.0\.attention\.value")
    assert again2["max_abs_dlogit"].iloc[0] == pytest.approx(frame["max_abs_dlogit"].iloc[1])


def test_sensitivity_metrics_by_hand(fitted):
    """max |dlogit| and the flip rate recomputed from the two logit tables directly."""
    import copy

    from variants.search import sensitivity

    model, ts = fitted
    layer = "encoder.layers.2.intermediate"
    row = sensitivity.measure(model, ts, bits=(2,), layers=layer + "$").iloc[0]
    ref = model.raw_logits(ts)
    mod = copy.deepcopy(model.module)
    m = dict(mod.named_modules())[layer]
    q, s, b = mx.quantize(m.weight, group_size=64, bits=2)
    m.weight = mx.dequantize(q, s, b, group_size=64, bits=2)
    out = model.replace_module(mod).raw_logits(ts)
    mask = ts.option_mask
    assert row.max_abs_dlogit == pytest.approx(np.abs(out - ref)[mask].max(), rel=1e-5)
    r = np.where(mask, ref, -np.inf).argmax(1)
    o = np.where(mask, out, -np.inf).argmax(1)
    assert row.flip_rate == pytest.approx((r != o).mean())


def test_sensitivity_bad_layers_regex(model):
    from variants.search import sensitivity

    with pytest.raises(ValueError, match="--layers 'nothing' matches no Linear"):
        sensitivity.quantizable_layers(model.module, "nothing")


# ---- the command line: bad input is one line, exit 2, nothing written ----

TINY = ["--n-fit", "60", "--n-calibration", "40", "--n-eval", "40", "--timing-batch-sizes", "1",
        "--timing-rounds", "2", "--timing-warmup", "0", "--cold-start", "none", "--no-progress"]


@pytest.mark.parametrize("argv,message", [
    (["sweep", "--bits-map", "value=5", *TINY], "--bits-map entry 'value=5': bits=5"),
    (["sweep", "--bits-map", "nowhere=8", *TINY], "--bits-map pattern 'nowhere' matches no"),
    (["sweep", "--bits-map", "mixed_4_8", "--bits", "2", *TINY], "--bits 2 and --bits-map"),
    (["sensitivity", "--bits", "5"], "--bits 5 is not one of: 2, 3, 4, 6, 8"),
    (["sensitivity", "--n-examples", "3"], "--n-examples '3' must be an integer >= 10"),
])
def test_cli_bad_maps_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    from variants.cli import main

    out = tmp_path / "r"
    try:  # refused by main (returns 2) or by the command line parser (exits 2)
        code = main([*argv, "--results-dir", str(out)])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("variants: error: ") and err.count("\n") == 1
    assert not out.exists()


# ---- the model TOML's [quant] bits_map: the default of --bits-map ----

GOOD = ('name = "m"\nlogits = "linear-head"\noptions = ["a", "b", "c"]\nscores = [-1, 0, 1]\n'
        'actions = ["x", "y", "y"]\n')


def test_toml_bits_map_is_the_sweep_default_and_the_flag_wins(tmp_path):
    from variants.models.model_config import load_model_config
    from variants.sweep.config import SweepConfig

    plain = tmp_path / "plain.toml"
    plain.write_text(GOOD)
    assert "quant_bits_map" not in load_model_config(plain).to_dict()  # old cache keys kept
    f = tmp_path / "m.toml"
    f.write_text(GOOD + '[quant]\nbits_map = " mixed_4_8 "\n')
    assert load_model_config(f).quant_bits_map == "mixed_4_8"
    kw = dict(model_config=str(f), timing_batch_sizes=(1,), family="quant")
    cfg = SweepConfig(params={"bits": None, "bits_map": ""}, **kw).validate()
    assert [v.name for v in cfg.variants] == [QuantConfig(4, bits_map="mixed_4_8").name]
    cfg = SweepConfig(params={"bits": [2], "bits_map": "value=8"}, **kw).validate()
    assert [v.bits_map for v in cfg.variants] == ["value=8"]


def test_bad_toml_bits_map_names_file_and_key(tmp_path):
    from variants.models.model_config import ModelConfigError, load_model_config

    f = tmp_path / "m.toml"
    f.write_text(GOOD + '[quant]\nbits_map = "value=5"\n')
    with pytest.raises(ModelConfigError, match=r"m\.toml: \[quant\] bits_map: entry 'value=5': "
                                                r"bits=5 is not supported; choose one of"):
        load_model_config(f)


def test_sensitivity_suffix_forward_equals_full_forward(fitted, monkeypatch):
    """Layers i.. from the recorded input of layer i give the whole model's numbers (KL to
    1e-6 nats, flips exact) for Linears of the first, a middle and the last layer; an
    embedding table keeps the full forward."""
    from variants.search import sensitivity, suffix

    model, ts = fitted
    starts = []
    real = suffix.SuffixCache.start_at
    monkeypatch.setattr(suffix.SuffixCache, "start_at",
                        lambda self, i: starts.append(i) or real(self, i))
    units = ["encoder.embeddings.token_type_embeddings", "encoder.layers.0.attention.query",
             "encoder.layers.3.output", "encoder.layers.5.intermediate"]
    fast = sensitivity.measure(model, ts, bits=(2, 4), paths=units)
    assert starts == [0, 0, 3, 3, 5, 5]  # the embedding table ran in full
    full = sensitivity.measure(model, ts, bits=(2, 4), paths=units, suffix_forward=False)
    assert fast["layer"].tolist() == full["layer"].tolist() == [u for u in units for _ in "ab"]
    np.testing.assert_allclose(fast["kl_mean"], full["kl_mean"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(fast["max_abs_dlogit"], full["max_abs_dlogit"], rtol=0, atol=1e-4)
    assert fast["flip_rate"].tolist() == full["flip_rate"].tolist()
    assert (full["kl_mean"] > 0).all()


def test_suffix_skips_the_layers_before_its_start(fitted):
    """From layer 3 the recorded input is used: a change to layer 1 is not seen, one to layer 4
    is; a batch never recorded runs the whole stack."""
    from variants.search import suffix

    model, ts = fitted
    import copy

    mod = copy.deepcopy(model.module)
    enc = mod.encoder
    batch = model.prepare(ts, 8)[0][0]
    args = (batch.input_ids, batch.attention_mask, batch.token_type_ids)
    cache = suffix.SuffixCache(mod)
    with cache.record():
        ref = np.array(enc(*args).last_hidden)
    assert len(cache.states) == 1 and len(next(iter(cache.states.values()))) == 6
    w1, w4 = enc.layers[1].output.weight, enc.layers[4].output.weight
    enc.layers[1].output.weight = w1 * 0
    with cache.start_at(3):
        same = np.array(enc(*args).last_hidden)
    enc.layers[4].output.weight = w4 * 0
    with cache.start_at(3):
        moved = np.array(enc(*args).last_hidden)
        other = np.array(enc(args[0][:1], args[1][:1], args[2][:1]).last_hidden)
    assert cache.hits == 2
    real = np.array(args[1], bool)
    np.testing.assert_allclose(same[real], ref[real], rtol=0, atol=1e-5)
    assert np.abs(moved[real] - ref[real]).max() > 1e-2
    full = np.array(suffix.BertEncoder.__call__(enc, args[0][:1], args[1][:1],
                                                args[2][:1]).last_hidden)
    np.testing.assert_array_equal(other, full)  # not recorded: layer 1's change shows
    assert type(enc) is suffix.BertEncoder


def test_toml_scale_dtype_and_mode_are_defaults_every_flag_value_overrides(tmp_path):
    """[quant] scale_dtype / mode are the sweep's defaults; a flag given, even at the value
    that is the flag's own default (float32, affine), wins (issue #42)."""
    from variants.sweep.config import SweepConfig

    f = tmp_path / "m.toml"
    f.write_text(GOOD + '[quant]\nscale_dtype = "bfloat16"\nmode = "nvfp4"\n')
    kw = dict(model_config=str(f), timing_batch_sizes=(1,), family="quant")
    cfg = SweepConfig(params={"bits": None, "scale_dtype": None, "quant_mode": None},
                      **kw)
    with pytest.raises(Exception, match="stores its own 8-bit scales"):
        cfg.validate()  # nvfp4 with bfloat16 scales from the TOML: refused in one line
    cfg = SweepConfig(params={"bits": [4], "scale_dtype": None, "quant_mode": "affine"},
                      **kw).validate()
    assert [v.name for v in cfg.variants] == ["q4-g64-sbf16"]
    cfg = SweepConfig(params={"bits": [4], "scale_dtype": "float32", "quant_mode": "affine"},
                      **kw).validate()
    assert [v.name for v in cfg.variants] == ["q4-g64"]


def test_embedding_texts_name_the_variant_by_their_contents(tmp_path):
    f = tmp_path / "own.txt"
    f.write_text("one text\n", encoding="utf-8")
    kw = dict(bits=6, group_size=64, quantize_embeddings=True,
              bits_map="word_embeddings@unseen=2", embedding_texts=str(f))
    a = QuantConfig(**kw).name
    f.write_text("one text\nand another\n", encoding="utf-8")
    assert QuantConfig(**kw).name != a and a.startswith("q6-g64-emb-map-")
    # without an @unseen entry the texts change nothing, so the name carries no suffix
    assert "-et" not in QuantConfig(bits=6, embedding_texts=str(f)).name

"""variants search's dimensions beyond per-unit widths: the quantizer (--quant-method) and W8A8
Linears (--w8a8): the mixed quant + W8A8 build and its bytes by hand, the candidate spec and
its re-run as a sweep variant, the options' cost order, the int8 sensitivity against an
independent computation, bad flags, and a tiny search walking two methods with int8 units."""

import json
import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.families.quant.family import QuantConfig, ladder
from variants.runtime.int8_linear import Int8Linear
from variants.search.costs import INT8
from variants.search.store import candidate_id

V, O = 384 * 384, 1536 * 384  # MiniLM: 384x384 and 384<->1536 Linears


@pytest.fixture(scope="module")
def model(checkpoint):
    from variants.models import sentiment

    return sentiment.build(checkpoint)


@pytest.fixture(scope="module")
def linears(model):
    from variants.search.sensitivity import quantizable_layers

    return quantizable_layers(model.module)


def test_mixed_build_has_int8_and_quantized_linears_and_bytes_by_hand(model, linears):
    from variants.families.quant.family import build
    from variants.families.quant.build import quantize_module
    from variants.search.costs import CostTable

    int8 = [p for p in linears if p.endswith("attention.query") or ".3." in p]  # 6 + 5
    cfg = QuantConfig(bits=4, group_size=64,
                      int8="^(?:" + "|".join(map(re.escape, int8)) + ")$")
    native, info = build(model, cfg, mode="native")
    mods = dict(native.module.named_modules())
    assert sorted(p for p, m in mods.items() if isinstance(m, Int8Linear)) == sorted(int8)
    assert sorted(p for p, m in mods.items() if isinstance(m, nn.QuantizedLinear)) == \
        sorted(set(linears) - set(int8)) and info["int8_layers"] == sorted(int8)
    # bytes: the all-4-bit model, each int8 layer's packed bytes swapped for out*(in + 8)
    _, q4 = quantize_module(model.module, QuantConfig(bits=4, group_size=64), "native")
    ref = dict(model.module.named_modules())
    packed = {p: ref[p].weight.shape[0] * (ref[p].weight.shape[1] // 2  # 4-bit codes
                                           + 8 * ref[p].weight.shape[1] // 64)  # scale + bias
              for p in int8}
    want = q4["model_bytes"] + sum(ref[p].weight.shape[0] * (ref[p].weight.shape[1] + 8)
                                   - packed[p] for p in int8)
    assert info["model_bytes"] == want
    table = CostTable(model.module, linears, (4, 8, INT8), 64)
    assert table.model_bytes({p: INT8 if p in int8 else 4 for p in linears}) == want
    assert table.bits_per_weight({p: INT8 for p in linears}) == pytest.approx(
        8 * 6 * (4 * (V + 8 * 384) + (O + 8 * 1536) + (O + 8 * 384)) / (6 * (4 * V + 2 * O)))
    # simulated: the same layers as the w8a8 family's Int8Linear of the fp32 Linear, the
    # others the round-to-nearest dequantized weights
    sim, sinfo = build(model, cfg, mode="simulated")
    smods = dict(sim.module.named_modules())
    assert sinfo["model_bytes"] == want
    x = mx.random.normal((5, 384), key=mx.random.key(1))
    p = int8[0]
    np.testing.assert_array_equal(np.array(smods[p](x)),
                                  np.array(Int8Linear(ref[p], native=False)(x)))
    other = "encoder.layers.0.attention.key"
    q, s, b = mx.quantize(ref[other].weight, group_size=64, bits=4)
    np.testing.assert_allclose(np.array(smods[other].weight),
                               np.array(mx.dequantize(q, s, b, group_size=64, bits=4)),
                               rtol=0, atol=0)


def test_spec_of_int8_and_method_rerun_as_the_sweep_variant(model, linears):
    from variants.families.quant.family import build
    from variants.search.driver import SearchOptions, spec_of

    lb = {p: (INT8 if "intermediate" in p else 8 if "value" in p else 4) for p in linears}
    rtn = {p: 4 for p in linears}
    assert spec_of(rtn)["id"] == candidate_id(rtn)  # ids of plain maps are as before
    assert "method" not in spec_of(rtn)
    spec = spec_of(lb, method="gptq")
    assert spec["id"] != spec_of(lb)["id"] == candidate_id(lb) != candidate_id(lb, "gptq")
    assert spec["id"] == candidate_id(dict(reversed(lb.items())), "gptq")
    assert spec["default_bits"] == 4 and spec["method"] == "gptq"
    assert spec["bits_map"].count("=8") == 6 and "intermediate" not in spec["bits_map"]
    pat = re.compile(spec["int8"])
    assert [p for p in linears if pat.search(p)] == [p for p in linears if "intermediate" in p]
    # every unit int8: the quant default is 8 bits, no map
    all8 = spec_of({p: INT8 for p in linears})
    assert all8["default_bits"] == 8 and all8["bits_map"] == ""
    # the search's config == the sweep's (--bits 4 --bits-map ... --quant-method gptq
    # --int8-layers ...): same name, so the winner re-runs as that sweep variant
    cfg = SearchOptions().quant_config(4, spec["bits_map"], "gptq", spec["int8"])
    swept, = ladder(bits=[4], group_size=64, bits_map=spec["bits_map"], quant_method=["gptq"],
                    int8_layers=spec["int8"], quantize_embeddings=True,
                    scale_dtype="float16")  # the search's default --scale-dtype
    assert swept == cfg and cfg.name.startswith("q4-g64-emb-sf16-map-")
    assert "-gptq-int8-" in cfg.name
    # the rtn + int8 build puts exactly those Linears in int8, the value ones at 8 bits
    variant, info = build(model, SearchOptions().quant_config(4, spec["bits_map"], "rtn",
                                                              spec["int8"]), mode="native")
    kinds = {p: (m.bits if isinstance(m, nn.QuantizedLinear) else "int8")
             for p, m in variant.module.named_modules() if p in lb}
    assert kinds == lb


def test_options_follow_the_cost_and_embeddings_never_take_int8(model, linears):
    from variants.search import dims
    from variants.search.costs import CostTable

    table = CostTable(model.module, linears, (4, 6, 8, INT8), 64)
    assert dims.options(table, "bytes", (4, 6, 8), True, linears) == [4, 6, INT8, 8]
    assert dims.options(table, "bytes", (4, 6, 8), False, linears) == [4, 6, 8]
    shapes = ((384, 384), (384, 1536), (1536, 384))

    def latency(**ms):  # the same kernel time for each shape, per option
        table.latency["latency-b32"] = {f"{i}x{o}x{b}": t for i, o in shapes
                                        for b, t in ms.items()}
        return dims.options(table, "latency-b32", (4, 6, 8), True, linears)
    # int8 the fastest: 4 and 6 bits cost more and are less accurate, dropped
    assert latency(int8=1.0, **{"4": 2.04, "6": 2.06, "8": 2.08}) == [INT8, 8]
    assert latency(int8=2.07, **{"4": 2.04, "6": 2.06, "8": 2.08}) == [4, 6, INT8, 8]
    # 6 bits slower than 8: dropped; int8 slower than 8: dropped
    assert latency(int8=2.07, **{"4": 2.04, "6": 3.0, "8": 2.08}) == [4, INT8, 8]
    assert latency(int8=9.0, **{"4": 2.04, "6": 2.06, "8": 2.08}) == [4, 6, 8]
    assert dims.options(table, "latency-b32", (4, 6, 8), False, linears) == [4, 6, 8]
    lb = {"encoder.embeddings.word_embeddings": INT8, linears[0]: INT8, linears[1]: 4}
    assert dims.sanitise(lb, {"encoder.embeddings.word_embeddings"}) == \
        {"encoder.embeddings.word_embeddings": 8, linears[0]: INT8, linears[1]: 4}
    assert dims.int8_pattern([]) == ""


def test_int8_sensitivity_equals_one_w8a8_linear_computed_apart(model, tmp_path):
    from scipy.special import log_softmax

    from variants.datasets import bundled as data
    from variants.families.w8a8.build import build
    from variants.families.w8a8.family import W8A8Config
    from variants.models import resolve
    from variants.search.dims import int8_sensitivity

    frame = data.sample(data.split_frame(data.load_vader(), "calibration"), 12, seed=0)
    ts = resolve(model="minilm-sentiment").make_taskset(frame)
    paths = ["encoder.layers.0.attention.query", "encoder.layers.5.output"]
    got = int8_sensitivity(model, ts, paths, tmp_path)
    assert set(got) == {(p, INT8) for p in paths}
    ref = model.raw_logits(ts).astype(np.float64)
    mask = np.asarray(ts.option_mask, bool)
    for p in paths:  # the w8a8 family with every other Linear skipped
        one, _ = build(model, W8A8Config(skip=f"^(?!{re.escape(p)}$)"))
        out = one.raw_logits(ts).astype(np.float64)
        lp, lq = (log_softmax(np.where(mask, z, -np.inf), axis=1) for z in (ref, out))
        kl = np.where(mask, np.exp(lp) * (lp - lq), 0).sum(1).mean()
        assert got[p, INT8] == pytest.approx(kl, rel=1e-6, abs=1e-12) and kl > 0
    again = int8_sensitivity(model, ts, paths, tmp_path)  # from the cache file
    assert again == pytest.approx(got, rel=1e-12)
    assert len(list((tmp_path / "search").glob("int8-sensitivity-*.json"))) == 1


# --select value: on 20 search-eval rows no rate clause's bound can pass (agreement needs 122)
SMALL = ["--n-fit", "100", "--n-calibration", "40", "--n-eval", "40", "--n-search", "40",
         "--chunk-size", "10", "--bits", "4", "8", "--no-finalize", "--no-progress",
         # the widths alone, fp32 scales (issue #42's dimensions: tests/search/test_row_lowering.py)
         "--scale-dtype", "float32", "--modes", "none", "--no-unseen-rows",
         "--no-quantize-embeddings", "--select", "value"]


@pytest.mark.parametrize("argv,message", [
    (["--quant-method", "rtn", "nope"], "--quant-method nope: not known"),
    (["--w8a8", "--strategy", "optuna"], "--w8a8 and --quant-method other than rtn"),
    (["--quant-method", "rtn", "gptq", "--n-fit", "0"],
     "--quant-method gptq learns from the fit rows, but --n-fit is 0"),
    (["--quant-method", "awq", "--n-fit", "0", "--data", "examples/vader_raters.jsonl",
      "--model-config", "examples/model-cosine.toml"],
     "--quant-method awq learns from the fit rows, but --n-fit is 0; pass --n-fit 10 or more"),
])
def test_cli_bad_dimension_flags_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    from variants.cli import main

    assert main(["search", *SMALL, *argv, "--results-dir", str(tmp_path / "r"),
                 "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_tiny_search_walks_each_method_and_picks_int8_where_latency_is_cheapest(
        tmp_path, monkeypatch, capsys):
    """Synthetic sensitivity and kernel times (int8 the fastest Linear): bisect under
    --cost latency-b32 --w8a8 --quant-method rtn gptq. The rtn walk checks its two ends first:
    every Linear at its cheapest option (int8), then at its most expensive (8 bits); the gptq
    walk repeats the maps with the method in the id and the name. The learned quantizers'
    version is part of what a resume must match."""
    from variants.cli import main
    from variants.search import costs, driver

    def fake_sensitivity(self):
        self.sens_path = "synthetic"
        return {(p, b): (1.0 / (i + 1)) / (8.5 if b == INT8 else b)
                for i, p in enumerate(self.layers) for b in self.options}
    monkeypatch.setattr(driver.Search, "sensitivity", fake_sensitivity)
    monkeypatch.setattr(costs, "kernel_ms", lambda i, o, b, g, rows, repeats=5: i * o * 1e-6)
    monkeypatch.setattr(costs, "int8_kernel_ms",
                        lambda i, o, b, g, rows, repeats=5: i * o * 0.5e-6)
    argv = ["search", *SMALL, "--strategy", "bisect", "--cost", "latency-b32", "--w8a8",
            "--quant-method", "rtn", "gptq", "--max-candidates", "2",
            "--results-dir", str(tmp_path / "r"), "--out", str(tmp_path / "s")]
    assert main(argv) == 0
    res = json.loads((tmp_path / "s" / "search.json").read_text())
    recs = res["candidates"]
    assert [r.get("method", "rtn") for r in recs] == ["rtn", "rtn", "gptq", "gptq"]
    assert set(recs[0]["layer_bits"].values()) == {INT8}
    assert set(recs[1]["layer_bits"].values()) == {8}
    ms = sum(i * o * 1e-6 for i, o in [(384, 384)] * 4 + [(384, 1536), (1536, 384)]) * 6
    assert recs[1]["cost"] == pytest.approx(ms) and recs[0]["cost"] == pytest.approx(ms / 2)
    assert recs[2]["layer_bits"] == recs[0]["layer_bits"] and recs[2]["id"] != recs[0]["id"]
    assert recs[0]["name"].startswith("q8-g64-int8-") and recs[0]["int8"]
    assert re.fullmatch(r"q8-g64-gptq-int8-[0-9a-f]{6}", recs[2]["name"])
    assert recs[3]["name"] == "q8-g64-gptq" and recs[1]["name"] == "q8-g64"
    assert len({r["id"] for r in recs}) == 4
    for r in recs:
        assert (tmp_path / "s" / "candidates" / f"{r['id']}.json").exists()
    from variants.search.report import frame_of, markdown

    md = markdown(frame_of(recs), dict(res, winner=recs[2]), None)  # the re-run command
    assert f"`variants sweep --bits 8 --quant-method gptq --int8-layers '{recs[2]['int8']}'`" in md
    settings = json.loads((tmp_path / "s" / "search_settings.json").read_text())
    assert settings["quant_methods"] == ["rtn", "gptq"] and settings["w8a8"] is True
    from variants.families.quant import learned

    assert settings["quantizer_version"] == learned.VERSION
    # verdicts stored by another version of the learned quantizers are not resumed
    monkeypatch.setattr(learned, "VERSION", learned.VERSION + 1)
    assert main(argv) == 2
    assert "quantizer_version" in capsys.readouterr().err


def test_native_and_simulated_mixed_models_agree(model):
    """A layer with W8A8 and quantized Linears side by side (the compiled int8 op and the CPU
    quantized kernel natively): logits within fp32 round-off of the simulated model's."""
    from variants.datasets import bundled as data
    from variants.families.quant.family import build
    from variants.models import resolve

    frame = data.sample(data.split_frame(data.load_vader(), "calibration"), 8, seed=1)
    ts = resolve(model="minilm-sentiment").make_taskset(frame)
    cfg = QuantConfig(bits=6, group_size=64, int8=r"layers\.[01]\.(attention\.query|output)$")
    nat, info = build(model, cfg, mode="native")
    sim, _ = build(model, cfg, mode="simulated")
    assert len(info["int8_layers"]) == 4
    a, b = nat.raw_logits(ts), sim.raw_logits(ts)
    assert np.abs(a - b).max() <= 1e-3 * max(1.0, np.abs(b).max())
    assert np.abs(b - model.raw_logits(ts)).max() > 0


def test_method_sensitivity_quantizes_each_linear_as_its_build_does(model, tmp_path,
                                                                    monkeypatch):
    """A learned method's sensitivity row is the KL of the model with that one Linear replaced
    by the weight the method's build gives it (learned once, through the per-layer cache);
    a round trip that is round-to-nearest's reproduces round-to-nearest's table exactly."""
    from types import SimpleNamespace

    from metrics.divergence import kl_divergence_from_logits
    from variants.datasets import bundled as data
    from variants.families.quant import learned
    from variants.models import sentiment
    from variants.arch import activations
    from variants.search import dims, sensitivity

    frame = data.split_frame(data.load_vader(), "fit")
    fit = sentiment.make_taskset(data.sample(frame, 16, seed=0))
    rows = sentiment.make_taskset(data.sample(frame, 8, seed=1))
    q = "encoder.layers.0.attention.query"

    def rtn(path, bits, gs):
        w = dict(model.module.named_modules())[path].weight
        return mx.dequantize(*mx.quantize(w, group_size=gs, bits=bits), group_size=gs, bits=bits)
    plain = sensitivity.measure(model, rows, bits=(4,), paths=[q])
    same = sensitivity.measure(model, rows, bits=(4,), paths=[q], round_trip=rtn)
    assert plain.equals(same)

    monkeypatch.setattr(activations, "target_linears", lambda module, **_: [q])  # one Linear
    state = {"reference": model, "tasksets": {"fit": fit}}
    opts = SimpleNamespace(results_dir=str(tmp_path), bits=(4,), group_size=64)
    table = dims.method_sensitivity(state, "gptq", rows, [q, "encoder.embeddings.word_embeddings"],
                                    opts)
    assert set(table) == {(q, 4)}  # the embedding table keeps round-to-nearest's row
    got, _, facts = learned.learned_layers(
        model, QuantConfig(bits=4, method="gptq", bits_map=r"^encoder\.layers\.0\.attention\."
                           r"query$=4"), fit, cache_dir=tmp_path / ".cache")
    assert [(r["path"], r["reused"]) for r in facts["layers"]] == [(q, True)]  # learned once
    import copy

    work = model.replace_module(copy.deepcopy(model.module))
    ref = model.raw_logits(rows, model.prepare(rows, 32)[0]).astype(np.float64)
    from variants.families.quant import affine_codes

    dict(work.module.named_modules())[q].weight = mx.array(
        affine_codes.dequantize(*got[q][:3], 64))
    out = work.raw_logits(rows, work.prepare(rows, 32)[0])
    mask = np.asarray(rows.option_mask, bool)
    kl = float(kl_divergence_from_logits(ref, out, mask).mean())
    assert table[q, 4] == pytest.approx(kl, rel=1e-4, abs=1e-9)
    assert table[q, 4] != plain["kl_mean"].iloc[0]  # GPTQ's weight is not RTN's
    assert dims.method_sensitivity(state, "dwq", rows, [q], opts) == {}

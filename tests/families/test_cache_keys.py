"""Cache keys under results/.cache cover every setting that changes a prepared tensor.

Each setting of the tokenizer (max length, truncation side and strategy, padding, special
tokens, text cleaning, the tokenizer file itself) and the text of the data is changed in turn:
the prepared token ids change, and so do the tokenizer fingerprint and every cache key built
through ``DecisionModel.cache_key``. With the same settings the keys are stable. End to end,
reference outputs cached at max length 128 are not reused at 256 (and the long text's logits do
change).
"""

import json
from dataclasses import replace

import numpy as np
import pytest
from tokenizers import normalizers, processors

from variants.arch import activations
from variants.datasets import bundled as data
from variants.families.exit import heads as exit_heads
from variants.checkpoints.load import MAX_LENGTH, TextTokenizer, minilm_path
from variants.models import sentiment

TOKENIZER = minilm_path() / "tokenizer.json"
LONG = " ".join(["The movie was Great but the ending felt rushed and strange."] * 30)
SHORT = "Great film!"


def _cut_left(t):
    t.tokenizer.enable_truncation(max_length=MAX_LENGTH, strategy="longest_first",
                                  direction="left")


def _only_first(t):
    t.tokenizer.enable_truncation(max_length=MAX_LENGTH, strategy="only_first")


def _fixed_padding(t):
    t.tokenizer.enable_padding(length=MAX_LENGTH, pad_id=t.pad_id, pad_token="[PAD]")


def _no_sep(t):
    t.tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", pair="[CLS] $A $B:1", special_tokens=[("[CLS]", 101)])


def _keep_case(t):
    t.tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)


# name -> (how the TextTokenizer is made, or changed after construction)
SETTINGS = {
    "max_length": lambda t: None,  # built with max_length=256 below
    "truncation_side": _cut_left,
    "truncation_strategy": _only_first,
    "padding": _fixed_padding,
    "special_tokens": _no_sep,
    "normalizer": _keep_case,
    "tokenizer_file": lambda t: None,  # built from an edited tokenizer.json below
}


def _edited_file(tmp_path):
    """tokenizer.json with the ids of 'great' and 'film' swapped (same size, other ids)."""
    d = json.loads(TOKENIZER.read_text())
    vocab = d["model"]["vocab"]
    vocab["great"], vocab["film"] = vocab["film"], vocab["great"]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(d))
    return path


def _variant(name, tmp_path):
    if name == "max_length":
        return TextTokenizer(TOKENIZER, max_length=256)
    if name == "tokenizer_file":
        return TextTokenizer(_edited_file(tmp_path))
    t = TextTokenizer(TOKENIZER)
    SETTINGS[name](t)
    return t


def _prepared(t):
    """Token ids of a batch (long text, short text), the short text alone and a (long, long)
    pair, each padded as TextTokenizer.batch pads."""
    singles, _ = t.encode([LONG, SHORT])
    alone, _ = t.encode([SHORT])
    pair, _ = t.encode([LONG], pairs=[LONG[:len(LONG) // 4]])
    return [t.batch(e)[0].tolist() for e in (singles, alone, pair)]


@pytest.fixture(scope="module")
def model(checkpoint):
    return sentiment.build(checkpoint)


@pytest.fixture(scope="module")
def small(checkpoint):
    frame = data.sample(data.split_frame(data.load_vader(), "calibration"), 12, seed=0)
    return sentiment.make_taskset(frame)


def test_fingerprint_is_stable_for_the_same_settings(model, small):
    a, b = TextTokenizer(TOKENIZER), TextTokenizer(TOKENIZER)
    assert a.fingerprint() == b.fingerprint() == a.fingerprint()
    assert len(a.fingerprint()) == 16
    m1, m2 = model.replace_module(model.module), model.replace_module(model.module)
    m1.tokenizer, m2.tokenizer = a, b
    assert m1.cache_key("w", small.fingerprint()) == m2.cache_key("w", small.fingerprint())
    assert activations.stats_key(m1, small) == activations.stats_key(m2, small)
    s = a.settings()
    assert s == {"max_length": 128,
                 "truncation": {"strategy": "longest_first", "side": "right", "stride": 0},
                 "padding": s["padding"], "pad_id": 0, "fingerprint": a.fingerprint()}
    assert "longest in batch" in s["padding"]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_tokenizer_setting_changes_the_tensors_and_every_key(name, model, small, tmp_path):
    base, other = TextTokenizer(TOKENIZER), _variant(name, tmp_path)
    # the setting really changes a prepared tensor ...
    assert _prepared(base) != _prepared(other)
    # ... so the fingerprint and every cache key built from it change too
    assert base.fingerprint() != other.fingerprint()
    m_base, m_other = model.replace_module(model.module), model.replace_module(model.module)
    m_base.tokenizer, m_other.tokenizer = base, other
    parts = ("sha", "float32", small.fingerprint())
    assert m_base.cache_key(*parts) != m_other.cache_key(*parts)
    assert activations.stats_key(m_base, small) != activations.stats_key(m_other, small)
    if name == "max_length":
        assert other.settings()["max_length"] == 256 and base.settings()["max_length"] == 128
    if name == "truncation_side":
        assert other.settings()["truncation"]["side"] == "left"


def test_text_cleaning_in_the_data_changes_the_key(model, small):
    """Text preprocessing before the tokenizer (data.py, prompt wording) reaches the TaskSet,
    whose fingerprint is a key part: one changed character is a miss."""
    texts = small.texts.copy()
    texts[0] = texts[0].strip() + " "
    cleaned = replace(small, texts=texts)
    assert model.cache_key(small.fingerprint()) != model.cache_key(cleaned.fingerprint())
    assert activations.stats_key(model, small) != activations.stats_key(model, cleaned)


def test_exit_heads_cache_is_missed_after_a_tokenizer_change(model, small, tmp_path, monkeypatch):
    """trained_heads keys through cache_key: heads cached under one max length load (no
    training), the same call at another max length trains (here: hits the sentinel)."""
    m128 = model.replace_module(model.module)
    m256 = model.replace_module(model.module)
    m256.tokenizer = TextTokenizer(TOKENIZER, max_length=256)

    class Trained(Exception):
        pass

    def no_training(*a, **k):
        raise Trained

    monkeypatch.setattr(exit_heads, "split_features", no_training)
    with pytest.raises(Trained):  # learn the key the 128 model asks for
        exit_heads.trained_heads(m128, [2], 0.0, fit=small, cache_dir=tmp_path)
    key = m128.cache_key(exit_heads.module_digest(m128.module), small.fingerprint(), [2], 0.0,
                         exit_heads.HEAD_L2, "fastbert-kl-v1")
    w, b = np.ones((3, 384), np.float32), np.zeros(3, np.float32)
    (tmp_path / "exit_heads").mkdir(exist_ok=True)
    np.savez(tmp_path / "exit_heads" / f"{m128.name}-{key}.npz", w2=w, b2=b)
    heads, info = exit_heads.trained_heads(m128, [2], 0.0, fit=small, cache_dir=tmp_path)
    assert info["heads_cached"] and info["heads_cache_key"] == key
    np.testing.assert_array_equal(heads[0][0], w)
    with pytest.raises(Trained):
        exit_heads.trained_heads(m256, [2], 0.0, fit=small, cache_dir=tmp_path)


def test_reference_outputs_cached_at_128_are_not_reused_at_256(checkpoint, tmp_path):
    """Sweep.reference at max length 128, again at 128 (all from the cache), then at 256: the
    head, temperatures and outputs are recomputed, and the one eval text longer than 128 tokens
    gets other logits while the short ones keep theirs."""
    from contracts.checker import load_contract
    from variants.sweep.run import Sweep, SweepClock, SweepConfig

    frame = data.load_vader()
    ev = data.split_frame(frame, "eval")
    n_tokens = [len(e.ids) for e in TextTokenizer(TOKENIZER, max_length=512).encode(
        list(ev.text))[0]]
    long_ids = set(ev["id"][np.asarray(n_tokens) > 128])
    assert len(long_ids) == 1
    eval_frame = ev[ev["id"].isin(long_ids) | ev["id"].isin(data.sample(ev, 11)["id"])]
    tasksets = {"fit": sentiment.make_taskset(data.sample(data.split_frame(frame, "fit"), 40)),
                "calibration": sentiment.make_taskset(
                    data.sample(data.split_frame(frame, "calibration"), 20)),
                "eval": sentiment.make_taskset(eval_frame.reset_index(drop=True))}
    long_row = int(np.flatnonzero(np.isin(tasksets["eval"].ids, list(long_ids)))[0])

    def run(ck, run_name):
        cfg = SweepConfig(results_dir=str(tmp_path), run=run_name, n_fit=40, n_calibration=20,
                          n_eval=12, progress=False, cold_start="none",
                          timing_batch_sizes=(1,)).validate()
        sw = Sweep(cfg, log=lambda m: None)
        sw.checkpoint, sw.tasksets, sw.clock = ck, tasksets, SweepClock()
        sw.reference()
        return sw

    ck256 = replace(checkpoint, tokenizer=TextTokenizer(TOKENIZER, max_length=256))
    first = run(checkpoint, "a")
    assert first.ref_outputs_cached == {"calibration": False, "eval": False}
    again = run(checkpoint, "b")
    assert again.ref_outputs_cached == {"calibration": True, "eval": True}
    assert again.clock.counts["reference_output_batches"] == 0
    assert again.head_key == first.head_key
    longer = run(ck256, "c")
    assert longer.ref_outputs_cached == {"calibration": False, "eval": False}
    assert longer.clock.counts["reference_output_batches"] > 0
    assert longer.head_key != first.head_key
    assert longer.truncated["eval"] == 0 and first.truncated["eval"] == 1
    assert checkpoint.fingerprint() != ck256.fingerprint()
    # the long text reads 50 more tokens at 256 and its logits move; the short ones keep theirs
    # (no fit or calibration text is longer than 128 tokens, so the head is the same)
    a, b = first.ref_outputs["eval"].logits, longer.ref_outputs["eval"].logits
    assert np.abs(a[long_row] - b[long_row]).max() > 0.01  # 100x the tolerance below
    short = np.arange(len(a)) != long_row
    np.testing.assert_allclose(a[short], b[short], atol=1e-4)
    cache = sorted(p.name for p in (tmp_path / ".cache" / "reference").iterdir())
    # 2 splits x 2 max lengths, and the eval split's plain-path logits (numerical noise) of each
    assert len(cache) == 6 and sum("-eval-plain-" in n for n in cache) == 2
    # run.json records the settings that made the tensors
    longer.contract, longer.cold_start = load_contract(None), None
    tok = longer.metadata()["data"]["tokenizer"]
    assert tok == json.loads(json.dumps(ck256.tokenizer.settings()))
    assert tok["max_length"] == 256 and tok["truncation"]["strategy"] == "longest_first"
    assert tok["fingerprint"] != checkpoint.tokenizer.fingerprint()


def test_a_run_folder_swept_with_other_tokenizer_settings_is_not_resumed(checkpoint, tmp_path):
    """Variant outputs in a run folder are a cache too: run.json's ``data.tokenizer`` from a
    sweep at max length 256 makes a resume at 128 a SweepError naming the setting."""
    from runs.io import write_json
    from variants.sweep.run import Sweep, SweepConfig, SweepError

    cfg = SweepConfig(results_dir=str(tmp_path), run="r", progress=False).validate()
    sw = Sweep(cfg, log=lambda m: None)
    sw.checkpoint = checkpoint
    sw._check_run_tokenizer()  # no run.json yet: nothing to compare
    write_json(sw.out / "run.json", {"data": {"tokenizer": checkpoint.tokenizer.settings()}})
    sw._check_run_tokenizer()  # same settings: resumes
    other = TextTokenizer(TOKENIZER, max_length=256).settings()
    write_json(sw.out / "run.json", {"data": {"tokenizer": other}})
    with pytest.raises(SweepError, match=r"other tokenizer settings \{'max_length': \(256, 128\)"):
        sw._check_run_tokenizer()


# name -> (environment variables set, or None, and attributes patched) that change outputs
# besides data, weights and tokenizer: the versions and the compute path
COMPUTE = {
    "qkernel_off": ({"VARIANTS_QKERNEL": "off"}, {}),
    "fused_layer_off": ({"VARIANTS_FUSED_LAYER": "off"}, {}),
    "one_stream": ({"VARIANTS_STREAMS": "1"}, {}),
    "three_streams": ({"VARIANTS_STREAMS": "3"}, {}),
    "fused_threads": ({"VARIANTS_FUSED_THREADS": "1"}, {}),
    "modernbert_attention": ({"VARIANTS_MODERNBERT_ATTENTION": "masked"}, {}),
    "package_version": ({}, {"variants": "__version__"}),
    "mlx_version": ({}, {"mlx.core": "__version__"}),
}


@pytest.mark.parametrize("name", list(COMPUTE))
def test_versions_and_compute_path_are_in_every_key(name, model, small, monkeypatch, tmp_path):
    """The same model, tokenizer and data keyed under another package or MLX version, or with
    the compiled kernel, the fused layers or the stream split switched: the key changes (every
    cache keys through ``DecisionModel.cache_key``, as the tests above show, so reference
    outputs, heads, statistics and sensitivity tables are recomputed, never mixed in), and so
    does the name of the search's latency table; switched back, the keys are the old ones."""
    import importlib

    from variants.arch import compute_path
    from variants.search.costs import CostTable

    def base():  # the defaults, with the two-stream split whatever the machine's cores
        for var in ("VARIANTS_QKERNEL", "VARIANTS_FUSED_LAYER", "VARIANTS_FUSED_THREADS",
                    "VARIANTS_MODERNBERT_ATTENTION"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("VARIANTS_STREAMS", "2")
        for module, attr in attrs.items():
            monkeypatch.setattr(importlib.import_module(module), attr, versions[module])

    env, attrs = COMPUTE[name]
    versions = {m: getattr(importlib.import_module(m), a) for m, a in attrs.items()}
    base()

    def keys():
        table = CostTable.__new__(CostTable)
        table.group_size, table.layers, table.shape, table.latency = 64, [], {}, {}
        return (model.cache_key("sha", "float32", small.fingerprint()),
                table.load_latency("latency-b1", [4], tmp_path).name)

    before, part = keys(), compute_path.key_part()
    assert keys() == before
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    for module, attr in attrs.items():
        monkeypatch.setattr(importlib.import_module(module), attr, "0.0.0-other")
    after = keys()
    assert all(a != b for a, b in zip(before, after)), (before, after)
    assert compute_path.key_part() != part
    base()
    assert keys() == before

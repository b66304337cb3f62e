"""Per-layer sensitivity's suffix forward on ModernBERT (variants/search/suffix.py,
``ModernBertEncoder.layers_from``): a Linear of layer i re-runs layers i.. only, from the
reference's recorded input of layer i, and gives the whole model's rows (flip rates exact, KL
and max |dlogit| to float32 round-off). On the tiny random-init checkpoints of
tests/fixtures/hf wrapped by a ``logits = "classifier"`` model TOML (the checkpoint's own head:
``cls`` pooling on ``modernbert``, global attention every 3rd layer, window |q - k| <= 64;
``mean`` pooling and biases on ``modernbert_g2``, every 2nd layer, window |q - k| <= 32), on
padded batches of 8 texts with a long one of 170-250 tokens: the local layers' window masks
keys there."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

HF = Path(__file__).parents[1] / "fixtures" / "hf"
N_LAYERS = {"modernbert": 6, "modernbert_g2": 4}


@pytest.fixture(scope="module", params=list(N_LAYERS))
def fitted(request, tmp_path_factory):
    from variants.checkpoints.load import load_checkpoint
    from variants.datasets import bundled as data
    from variants.models import resolve

    name = request.param
    toml = tmp_path_factory.mktemp("mb") / "m.toml"
    toml.write_text(f'name = "tiny-{name}"\nlogits = "classifier"\n'
                    f'checkpoint = "{HF / name}"\n'
                    'options = ["negative", "neutral", "positive"]\n'
                    'actions = ["escalate", "review", "none"]\n', encoding="utf-8")
    source = resolve(model_config=toml)
    checkpoint = load_checkpoint(HF / name)
    model = source.bind(checkpoint).build(checkpoint)
    frame = data.sample(data.split_frame(data.load_vader(), "calibration"), 14, seed=0)
    frame = frame.reset_index(drop=True)
    frame.loc[[3, 11], "text"] = [" ".join(frame.text[:4]), " ".join(frame.text[8:12])]
    ts = source.make_taskset(frame)
    # the random head puts option 2 ahead on every row by 0.1-4: move the bias so that rows 0
    # and 1 sit 2e-5 below a tie (0 vs 2, 1 vs 2), and some round trips flip them
    logits = np.asarray(model.raw_logits(ts), np.float64)
    head = model.module.classifier.classifier
    shift = np.zeros(3)
    shift[0] = logits[0, 2] - logits[0, 0] - 2e-5
    shift[1] = logits[1, 2] - logits[1, 1] - 2e-5
    head.bias = head.bias + mx.array(shift.astype(np.float32))
    model._reset_caches()
    return name, model, ts


def _batches(model, ts):
    batches = model.prepare(ts, 8)[0]
    lengths = sorted(b.input_ids.shape[1] for b in batches)
    masks = [np.asarray(b.attention_mask) for b in batches]
    assert lengths[-1] >= 170 and all(not m.all() for m in masks)  # long, padded batches
    return batches


def test_sensitivity_suffix_forward_equals_full_forward(fitted, monkeypatch):
    """Linears of the first, a middle and the last layer from their own layer on; the token
    embedding table runs in full; every row equals the full forward's."""
    from variants.search import sensitivity, suffix

    name, model, ts = fitted
    n = N_LAYERS[name]
    _batches(model, ts)
    starts = []
    real = suffix.SuffixCache.start_at
    monkeypatch.setattr(suffix.SuffixCache, "start_at",
                        lambda self, i: starts.append(i) or real(self, i))
    units = ["encoder.embeddings.tok_embeddings", "encoder.layers.0.attn.Wqkv",
             "encoder.layers.1.mlp.Wo", f"encoder.layers.{n // 2}.attn.Wo",
             f"encoder.layers.{n - 1}.mlp.Wi"]
    fast = sensitivity.measure(model, ts, bits=(2, 4), paths=units, batch_size=8,
                              group_size=32)
    assert starts == [0, 0, 1, 1, n // 2, n // 2, n - 1, n - 1]
    full = sensitivity.measure(model, ts, bits=(2, 4), paths=units, batch_size=8, group_size=32,
                               suffix_forward=False)
    assert fast["layer"].tolist() == full["layer"].tolist() == [u for u in units for _ in "ab"]
    assert (full["kl_mean"] > 1e-7).all() and (full["max_abs_dlogit"] > 1e-4).all()
    np.testing.assert_allclose(fast["kl_mean"], full["kl_mean"], rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(fast["max_abs_dlogit"], full["max_abs_dlogit"], rtol=1e-4,
                               atol=1e-6)
    assert fast["flip_rate"].tolist() == full["flip_rate"].tolist()
    assert 0 < full["flip_rate"].max() < 1
    assert fast["n"].tolist() == full["n"].tolist() == [len(ts)] * len(units) * 2


def test_suffix_hidden_states_equal_the_whole_stack_from_every_layer(fitted):
    """From the recorded input of each layer, the suffix gives the full call's last hidden
    states (float32 round-off); a change to a layer before the start is not seen, one at or
    after it is; a batch never recorded runs the whole stack; the class is restored."""
    import copy

    from variants.arch.modernbert import ModernBertEncoder
    from variants.search import suffix

    name, model, ts = fitted
    mod = copy.deepcopy(model.module)
    enc = mod.encoder
    batches = _batches(model, ts)
    cache = suffix.SuffixCache(mod)
    refs = []
    with cache.record():
        for b in batches:
            refs.append(np.array(enc(b.input_ids, b.attention_mask).last_hidden))
    assert len(cache.states) == len(batches)
    assert {len(v) for v in cache.states.values()} == {N_LAYERS[name]}
    for b, ref in zip(batches, refs):
        real = np.asarray(b.attention_mask, bool)
        full = np.array(enc(b.input_ids, b.attention_mask).last_hidden)
        np.testing.assert_allclose(full[real], ref[real], rtol=0, atol=2e-5)
        for i in range(N_LAYERS[name]):
            with cache.start_at(i):
                got = np.array(enc(b.input_ids, b.attention_mask).last_hidden)
            np.testing.assert_allclose(got[real], ref[real], rtol=0, atol=2e-5)
    assert cache.hits == len(batches) * N_LAYERS[name]
    b, ref = batches[-1], refs[-1]
    real = np.asarray(b.attention_mask, bool)
    enc.layers[0].mlp.Wo.weight = enc.layers[0].mlp.Wo.weight * 0
    with cache.start_at(1):
        same = np.array(enc(b.input_ids, b.attention_mask).last_hidden)
        other = np.array(enc(b.input_ids[:1], b.attention_mask[:1]).last_hidden)
    np.testing.assert_allclose(same[real], ref[real], rtol=0, atol=2e-5)
    assert np.abs(other[0][real[0]] - ref[0][real[0]]).max() > 1e-2  # not recorded: runs all
    enc.layers[1].mlp.Wo.weight = enc.layers[1].mlp.Wo.weight * 0
    with cache.start_at(1):
        moved = np.array(enc(b.input_ids, b.attention_mask).last_hidden)
    assert np.abs(moved[real] - ref[real]).max() > 1e-2
    assert type(enc) is ModernBertEncoder


def test_the_local_window_and_padding_matter_on_these_batches(fitted):
    """The batches discriminate a wrong suffix: every layer's stack from layer 1 with all
    layers global, or with the padding unmasked, moves the real tokens' last hidden states
    by more than 100x the tolerance above."""
    name, model, ts = fitted
    enc = model.module.encoder
    b = max(_batches(model, ts), key=lambda b: b.input_ids.shape[1])
    real = np.asarray(b.attention_mask, bool)
    hidden = enc(b.input_ids, b.attention_mask, output_hidden_states=True).hidden_states
    ref = np.array(enc.finish(enc.layers_from(1, hidden[1], b.attention_mask)))
    unmasked = np.array(enc.finish(enc.layers_from(1, hidden[1], mx.ones_like(b.attention_mask))))
    assert np.abs(unmasked[real] - ref[real]).max() > 2e-3
    kinds = [layer.is_global for layer in enc.layers]
    try:
        for layer in enc.layers:
            layer.is_global = True
        all_global = np.array(enc.finish(enc.layers_from(1, hidden[1], b.attention_mask)))
    finally:
        for layer, k in zip(enc.layers, kinds):
            layer.is_global = k
    assert not all(kinds) and np.abs(all_global[real] - ref[real]).max() > 2e-3

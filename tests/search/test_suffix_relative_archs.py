"""Per-layer sensitivity's suffix forward (variants/search/suffix.py) on MPNet, DeBERTa-v3 and
DeBERTa-v2 (layer 0 with its convolution): from the reference's recorded input of layer i the
stack gives the full call's last hidden states, and the sensitivity table equals the one the
whole model gives (flip rates exact, KL and max |dlogit| to float32 round-off). On the tiny
random-init fixtures wrapped by a ``logits = "classifier"`` model TOML, padded batches of 7
texts, one at the models' max length (128 tokens)."""

import copy
from pathlib import Path

import numpy as np
import pytest

HF = Path(__file__).parents[1] / "fixtures" / "hf"
ARCHS = {"mpnet": "attention.query", "deberta_v3": "attention.key",
         "deberta_v2": "attention.value"}


@pytest.fixture(scope="module", params=list(ARCHS))
def fitted(request, tmp_path_factory):
    from variants.checkpoints.load import load_checkpoint
    from variants.datasets import bundled as data
    from variants.models import resolve

    name = request.param
    toml = tmp_path_factory.mktemp(name) / "m.toml"
    toml.write_text(f'name = "tiny-{name}"\nlogits = "classifier"\n'
                    f'checkpoint = "{HF / name}"\n'
                    'options = ["negative", "neutral", "positive"]\n'
                    'actions = ["escalate", "review", "none"]\n', encoding="utf-8")
    source = resolve(model_config=toml)
    checkpoint = load_checkpoint(HF / name)
    model = source.bind(checkpoint).build(checkpoint)
    frame = data.sample(data.split_frame(data.load_vader(), "calibration"), 14, seed=0)
    frame = frame.reset_index(drop=True)
    frame.loc[3, "text"] = " ".join(frame.text)  # truncated at 128 tokens
    return name, model, source.make_taskset(frame)


def test_suffix_from_every_layer_equals_the_whole_stack(fitted):
    from variants.search import suffix

    name, model, ts = fitted
    mod = copy.deepcopy(model.module)
    enc = mod.encoder
    batches = model.prepare(ts, 7)[0]
    assert max(b.input_ids.shape[1] for b in batches) == 128
    cache = suffix.SuffixCache(mod)
    with cache.record():
        refs = [np.array(enc(b.input_ids, b.attention_mask).last_hidden) for b in batches]
    n = len(enc.layers)
    for b, ref in zip(batches, refs):
        real = np.asarray(b.attention_mask, bool)
        assert not real.all()
        for i in range(n):
            with cache.start_at(i):
                got = np.array(enc(b.input_ids, b.attention_mask).last_hidden)
            np.testing.assert_allclose(got[real], ref[real], rtol=0, atol=2e-5)
    assert cache.hits == len(batches) * n
    b, ref = batches[0], refs[0]
    real = np.asarray(b.attention_mask, bool)
    enc.layers[1].output.weight = enc.layers[1].output.weight * 0  # at the start: seen
    with cache.start_at(1):
        moved = np.array(enc(b.input_ids, b.attention_mask).last_hidden)
    assert np.abs(moved[real] - ref[real]).max() > 1e-2
    assert type(enc).__name__ in ("MPNetEncoder", "DebertaEncoder")


def test_sensitivity_suffix_forward_equals_full_forward(fitted, monkeypatch):
    from variants.search import sensitivity, suffix

    name, model, ts = fitted
    units = ["encoder.embeddings.word_embeddings", f"encoder.layers.0.{ARCHS[name]}",
             "encoder.layers.1.intermediate", "encoder.layers.2.attention.out"]
    starts = []
    real = suffix.SuffixCache.start_at
    monkeypatch.setattr(suffix.SuffixCache, "start_at",
                        lambda self, i: starts.append(i) or real(self, i))
    fast = sensitivity.measure(model, ts, bits=(2,), paths=units, batch_size=7, group_size=32)
    assert starts == [0, 1, 2]  # the embedding table runs the whole model
    monkeypatch.undo()
    full = sensitivity.measure(model, ts, bits=(2,), paths=units, batch_size=7, group_size=32,
                               suffix_forward=False)
    assert fast["layer"].tolist() == full["layer"].tolist() == units
    assert (full["max_abs_dlogit"] > 1e-5).all()
    np.testing.assert_allclose(fast["kl_mean"], full["kl_mean"], rtol=1e-3, atol=1e-9)
    np.testing.assert_allclose(fast["max_abs_dlogit"], full["max_abs_dlogit"], rtol=1e-3,
                               atol=1e-6)
    assert fast["flip_rate"].tolist() == full["flip_rate"].tolist()

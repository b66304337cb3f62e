"""MPNet and DeBERTa-v2/v3 beyond the parity sweep (tests/checkpoints/test_parity_hf.py): the
relative-position buckets equal transformers' at every distance -1024..1024 (stored by
scripts/make_parity_fixtures.py), the per-layer interface (embed / context / apply_layer /
finish) reproduces the encoder's call, a context after ``take_tokens`` keeps the kept tokens'
original distances (attention among kept tokens is the full attention renormalised), and
configurations the encoders cannot compute are refused in one line."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from variants.arch.deberta import DebertaArgs, relative_table
from variants.arch.deberta_attention import log_bucket_position
from variants.arch.mpnet import MPNetArgs, relative_position_bucket
from variants.checkpoints.files import CheckpointError
from variants.checkpoints.load import load_checkpoint

HF = Path(__file__).parents[1] / "fixtures" / "hf"
NAMES = ["mpnet", "deberta_v3", "deberta_v2"]


@pytest.fixture(scope="module")
def loaded():
    return {n: load_checkpoint(HF / n) for n in NAMES}


def _ref(name):
    return dict(np.load(HF / name / "reference.npz"))


def _batch(ref):
    return tuple(mx.array(ref[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))


def test_buckets_equal_transformers_at_every_distance():
    r = _ref("mpnet")
    np.testing.assert_array_equal(relative_position_bucket(r["relative"]), r["buckets"])
    # T5's layout by hand: keys after the query in 16..31, 8 exact distances, log up to 128
    assert relative_position_bucket([0, -1, 7, -8, 8, 15, 16, 127, 128, 5000]).tolist() == \
        [0, 1, 23, 8, 24, 25, 26, 31, 31, 31]
    r = _ref("deberta_v3")
    np.testing.assert_array_equal(log_bucket_position(r["relative"], 32, 128), r["buckets"])
    np.testing.assert_array_equal(relative_table(1024, 32, 128), r["buckets"])
    # |d| < 16 exact; ceil(log(d / 16) / log(127 / 16) * 15) + 16 beyond, up to d = 127 -> 31
    assert log_bucket_position([0, 15, -16, 17, 127, 128, -1000], 32, 128).tolist() == \
        [0, 15, -16, 17, 31, 32, -46]
    np.testing.assert_array_equal(relative_table(1024, -1, 48), _ref("deberta_v2")["buckets"])


@pytest.mark.parametrize("name", NAMES)
def test_the_fixture_reaches_the_max_length(name, loaded):
    ids = _ref(name)["input_ids"]
    assert ids.shape[1] == 128 == loaded[name].tokenizer.settings()["max_length"]


@pytest.mark.parametrize("name", NAMES)
def test_per_layer_interface_reproduces_the_call(name, loaded):
    enc = loaded[name].encoder
    ids, mask, types = _batch(_ref(name))
    want = enc(ids, mask, types, output_hidden_states=True).hidden_states
    x = enc.embed(ids, types)
    ctx = enc.context(mask)
    real = np.array(mask).astype(bool)
    for i in range(len(enc.layers)):
        x, _ = enc.apply_layer(i, x, ctx)
        np.testing.assert_allclose(np.array(x)[real], np.array(want[i + 1])[real], atol=1e-5)
    # explicit positions 0..L-1 (a per-row bias) give what the shared one gives
    pos = mx.broadcast_to(mx.arange(ids.shape[1]), ids.shape)
    y, _ = enc.apply_layer(1, want[1], enc.context(mask, pos))
    np.testing.assert_allclose(np.array(y)[real], np.array(want[2])[real], atol=1e-5)
    # a context of some rows is the batch's context for them
    rows = mx.array([3, 0])
    z, _ = enc.apply_layer(1, want[1][rows], ctx.take_rows(rows))
    np.testing.assert_allclose(np.array(z), np.array(want[2])[np.array(rows)], atol=1e-5)
    assert np.array_equal(np.array(enc.finish(x)), np.array(x))


@pytest.mark.parametrize("name", NAMES)
def test_kept_tokens_keep_their_distances(name, loaded):
    """After take_tokens the scores among kept tokens are the full scores: each kept query's
    attention over the kept keys is its full attention restricted and renormalised. Token slots
    renumbered 0..L'-1 would change every distance and fail this."""
    enc = loaded[name].encoder
    ids, mask, types = _batch(_ref(name))
    row = 4  # the 128-token text
    x = enc(ids, mask, types, output_hidden_states=True).hidden_states[1][row:row + 1]
    m = mask[row:row + 1]
    _, full = enc.apply_layer(1, x, enc.context(m), return_attention=True)
    keep = np.r_[0:5, 9:40:3, 60:70, 100:128]  # gaps short and long (bucketed distances)
    index = mx.array(keep[None].astype(np.int32))
    ctx = enc.context(m).take_tokens(index, mx.ones(index.shape, mx.int32))
    _, part = enc.apply_layer(1, mx.take_along_axis(x, index[..., None], axis=1), ctx,
                              return_attention=True)
    sub = np.array(full)[0][:, keep][:, :, keep]
    np.testing.assert_allclose(np.array(part)[0], sub / sub.sum(-1, keepdims=True), atol=2e-6)


def _copy(name, tmp_path, **changes):
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        cfg.pop(k)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_deberta_v1_and_unknown_layouts_are_refused_in_one_line(tmp_path):
    with pytest.raises(CheckpointError, match="model_type 'deberta', which is not supported"):
        load_checkpoint(_copy("deberta_v3", tmp_path, model_type="deberta",
                              architectures=["DebertaForSequenceClassification"]))
    for change, match in ((dict(conv_kernel_size=4), "conv_kernel_size 4 is even"),
                          (dict(attention_head_size=8), "attention_head_size 8 x 4 heads"),
                          (dict(pooler_hidden_act="swish"), "pooler_hidden_act 'swish'")):
        with pytest.raises(CheckpointError, match=match) as e:
            load_checkpoint(_copy("deberta_v2", tmp_path / match[:4], **change))
        assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="relative_attention_num_buckets 16 is below"):
        load_checkpoint(_copy("mpnet", tmp_path, relative_attention_num_buckets=16))


def test_deberta_config_spellings(tmp_path, loaded):
    """``pos_att_type`` as transformers' ``"p2c|c2p"`` string, a missing model_type (read from
    ``architectures``) and a stray absolute position table beside ``position_biased_input``
    false (transformers ignores it) load the same model."""
    a = DebertaArgs.from_dict(dict(vocab_size=8, hidden_size=8, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=8,
                                   pos_att_type="P2C | c2p", max_position_embeddings=64))
    assert a.pos_att_type == ["p2c", "c2p"] and a.att_span == a.max_relative == 64
    folder = _copy("deberta_v3", tmp_path, model_type=None, pos_att_type="c2p|p2c")
    from safetensors.numpy import load_file, save_file

    w = load_file(folder / "model.safetensors")
    w["deberta.embeddings.position_embeddings.weight"] = np.ones((128, 64), np.float32)
    save_file(w, folder / "model.safetensors")
    ck = load_checkpoint(folder)
    assert ck.args.model_type == "deberta-v2" and "position_embeddings" not in ck.encoder.embeddings
    ids, mask, types = _batch(_ref("deberta_v3"))
    np.testing.assert_array_equal(np.array(ck.encoder(ids, mask).last_hidden),
                                  np.array(loaded["deberta_v3"].encoder(ids, mask).last_hidden))
    assert MPNetArgs(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=8, max_position_embeddings=130).position_cap == 128


@pytest.mark.parametrize("name", NAMES)
def test_no_bert_fast_path_runs_these_layers(name, loaded):
    """BERT's compiled layer and ModernBERT's carry no relative positions: timing records name
    none of them for these encoders (their layers run on the MLX path)."""
    from variants.arch import encoder, modernbert

    enc = loaded[name].encoder
    assert encoder.compiled_paths(enc) is None and modernbert.compiled_paths(enc) is None
    assert not any(isinstance(m, encoder.TransformerLayer) for _, m in enc.named_modules())

"""Parity of the MLX encoders with Hugging Face ``transformers`` (eager attention) on the tiny
random-init checkpoints in ``tests/fixtures/hf/`` (made by ``scripts/make_parity_fixtures.py``;
PyTorch is not needed here): every layer's hidden states and the logits within 1e-4 max abs,
with padding in the batch; ModernBERT with a 300-token row beside short ones (window 128 and a
global-every-2 config with window 64, mean pooling and every bias on); MPNet and DeBERTa-v3 /
DeBERTa-v2 (relative positions: :mod:`tests.checkpoints.test_relative_archs`) with a row at the
model's max length (128 tokens). The tokenizer decisions
reproduce the ids the script made with ``tokenizers``."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from variants.checkpoints.load import load_checkpoint

HF = Path(__file__).parents[1] / "fixtures" / "hf"
NAMES = ["bert", "roberta", "modernbert", "modernbert_g2", "mpnet", "deberta_v3", "deberta_v2"]
TOL = 1e-4


@pytest.fixture(scope="module")
def loaded():
    return {n: load_checkpoint(HF / n) for n in NAMES}


def _ref(name):
    return dict(np.load(HF / name / "reference.npz"))


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_reproduces_the_reference_batch(name, loaded):
    ck, ref = loaded[name], _ref(name)
    encs, n_trunc = ck.tokenizer.encode([str(t) for t in ref["texts"]])
    ids, mask, types = ck.tokenizer.batch(encs)
    assert n_trunc == 0
    np.testing.assert_array_equal(ids, ref["input_ids"])
    np.testing.assert_array_equal(mask, ref["attention_mask"])
    assert ck.tokenizer.pad_id == {"roberta": 1, "mpnet": 1}.get(name, 0)


@pytest.mark.parametrize("name", NAMES)
def test_every_layer_and_the_logits_match_transformers(name, loaded):
    ck, ref = loaded[name], _ref(name)
    ids, mask = mx.array(ref["input_ids"]), mx.array(ref["attention_mask"])
    types = mx.array(ref["token_type_ids"])
    assert (ref["attention_mask"] == 0).any()  # padding in the batch
    out = ck.encoder(ids, mask, types, output_hidden_states=True)
    real = ref["attention_mask"].astype(bool)
    hidden = np.stack([np.array(h)[real] for h in out.hidden_states])
    assert hidden.shape == ref["hidden"].shape
    diffs = np.abs(hidden - ref["hidden"]).max(axis=(1, 2))
    assert diffs.max() <= TOL, diffs
    last = np.array(out.last_hidden)[real]
    assert np.abs(last - ref["last_hidden"]).max() <= TOL
    logits = np.array(ck.classifier(out.last_hidden, mask))
    assert logits.shape == (len(real), 3)
    assert np.abs(logits - ref["logits"]).max() <= TOL
    # the references are not trivially small: a wrong layer would show
    assert np.abs(ref["logits"]).max() > 0.05 and np.abs(ref["hidden"][-1]).std() > 0.1
    # the fast (packed / stream) default path agrees with the layer-by-layer one
    fast = np.array(ck.encoder(ids, mask, types).last_hidden)[real]
    assert np.abs(fast - last).max() <= 1e-5


def test_modernbert_reads_the_layer_pattern_and_window(loaded):
    a, b = loaded["modernbert"], loaded["modernbert_g2"]
    assert [layer.is_global for layer in a.encoder.layers] == [True, False, False] * 2
    assert [layer.is_global for layer in b.encoder.layers] == [True, False] * 2
    assert (a.args.local_attention, b.args.local_attention) == (128, 64)
    assert b.args.classifier_pooling == "mean" and b.args.norm_bias
    assert a.id2label == ["negative", "neutral", "positive"]
    assert a.tokenizer.settings()["max_length"] == 512  # tokenizer_config model_max_length


def test_modernbert_old_config_layout_gives_the_same_outputs(loaded, tmp_path):
    """transformers 4.x wrote global/local_rope_theta and global_attn_every_n_layers instead of
    rope_parameters / layer_types: both layouts load to the same model."""
    folder = tmp_path / "old"
    shutil.copytree(HF / "modernbert_g2", folder)
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg.update(global_rope_theta=rope["full_attention"]["rope_theta"],
               local_rope_theta=rope["sliding_attention"]["rope_theta"],
               global_attn_every_n_layers=2)
    (folder / "config.json").write_text(json.dumps(cfg))
    old = load_checkpoint(folder)
    ref = _ref("modernbert_g2")
    ids, mask = mx.array(ref["input_ids"]), mx.array(ref["attention_mask"])
    np.testing.assert_array_equal(np.array(old.encoder(ids, mask).last_hidden),
                                  np.array(loaded["modernbert_g2"].encoder(ids, mask).last_hidden))


def test_tokenizer_decisions_follow_the_files(loaded):
    bert, rob = loaded["bert"].tokenizer.settings(), loaded["roberta"].tokenizer.settings()
    assert bert["max_length"] == 128  # tokenizer.json's baked truncation wins over 512
    assert "tokenizer.json truncation" in bert["decided"]["max_length"]
    # RoBERTa: model_max_length 512 capped by the table: 130 positions - pad id 1 - 1
    assert rob["max_length"] == 128 and "capped" in rob["decided"]["max_length"]
    assert rob["pad_id"] == 1 and "<pad>" in rob["padding"]
    assert loaded["bert"].tokenizer.fingerprint() != loaded["roberta"].tokenizer.fingerprint()

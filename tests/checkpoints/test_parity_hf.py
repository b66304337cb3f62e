"""Parity of the MLX encoders with Hugging Face ``transformers`` (eager attention) on the tiny
random-init checkpoints in ``tests/fixtures/hf/`` (made by ``scripts/make_parity_fixtures.py``;
PyTorch is not needed here): every layer's hidden states and the logits within 1e-4 max abs,
with padding in the batch; ModernBERT with a 300-token row beside short ones (window 128 and a
global-every-2 config with window 64, mean pooling and every bias on); DistilBERT, ELECTRA
(embedding_size 32 projected to 64) and ALBERT (4 passes over 2 shared groups; 3 passes over
one group of 2 layers) with a row of 125-128 tokens, their 128-position tables' limit; MPNet and DeBERTa-v3 / DeBERTa-v2 (relative
positions: :mod:`tests.checkpoints.test_relative_archs`) with a row of 128 tokens; XLM-R
(RoBERTa's network, a SentencePiece-style Unigram tokenizer) with a row of 128 tokens, its
130-position table's limit after ``pad_token_id`` 1. The tokenizer decisions reproduce the ids
the script made with ``tokenizers``."""

import json
import re
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from variants.checkpoints.load import load_checkpoint

HF = Path(__file__).parents[1] / "fixtures" / "hf"
NAMES = ["bert", "roberta", "modernbert", "modernbert_g2", "distilbert", "electra", "albert",
         "albert_inner2", "mpnet", "deberta_v3", "deberta_v2", "xlm_roberta"]
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
    assert ck.tokenizer.pad_id == {"roberta": 1, "mpnet": 1, "xlm_roberta": 1}.get(name, 0)


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
    # XLM-R: the same rule and pad token through a SentencePiece (Unigram) tokenizer; the
    # 128-token reference row puts its last token at position 129, the table's last row
    xlmr = loaded["xlm_roberta"]
    x = xlmr.tokenizer.settings()
    assert x["max_length"] == 128 and "capped" in x["decided"]["max_length"]
    assert x["pad_id"] == 1 and xlmr.args.model_type == "xlm-roberta"
    assert json.loads(xlmr.tokenizer.tokenizer.to_str())["model"]["type"] == "Unigram"
    assert type(xlmr.classifier) is type(loaded["roberta"].classifier)
    assert _ref("xlm_roberta")["attention_mask"].sum(1).max() == 128


def test_new_architectures_read_their_configs_and_share_albert_groups(loaded):
    from mlx.utils import tree_flatten

    from variants.runtime.memory import model_bytes

    d, e, a, a2 = (loaded[n] for n in ("distilbert", "electra", "albert", "albert_inner2"))
    assert (d.args.hidden_size, d.args.num_hidden_layers, d.args.intermediate_size) == (64, 3, 128)
    assert "token_type_embeddings" not in d.encoder.embeddings
    assert e.encoder.embeddings.project.weight.shape == (64, 32)  # embedding_size -> hidden
    assert a.args.hidden_act == "gelu_new" and a.args.layer_norm_eps == 1e-12
    assert a2.args.layer_norm_eps == 1e-6
    # passes 0, 1 run group 0 and 2, 3 group 1: the same arrays, stored once
    w = [layer.attention.query.weight for layer in a.encoder.layers]
    assert w[0] is w[1] and w[2] is w[3] and w[1] is not w[2]
    assert not np.array_equal(np.array(w[1]), np.array(w[2]))
    assert [a.args.group_of(i) for i in range(4)] == [0, 0, 1, 1]
    # one group of 2 layers run 3 times: 6 layers, (0, 2, 4) and (1, 3, 5) shared
    v = [layer.output.weight for layer in a2.encoder.layers]
    assert len(v) == 6 and v[0] is v[2] is v[4] and v[1] is v[3] is v[5] and v[0] is not v[1]

    # model_bytes counts an array the tree reaches twice once: the 2 groups, not the 4 passes
    V, E, D, F = a.args.vocab_size, 32, 64, 128
    emb = (V + 128 + 2 + 2) * E + E * D + D
    layer = 4 * (D * D + D) + 4 * D + (D * F + F) + (F * D + D)
    module = type("Net", (), {"module": a.encoder})
    assert model_bytes(module) == 4 * (emb + 2 * layer)
    assert sum(x.nbytes for _, x in tree_flatten(a.encoder.parameters())) == 4 * (emb + 4 * layer)


@pytest.mark.parametrize("key,value,says", [
    ("position_embedding_type", "relative_key", "position_embedding_type 'relative_key', which is "
                                                 "not implemented"),
    ("num_hidden_groups", 5, "num_hidden_groups (5) exceeds num_hidden_layers (4)"),
])
def test_albert_config_values_not_computed_are_refused_in_one_line(tmp_path, key, value, says):
    from variants.checkpoints.files import CheckpointError

    folder = tmp_path / "albert"
    shutil.copytree(HF / "albert", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=re.escape(says)) as e:
        load_checkpoint(folder)
    assert "\n" not in str(e.value)


def test_electra_relative_positions_and_distilbert_missing_dim_are_refused(tmp_path):
    from variants.checkpoints.files import CheckpointError

    for name, edit, says in (
            ("electra", {"position_embedding_type": "relative_key_query"},
             "position_embedding_type 'relative_key_query', which is not implemented"),
            ("distilbert", {"dim": None}, "is incomplete for model_type distilbert (missing \"'dim'\")")):
        folder = tmp_path / name
        shutil.copytree(HF / name, folder)
        cfg = json.loads((folder / "config.json").read_text())
        for k, v in edit.items():
            cfg.pop(k) if v is None else cfg.__setitem__(k, v)
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(CheckpointError, match=re.escape(says)) as e:
            load_checkpoint(folder)
        assert "\n" not in str(e.value)


def test_electra_with_embedding_size_equal_to_hidden_has_no_projection_and_is_bert(loaded):
    """ELECTRA-large's layout (embedding_size == hidden_size: no ``embeddings_project``): the
    BERT fixture's weights loaded into an ElectraEncoder give BERT's outputs."""
    from mlx.utils import tree_flatten

    from variants.arch.electra import ElectraArgs, ElectraEncoder

    bert = loaded["bert"]
    cfg = json.loads((HF / "bert" / "config.json").read_text())
    enc = ElectraEncoder(ElectraArgs.from_dict(dict(cfg, model_type="electra",
                                                    embedding_size=cfg["hidden_size"])))
    assert "project" not in enc.embeddings
    enc.load_weights(tree_flatten(bert.encoder.parameters()), strict=True)
    ref = _ref("bert")
    ids, mask = mx.array(ref["input_ids"]), mx.array(ref["attention_mask"])
    types = mx.array(ref["token_type_ids"])
    real = ref["attention_mask"].astype(bool)
    got = np.array(enc(ids, mask, types).last_hidden)[real]
    want = np.array(bert.encoder(ids, mask, types).last_hidden)[real]
    assert np.abs(got - want).max() <= 1e-5 and np.abs(want).std() > 0.1


def test_albert_layers_of_a_group_share_their_derived_weights(loaded):
    """The fast paths' folded / transposed weights are built once per group, in the reference
    and in a deep copy (a variant); a layer whose weights are replaced gets its own, the
    others keep theirs; outputs unchanged."""
    import copy

    enc = loaded["albert"].encoder
    L = enc.layers
    assert L[0].attention.folded() is L[1].attention.folded()
    assert L[2].mlp_weights() is L[3].mlp_weights()
    assert L[1].attention.folded() is not L[2].attention.folded()  # another group
    ref = _ref("albert")
    ids, mask = mx.array(ref["input_ids"]), mx.array(ref["attention_mask"])
    want = np.array(enc(ids, mask).last_hidden)
    var = copy.deepcopy(enc)
    a, b = var.layers[0].attention, var.layers[1].attention
    shared = b.folded()
    assert a.folded() is shared and shared is not L[0].attention.folded()
    a.query.weight = a.query.weight * 1.0  # a new array with the same values
    assert a.folded() is not shared and b.folded() is shared and a.folded() is a.folded()
    np.testing.assert_array_equal(np.array(var(ids, mask).last_hidden), want)

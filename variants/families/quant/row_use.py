"""How often each row of a model's word-embedding table is used: the token ids its tokenizer
gives a set of texts (issue 42, item 3: the fit texts and a user's ``--embedding-texts FILE``
decide which rows are stored wider, :mod:`variants.runtime.row_embedding`).

A row is *used* once per position of an encoded text that looks it up: every id the tokenizer
gives, the special tokens it adds (``[CLS]``, ``[SEP]``) included; padding is not counted (a
padded position is masked out of the model's output). For a TaskSet the texts are what the model
reads (:meth:`variants.models.decision.DecisionModel.model_inputs`: a prompt rendered, text
pairs), plus each distinct option text once (the choice kinds encode them once per model).
"""

from pathlib import Path

import numpy as np

#: the module names of a word-embedding table in this package's encoders
WORD_TABLES = ("word_embeddings", "tok_embeddings", "embed_tokens")


def word_table(module):
    """``(path, layer)`` of the word-embedding table inside ``module`` (the first module whose
    name is one of :data:`WORD_TABLES`).

    Raises
    ------
    ValueError
        No such module.
    """
    for path, m in module.named_modules():
        if path.rpartition(".")[2] in WORD_TABLES:
            return path, m
    raise ValueError("the model has no word-embedding table (a module named "
                     f"{' or '.join(WORD_TABLES)}); use a model of this package's encoders")


def _vocab(layer):
    n = getattr(layer, "num_embeddings", None)
    if n is None:
        n = layer.weight.shape[0]
    return int(n)


def row_counts(model, texts):
    """(vocab,) int64: how many times each row of ``model``'s word-embedding table is looked
    up when its tokenizer encodes ``texts`` (a list of str, or a TaskSet: module docstring),
    special tokens included, padding not.

    Parameters
    ----------
    model : variants.models.decision.DecisionModel
    texts : list of str, or variants.datasets.tasks.TaskSet

    Raises
    ------
    ValueError
        A token id outside the table (tokenizer and checkpoint disagree); no word table.
    """
    _, layer = word_table(model.module)
    vocab = _vocab(layer)
    if hasattr(texts, "option_texts"):  # a TaskSet: what the model reads
        ts = texts
        inputs, pairs = model.model_inputs(ts)
        encs, _ = (model.tokenizer.encode(inputs) if pairs is None
                   else model.tokenizer.encode(inputs, pairs))
        options = sorted(set(np.asarray(ts.option_texts)[np.asarray(ts.option_mask)].tolist()))
        encs = list(encs) + (list(model.tokenizer.encode(options)[0]) if options else [])
    else:
        texts = [str(t) for t in texts]
        encs = list(model.tokenizer.encode(texts)[0]) if texts else []
    ids = np.concatenate([np.asarray(e.ids, np.int64) for e in encs]) if encs else \
        np.zeros(0, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"the tokenizer gives token id {int(ids.max())}, outside the "
                         f"{vocab}-row word table; use the checkpoint's own tokenizer")
    return np.bincount(ids, minlength=vocab).astype(np.int64)


def read_texts(path, flag="--embedding-texts"):
    """The texts of a user's file ``path``: one text per line, UTF-8, surrounding whitespace
    stripped, empty lines skipped.

    Raises
    ------
    ValueError
        (one line naming ``flag`` and the fix) a path that is not a readable file, a file that
        is not UTF-8, a file with no text.
    """
    from metrics._checks import short_path

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{flag} {short_path(p)} is not a file; pass a UTF-8 text file with "
                         "one text per line")
    try:
        raw = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {short_path(p)} is not UTF-8 (byte {e.start}); save it as "
                         "UTF-8, one text per line") from None
    except OSError as e:
        raise ValueError(f"{flag} {short_path(p)} cannot be read "
                         f"({e.strerror or type(e).__name__}); pass a readable file") from None
    texts = [line.strip() for line in raw.splitlines()]
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError(f"{flag} {short_path(p)} holds no text; put one text per line")
    return texts

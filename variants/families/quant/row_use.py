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


def rows_holding_unseen(model, taskset, used, batch_size=64):
    """(N,) bool: the rows of ``taskset`` whose text, as ``model`` reads it, looks up a
    word-table row that ``used`` ((vocab,) bool, :func:`row_counts` > 0 on the fit texts)
    marks unused: the eval rows a table stored by use judges apart."""
    used = np.asarray(used, bool)
    out = np.zeros(len(taskset), bool)
    batches, _ = model.prepare(taskset, batch_size)
    for b in batches:
        ids = np.asarray(b.input_ids)
        mask = np.asarray(b.attention_mask) > 0
        out[np.asarray(b.index)] = (~used[ids] & mask).any(axis=1)
    return out


def eval_ids_apart(model, tasksets, cfg, info):
    """The ids of the eval rows holding a token no fit text uses (build.json's
    ``unseen_eval_ids``) for a variant whose ``info`` has a ``row_map``, else None."""
    if not info.get("row_map"):
        return None
    used = used_rows(model, tasksets.get("fit"), cfg)
    if used is None:
        return None
    ev = tasksets["eval"]
    return [str(i) for i in np.asarray(ev.ids)[rows_holding_unseen(model, ev, used)]]


def row_use_of(reference, fit, cfg):
    """:func:`used_rows` when ``cfg``'s map stores a table's ``@unseen`` rows apart, else None
    (every builder that calls :func:`quantize_module` with such a map passes it)."""
    from variants.layer_maps.bits_map import UNSEEN

    return used_rows(reference, fit, cfg) if UNSEEN in cfg.bits_map else None


def used_rows(reference, fit, cfg):
    """(vocab,) bool: the word-table rows the texts of ``fit`` (the fit split, a TaskSet, as
    the model reads them, option texts included: :func:`row_counts`) and
    ``cfg.embedding_texts`` (a file, one text per line) use; None without any text."""
    counts = [row_counts(reference, fit)] if fit is not None and len(fit) else []
    if cfg.embedding_texts:
        counts.append(row_counts(reference, read_texts(cfg.embedding_texts)))
    return sum(counts) > 0 if counts else None

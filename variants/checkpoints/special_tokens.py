"""Texts that reduce to special tokens only (empty, emoji-only -> ``[CLS] [UNK] [SEP]``): the
model reads nothing of them. A sweep keeps, judges and counts them (run.json
``data.special_only_texts``, their row ids in ``data.special_only_ids``); it never drops them."""

import numpy as np


def special_only_mask(texts, tokenizer):
    """True where a text tokenizes to special tokens only (e.g. ``[CLS] [SEP]``, ``[CLS] [UNK]
    [SEP]`` for an emoji-only text): the model reads nothing of it.

    A token counts as special when the ``tokenizers`` encoding marks it
    (``Encoding.special_tokens_mask``, the post-processor's tokens), its id is one of the
    tokenizer's special added tokens (``[UNK]``, ``[PAD]``, ``[MASK]``, typed in the text) or
    it is the vocabulary model's unknown token.

    Parameters
    ----------
    texts : sequence of str, length N
    tokenizer : ``tokenizers.Tokenizer`` or an object with one as ``.tokenizer``
        (:class:`variants.checkpoints.load.TextTokenizer`).

    Returns
    -------
    mask : ndarray of bool, shape (N,)
    """
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    unk = getattr(tok.model, "unk_token", None)  # a vocabulary may not register it as added
    if unk is not None and tok.token_to_id(unk) is not None:
        special.add(tok.token_to_id(unk))
    encs = tok.encode_batch(list(texts)) if len(texts) else []
    return np.array([all(m or i in special for i, m in zip(e.ids, e.special_tokens_mask))
                     for e in encs], dtype=bool)


def count_special_only(texts, tokenizer):
    """Number of texts that reduce to special tokens only (:func:`special_only_mask`); the
    sweep reports it, the rows are kept."""
    return int(special_only_mask(texts, tokenizer).sum())


def special_only_ids(taskset, tokenizer):
    """Row ids (list of str, in row order) of ``taskset``'s texts that reduce to special tokens
    only (:func:`special_only_mask`): empty and whitespace-only texts, emoji-only ones..."""
    mask = special_only_mask(taskset.texts, tokenizer)
    return [str(i) for i, m in zip(taskset.ids, mask) if m]

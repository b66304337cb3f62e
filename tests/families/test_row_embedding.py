"""Issue 42, item 3: the word-embedding table stored by use (RowWidthEmbedding: one packed table
per format with row_table / row_index), its rows exactly formats.round_trip's, its bytes a hand
count; the rows a tokenizer uses (row_use.row_counts) and a user's --embedding-texts file."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from variants.layer_maps import formats as F
from variants.runtime.row_embedding import (RowWidthEmbedding, place_row_embeddings,
                                                   row_embedding_block)

MIXED = [F.Format(8, 64, "affine", "float16"), F.Format(4, 64, "affine", "float16"),
         F.Format(2, 64, "affine", "float16"), F.of("mxfp4", 64),
         F.Format(3, 32, "affine", "float32")]  # the last one takes no row


@pytest.fixture(scope="module")
def mixed():
    mx.random.seed(7)
    emb = nn.Embedding(640, 128)
    row_format = np.random.default_rng(3).integers(0, 4, 640)
    return emb, row_format, RowWidthEmbedding.from_embedding(emb, row_format, MIXED)


def test_each_row_is_its_format_s_round_trip_exactly(mixed):
    emb, rf, m = mixed
    table = m.dequantized()
    assert table.dtype == mx.float32 and table.shape == (640, 128)
    for k in range(4):
        rows = np.nonzero(rf == k)[0]
        want = F.round_trip(emb.weight[mx.array(rows)], MIXED[k])
        assert mx.array_equal(table[mx.array(rows)], want), MIXED[k]
        # and not the fp32 weight: the format changed the row
        assert not mx.array_equal(want, emb.weight[mx.array(rows)])
    ids = mx.array(np.random.default_rng(5).integers(0, 640, (3, 11)).astype(np.int32))
    out = m(ids)
    assert out.dtype == mx.float32 and out.shape == (3, 11, 128)
    assert mx.array_equal(out, table[ids])
    assert mx.array_equal(m(mx.array([5])), table[5:6])
    assert m(mx.zeros((2, 0), mx.int32)).shape == (2, 0, 128)


def test_unused_format_is_left_out_and_tables_follow_vocabulary_order(mixed):
    _, rf, m = mixed
    assert m.formats == tuple(MIXED[:4])
    rt, ri = np.asarray(m.row_table), np.asarray(m.row_index)
    assert m.row_table.dtype == mx.uint8 and m.row_index.dtype == mx.int32
    np.testing.assert_array_equal(rt, rf)
    for k in range(4):
        np.testing.assert_array_equal(ri[rf == k], np.arange((rf == k).sum()))


def test_bytes_are_a_hand_count(mixed):
    """codes + scales (+ biases) per table, 1 + 4 bytes of index per row."""
    _, rf, m = mixed
    n = [int((rf == k).sum()) for k in range(4)]
    want = (n[0] * (128 // 4 * 4 + 2 * 2 * 2)     # 8 bits: 128 B codes, 2 groups x (f16 s + b)
            + n[1] * (128 // 8 * 4 + 2 * 2 * 2)   # 4 bits: 64 B
            + n[2] * (128 // 16 * 4 + 2 * 2 * 2)  # 2 bits: 32 B
            + n[3] * (64 + 4)                     # mxfp4: 64 B codes, 4 uint8 scales
            + 640 * (1 + 4))
    assert m.nbytes == want
    assert sum(t["bytes"] for t in m.row_formats()["tables"]) + 640 * 5 == want
    assert [F.stored_bytes((t["rows"], 128), f) for t, f in
            zip(m.row_formats()["tables"], MIXED)] == [t["bytes"] for t in
                                                       m.row_formats()["tables"]]
    assert m.row_formats()["index_bytes"] == 640 * 5


def test_skeleton_from_its_spec_loads_its_arrays(mixed):
    from mlx.utils import tree_flatten

    _, _, m = mixed
    holder = nn.Module()
    holder.word_embeddings = nn.Embedding(640, 128)
    place_row_embeddings(holder, {"word_embeddings": m.spec()})
    assert isinstance(holder.word_embeddings, RowWidthEmbedding)
    holder.load_weights(tree_flatten({"word_embeddings": m.parameters()}), strict=True)
    assert mx.array_equal(holder.word_embeddings.dequantized(), m.dequantized())
    assert row_embedding_block(holder) == {"word_embeddings": m.spec()}
    assert m.spec()["tables"][0] == {"bits": 8, "group_size": 64, "mode": "affine",
                                     "scale_dtype": "float16", "rows": int(m.row_formats()
                                                                           ["tables"][0]["rows"])}
    with pytest.raises(ValueError, match="not in the model"):
        place_row_embeddings(holder, {"nowhere.word_embeddings": m.spec()})
    with pytest.raises(ValueError, match="row_embedding entry"):
        place_row_embeddings(holder, {"word_embeddings": {"vocab": 3}})


@pytest.mark.parametrize("row_format, says", [
    (np.zeros(5, np.int64), "shape"),
    (np.full(640, 9), "outside the 5 formats"),
    (np.zeros(640, np.float32), "integer"),
])
def test_bad_row_format_is_one_line(mixed, row_format, says):
    emb, _, _ = mixed
    with pytest.raises(ValueError, match=says):
        RowWidthEmbedding.from_embedding(emb, row_format, MIXED)


def test_group_size_that_does_not_divide_is_one_line():
    with pytest.raises(ValueError, match="not divisible by group size 64"):
        RowWidthEmbedding.from_embedding(nn.Embedding(4, 96), np.zeros(4, np.int64),
                                         [F.Format(4, 64)])


def test_minilm_sized_table():
    """(30522, 384) in four formats: bytes as formats.stored_bytes counts them, rows exact."""
    mx.random.seed(1)
    emb = nn.Embedding(30522, 384)
    rf = np.random.default_rng(2).integers(0, 4, 30522)
    m = RowWidthEmbedding.from_embedding(emb, rf, MIXED[:4])
    want = sum(F.stored_bytes((int((rf == k).sum()), 384), MIXED[k]) for k in range(4))
    assert m.nbytes == want + 30522 * 5
    ids = mx.array(np.arange(0, 30522, 97, dtype=np.int32))
    got = m(ids)
    for k in range(4):
        sel = np.nonzero(rf[np.asarray(ids)] == k)[0]
        rows = ids[mx.array(sel)]
        assert mx.array_equal(got[mx.array(sel)], F.round_trip(emb.weight[rows], MIXED[k]))


# -- the rows a tokenizer uses --------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    from variants.checkpoints.load import load_checkpoint
    from variants.models import resolve

    ck, source = load_checkpoint(), resolve(model="minilm-sentiment")
    source.bind(ck)
    return source.build(ck)


def test_row_counts_are_the_tokenizer_s_ids_special_tokens_included(minilm):
    from variants.families.quant.row_use import row_counts

    texts = ["good good movie", "bad"]
    counts = row_counts(minilm, texts)
    vocab = minilm.tokenizer.tokenizer.get_vocab()
    assert counts.shape == (30522,) and counts.dtype == np.int64
    assert counts[vocab["[CLS]"]] == 2 and counts[vocab["[SEP]"]] == 2
    assert counts[vocab["good"]] == 2 and counts[vocab["movie"]] == 1
    assert counts[vocab["bad"]] == 1 and counts[vocab["[PAD]"]] == 0
    assert counts.sum() == 3 + 2 + 1 + 2  # words + [CLS]/[SEP] per text
    assert row_counts(minilm, []).sum() == 0


def test_read_texts(tmp_path):
    from variants.families.quant.row_use import read_texts

    f = tmp_path / "t.txt"
    f.write_text("  first text \n\n\nsecond — ünïcode\n   \n", encoding="utf-8")
    assert read_texts(f) == ["first text", "second — ünïcode"]
    for name, content in [("empty.txt", "\n  \n"), ("bad.txt", b"\xff\xfe\x00a")]:
        p = tmp_path / name
        p.write_bytes(content.encode() if isinstance(content, str) else content)
        with pytest.raises(ValueError, match="^--embedding-texts .*(no text|not UTF-8)") as e:
            read_texts(p)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="--embedding-texts .* is not a file"):
        read_texts(tmp_path / "absent.txt")
    with pytest.raises(ValueError, match="is not a file"):
        read_texts(tmp_path)

"""The lowering step after the walk (variants.search.row_lowering): the cheapest passing map
tried again with only the word table's unseen rows narrower, each option priced exactly."""

import numpy as np
import pytest


@pytest.fixture(scope="module")
def table():
    from variants.checkpoints.load import load_checkpoint
    from variants.models import sentiment
    from variants.families.quant.row_use import row_counts
    from variants.search.costs import CostTable
    from variants.search.row_lowering import NARROW
    from variants.search.units import search_units

    model = sentiment.build(load_checkpoint())
    used = row_counts(model, ["a quiet, moving and gorgeous film"]) > 0
    units = search_units(model.module, model, unseen_rows=True).paths
    return CostTable(model.module, units, (4, 6, 8, "mxfp4", "nvfp4"), 64, "float16", used,
                     unseen_extra=NARROW), units, used


def test_unseen_rows_lowered_alone_cheapest_first(table):
    from variants.search.row_lowering import candidates

    costs, units, used = table
    word = "encoder.embeddings.word_embeddings"
    best = {"layer_bits": {u: 6 for u in units}}
    maps = candidates(costs, "bytes", units, best, ["mxfp4", 4, 6, 8])
    # 2, 3, mxfp4 (4.25), 4 (4.5): the options below 6, with the narrow widths priced for it
    assert [m[word + "@unseen"] for m in maps] == [2, 3, "mxfp4", 4]
    # only the search's chain: an option it dropped (nvfp4, priced) is not tried
    assert (word + "@unseen", "nvfp4") in costs.q_bytes
    assert all(m[word + "@unseen"] != "nvfp4" for m in maps)
    for m in maps:  # every other unit as in the passing map
        assert all(m[u] == 6 for u in units if "@" not in u)
    # each step down saves exactly the unseen rows' bytes at the two formats
    n_unseen, width = int((~used).sum()), 384
    saved = costs.model_bytes(best["layer_bits"]) - costs.model_bytes(maps[0])
    assert saved == n_unseen * width * (6.5 - 2.5) / 8 - 5 * used.size
    assert costs.shape[word + "@unseen"] == (n_unseen, width)
    assert costs.shape[word] == (int(used.sum()), width)
    # the others' options are the search's: no 2 or 3 bits priced for them
    assert (word, 2) not in costs.q_bytes and (units[-1], 3) not in costs.q_bytes
    assert candidates(costs, "bytes", units, {"layer_bits": dict(maps[0])}, [4, 6, 8]) == []
    assert np.all([costs.model_bytes(a) <= costs.model_bytes(b)
                   for a, b in zip(maps, maps[1:])])

"""After the walk: the word table's unseen rows lowered alone (``--unseen-rows``).

The threshold walk gives the ``<table>@unseen`` unit (the word-table rows no fit text uses,
:mod:`variants.search.format_sens`) the width its sensitivity earns beside every other unit, so
in the walk over the wider widths (e.g. 6 and 8, after the uniform 6-bit map failed) those rows
never go below 6 bits. Yet they are 75% of MiniLM's table (22,774 of 30,522 rows on the bundled
fit split), each read by few rows of text. So once the walk is over, the cheapest passing map is
tried again with only that unit narrower: every cheaper option of the search's chain, plus the
affine widths below the search's (2 and 3 bits: "rows never seen may be stored at the narrowest
width"), each priced exactly by the cost table, all in one step (counted in
``--max-candidates``); the driver's winner is then the cheapest passing candidate as ever.
"""

from variants.layer_maps.bits_map import UNSEEN

#: affine widths tried for the unseen rows beside the search's options
NARROW = (2, 3)


def candidates(costs, cost, units, best, options):
    """The maps to try: ``best["layer_bits"]`` with one ``@unseen`` unit of ``units`` at a
    cheaper option of ``options`` (the search's chain, W8A8 aside) or of :data:`NARROW`,
    cheapest first (ties: the option's name, so every process orders them alike)."""
    base = best["layer_bits"]
    maps = []
    for u in (u for u in units if UNSEEN in u and u in base):
        for o in dict.fromkeys([*NARROW, *options]):
            m = dict(base, **{u: o})
            if o != "int8" and (u, o) in costs.q_bytes and \
                    costs.of(cost, m) < costs.of(cost, base):
                maps.append((m, str(o)))
    return [m for m, _ in sorted(maps, key=lambda mo: (costs.of(cost, mo[0]),
                                                       costs.model_bytes(mo[0]), mo[1]))]


def lower_unseen(search, order):
    """Records of the lowering step (module docstring) after the walk's records ``order``;
    [] when there is no ``@unseen`` unit, no passing map, or ``--max-candidates`` is spent
    (the step's candidates count towards it, the cheapest first)."""
    passing = [r for r in order if r["passed"]]
    if not passing or not any(UNSEEN in u for u in search.layers):
        return []
    best = min(passing, key=lambda r: (r["cost"], r["model_bytes"]))
    maps = candidates(search.costs, search.opts.cost, search.layers, best, search.options)
    room = search.opts.max_candidates - len(order)
    if not maps or room <= 0:
        return []
    search.log(f"search: the unseen rows of {best['name']} lowered alone "
               f"({min(len(maps), room)} candidates)")
    return search.evaluate_batch(maps[:room], max(r["step"] for r in order) + 1)

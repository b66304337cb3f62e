"""Exact savings priced by the workload: what the exact family's de-duplication and result
cache would add to a search winner on the data's own traffic. No MLX.

The data's unique-input rate u = distinct texts / rows (the search split's rows as the data
holds them, repeats included). With a result cache large enough to keep every distinct input,
a fraction u of requests is computed by the winner (measured speed-up S over the reference) and
1 − u is served from the cache at a cost ε of the reference's time per request, so

    S_workload = 1 / (u / S + (1 − u) · ε),

which is S / u when hits cost nothing (ε = 0: the figure's upper bound; the exact family's sweep
measures ε, ``variants sweep --family exact``, and ``--compose ...+exact:cache:N`` times the
composed variant on this data's repeats). u = 1 (no repeats) leaves S as it is.
"""


def unique_rate(texts):
    """``(rows, distinct, u)`` of ``texts`` (u = 1.0 for no rows)."""
    texts = list(texts)
    n, d = len(texts), len(set(texts))
    return n, d, (d / n if n else 1.0)


def price(texts, speedup, epsilon=0.0):
    """search.json's ``workload``: the unique-input rate of ``texts`` and the winner's measured
    ``speedup`` priced with a result cache (module docstring); None without a speed-up."""
    if not speedup:
        return None
    n, d, u = unique_rate(texts)
    s = 1.0 / (u / speedup + (1.0 - u) * epsilon)
    return {"rows": n, "distinct": d, "unique_rate": u, "speedup": speedup,
            "epsilon": epsilon, "speedup_with_cache": s,
            "note": "a cache holding every distinct input; hits at cost epsilon of a reference "
                    "call (0: upper bound)"}


def markdown(w):
    """search.md lines of :func:`price`'s dict."""
    return ["## Exact savings priced by this data", "",
            f"Unique-input rate u = {w['distinct']:,} distinct of {w['rows']:,} rows = "
            f"{w['unique_rate']:.1%}. With the exact family's result cache in front of the "
            f"winner (`--compose ...+exact:cache:N`), a request is computed only the first time: "
            f"1 / (u/S + (1 − u)·ε) = {w['speedup_with_cache']:.2f}× for the measured "
            f"S = {w['speedup']:.2f}×, hits counted at ε = {w['epsilon']:g} (an upper bound; "
            "the exact family's sweep measures ε).", ""]

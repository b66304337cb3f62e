"""The search margin: on the search split, ``max``-statistic clauses are held to
``threshold * (1 - margin)``.

Why only those: a rate, a count's CI or a percentile estimates the same number on the search
split as on the eval split, but the max of an unbounded drift over one sample of N rows says
little about the max over another N rows; it is set by the single worst example. Measured on
minilm-sentiment (default contract, g64): uniform 6 bits had max |Δscore| 0.083 on an 800-row
search-eval part and 0.110 on the 800-row eval split; a 7.25-bit map 0.072 on 200 search rows
and 0.131 on eval. So a candidate that only just passes a max clause on the search split is
likely to fail it on eval; the margin asks for headroom there. The winner is judged on the eval
split with the contract as written. No MLX.
"""

from dataclasses import replace


def tighten(contract, margin):
    """``contract`` with each ``max``-statistic clause's bound moved ``margin`` (a fraction in
    [0, 1)) of its size towards passing less easily: ``<=`` bounds times (1 - margin), ``>=``
    bounds times (1 + margin). ``margin = 0`` returns ``contract`` itself. Raises ValueError
    naming ``--search-margin`` outside [0, 1)."""
    if not 0 <= margin < 1:
        raise ValueError(f"--search-margin {margin} must be in [0, 1), e.g. 0.25")
    if margin == 0:
        return contract
    clauses = tuple(
        replace(c, threshold=c.threshold * ((1 - margin) if c.op == "<=" else (1 + margin)))
        if c.statistic == "max" else c for c in contract.clauses)
    return replace(contract, clauses=clauses)

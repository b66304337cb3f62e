"""Search strategies over per-layer bit widths, as generators: each ``yield`` hands the driver a
batch of independent candidates (``{layer: bits}`` dicts, evaluated together, in parallel where
the executor can) and receives their pass/fail on the search split (list of bool, same order).
The generator returns when it has nothing more to try. Sensitivity is the per-layer table of
:mod:`variants.search.sensitivity` as ``{(layer, bits): kl_mean}``.

- ``greedy`` (the fallback of Intel Neural Compressor / NNCF): start with every layer at the
  cheapest width; each step raises the layer that is most sensitive at its current width by one
  width, ``batch`` steps ahead at once (the batch holds the 1st, 2nd, ... raise of the path, so
  the first that passes is where the serial greedy would have stopped); then lowering: try each
  raised layer one width down (least sensitive first, ``batch`` at a time), keep the first that
  passes, repeat until no lowering passes.
- ``bisect`` (after mlx-lm's ``dynamic_quant``, which bisects a sensitivity threshold to a
  bits-per-weight target): for a threshold t each layer gets the lowest width whose kl_mean
  <= t (the highest when none is); cost falls as t grows. The distinct maps over all t are
  ordered from the most to the least expensive; the search checks both ends, then evaluates
  ``batch`` evenly spaced interior maps per round (``batch = 1``: plain bisection) and keeps the
  cheapest passing map bracketed by a failing cheaper one. After the two ends it also tries
  every layer at each interior width (one round, when the cheapest end fails and the most
  expensive passes): no threshold gives every layer the same interior width while a lower
  width is on offer (a layer whose kl_mean at 4 bits is below another's at 6 gets 4 before the
  other gets 6), yet it is the map a user tries first (on minilm-sentiment, every unit at 6 bits
  was the cheapest map measured to pass on eval). When that uniform map fails, the threshold
  maps over that width and the wider ones (e.g. 6 and 8: every unit at 6 but the most sensitive
  at 8) are bisected after the main walk, between the all-widest map (passed) and the uniform
  one (failed): the maps that keep every unit at least that wide, which the main walk (with 4
  bits on offer) never reaches. The driver's winner is the cheapest passing candidate over every
  round.
"""

#: optuna: variants.search.optuna_search; latency: variants.search.latency_walk
STRATEGIES = ("greedy", "bisect", "optuna", "latency")


def _up(widths, b):
    return widths[widths.index(b) + 1]


def _down(widths, b):
    return widths[widths.index(b) - 1]


def greedy(layers, widths, sens, batch=1):
    """Generator (module docstring). ``layers``: forward order (ties go to the earlier layer);
    ``widths``: ascending."""
    order = {p: i for i, p in enumerate(layers)}
    cur = {p: widths[0] for p in layers}
    first = True
    while True:  # raising
        seq, m = ([dict(cur)] if first else []), dict(cur)
        first = False
        while len(seq) < batch:
            cand = [p for p in layers if m[p] != widths[-1]]
            if not cand:
                break
            p = max(cand, key=lambda q: (sens[q, m[q]], -order[q]))
            m = dict(m, **{p: _up(widths, m[p])})
            seq.append(m)
        if not seq:
            return
        passed = yield seq
        hit = next((i for i, ok in enumerate(passed) if ok), None)
        if hit is not None:
            cur = seq[hit]
            break
        cur = seq[-1]
    while True:  # lowering
        cand = sorted((p for p in layers if cur[p] != widths[0]),
                      key=lambda q: (sens[q, _down(widths, cur[q])], order[q]))
        accepted = False
        for i in range(0, len(cand), batch):
            seq = [dict(cur, **{p: _down(widths, cur[p])}) for p in cand[i:i + batch]]
            passed = yield seq
            hit = next((j for j, ok in enumerate(passed) if ok), None)
            if hit is not None:
                cur, accepted = seq[hit], True
                break
        if not accepted:
            return


def threshold_map(layers, widths, sens, t):
    """Each layer's lowest width whose sensitivity is <= ``t`` (the highest when none is)."""
    return {p: next((b for b in widths if sens[p, b] <= t), widths[-1]) for p in layers}


def threshold_maps(layers, widths, sens):
    """The distinct threshold maps, from the most expensive (t below every value: all at the
    highest width) to the cheapest (t = the largest value), as ``[(t, map)]``."""
    ts = sorted({sens[p, b] for p in layers for b in widths})
    out, seen = [], set()
    for t in [-1.0, *ts]:
        m = threshold_map(layers, widths, sens, t)
        key = tuple(m[p] for p in layers)
        if key not in seen:
            seen.add(key)
            out.append((t, m))
    return out


def _bisect_between(maps, batch, lo, hi):
    """Generator: bisect ``maps`` (most to least expensive) between ``maps[lo]`` (passes) and
    ``maps[hi]`` (fails), ``batch`` evenly spaced maps per round."""
    while hi - lo > 1:
        k = min(batch, hi - lo - 1)
        idx = sorted({lo + round((j + 1) * (hi - lo) / (k + 1)) for j in range(k)} - {lo, hi})
        passed = yield [maps[i] for i in idx]
        last = max((i for i, ok in zip(idx, passed) if ok), default=lo)
        nxt = min((i for i in idx if i > last), default=hi)
        lo, hi = last, nxt


def bisect(layers, widths, sens, batch=1):
    """Generator (module docstring)."""
    maps = [m for _, m in threshold_maps(layers, widths, sens)]
    lo, hi = 0, len(maps) - 1
    if hi == lo:
        yield [maps[0]]
        return
    ok_hi, ok_lo = (yield [maps[hi], maps[lo]])
    if ok_hi or not ok_lo:  # the cheapest passes, or not even the most expensive does
        return
    keys = {tuple(m[p] for p in layers) for m in maps}
    uniform = [b for b in widths[1:-1] if tuple(b for _ in layers) not in keys]
    failed = []
    if uniform:
        passed = yield [{p: b for p in layers} for b in uniform]
        failed = [b for b, ok in zip(uniform, passed) if not ok]
    yield from _bisect_between(maps, batch, lo, hi)
    if failed:  # the widest failing uniform width: its threshold maps with the wider widths
        above = widths[max(widths.index(b) for b in failed):]  # (options: cheapest first)
        sub = [m for _, m in threshold_maps(layers, above, sens)]
        if len(sub) > 2:
            yield from _bisect_between(sub, batch, 0, len(sub) - 1)

"""Amdahl in the answer: the search winner's pieces against the reference's segment profile.

The design document's formula (docs/method.md, "Amdahl"): a piece that makes a share p of the
warm forward s times faster gives the whole request

    S = 1 / (1 - p + p / s)    <=    1 / (1 - p)   (its ceiling, s -> inf),

and 10x needs p > 0.9 and s >= p / (p - 0.9). The shares are those of the reference's segment
profile (:func:`variants.sweep.profile.segment_profile`), which the finalists' sweep already
records in ``OUT/final/run.json`` (``segment_profile``, :mod:`variants.sweep.ref_profile`):
nothing is timed again here. No MLX.

Which segments each piece touches, as a fraction of the segment's time (:func:`coverage`):

- ``quant`` (weight-only widths) and ``w8a8`` (int8 GEMMs): the encoder GEMM segments
  (``qkv_proj``, ``out_proj``, ``mlp_gemm``) times the fraction of the encoder Linears the piece
  holds (Linears counted alike; exact when it holds them all). The two hold disjoint Linears,
  so their fractions add.
- ``lowrank``: the GEMM segments, fraction 1 (every factored Linear; its own quantization is
  the quant piece's).
- ``prune`` after layer a / ``exit`` after layer e: every per-layer segment (``LAYER_SEGMENTS``)
  times (N - cut) / N (:data:`variants.sweep.profile.FAMILY_DEPTH`); exit without an
  ``exit_layer`` is counted from its earliest head (layer 1).
- ``embeddings`` (embedding tables quantized): the ``embeddings`` segment.

The winner's accelerated share P of a segment is the largest fraction any piece covers (the
layer sets are nested: all layers contain the layers after any cut), the width pieces summed
first; what no piece covers, plus the profile's unattributed time, is the untouched share
1 - P, and 1 / (1 - P) is the ceiling that remains however fast the pieces get.
"""

import math

GEMM_SEGMENTS = ("qkv_proj", "out_proj", "mlp_gemm")
#: Pieces the table knows, in build order.
PIECES = ("lowrank", "quant", "w8a8", "prune", "exit", "embeddings")
#: The speed-up the design document asks about.
TARGET = 10.0


def amdahl(p, s=math.inf):
    """1 / (1 - p + p / s): end-to-end speed-up when a share ``p`` in [0, 1] gets ``s`` (> 0)
    times faster; ``s`` = inf gives the ceiling 1 / (1 - p) (inf at p = 1)."""
    rest = 1.0 - p + (0.0 if math.isinf(s) else p / s)
    return math.inf if rest <= 0 else 1.0 / rest


def _layer_segments():
    from variants.sweep.profile import LAYER_SEGMENTS  # imports MLX: only when a cut needs it

    return LAYER_SEGMENTS


def coverage(piece, params, n_layers):
    """{segment: fraction of its time} that ``piece`` (one of :data:`PIECES`) acts on.

    ``params``: ``{"fraction": f}`` for quant / w8a8 (share of the encoder Linears, default 1),
    ``{"after_layer": a}`` for prune, ``{"exit_layer": e}`` for exit (default 1); others none.
    Raises ValueError (one line) for an unknown piece or a cut outside [0, n_layers]."""
    if piece in ("quant", "w8a8", "lowrank"):
        f = float(params.get("fraction", 1.0)) if piece != "lowrank" else 1.0
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"{piece}: the fraction of Linears must be in [0, 1], got {f}.")
        return {s: f for s in GEMM_SEGMENTS}
    if piece in ("prune", "exit"):
        key = "after_layer" if piece == "prune" else "exit_layer"
        cut = params.get(key, 1)
        if int(cut) != cut or not 0 <= cut <= n_layers:
            raise ValueError(f"{piece}: {key} must be an integer in [0, {n_layers}], got {cut}.")
        return {s: (n_layers - cut) / n_layers for s in _layer_segments()}
    if piece == "embeddings":
        return {"embeddings": 1.0}
    raise ValueError(f"{piece!r} is not a piece the Amdahl table knows ({', '.join(PIECES)}): "
                     "add its segments to variants.search.amdahl.coverage.")


def pieces_of(winner, settings=None):
    """The winner's pieces ``{piece: params}`` from its search record: a composed ``config``
    (quant, lowrank, prune, exit, and any w8a8 / embeddings entry) or a per-Linear
    ``layer_bits`` map (int8 entries are W8A8, the rest weight-only widths; embedding tables,
    named ``*embeddings*``, are the embeddings piece)."""
    from variants.search.costs import INT8

    config = winner.get("config")
    if config and set(config) != {"quant"}:
        return {k: dict(v) if isinstance(v, dict) else {} for k, v in config.items()}
    lb = winner.get("layer_bits") or {}
    linears = {p: b for p, b in lb.items() if "embeddings" not in p}
    out = {}
    if linears:
        n8 = sum(b == INT8 for b in linears.values())
        if n8 < len(linears):
            out["quant"] = {"fraction": (len(linears) - n8) / len(linears)}
        if n8:
            out["w8a8"] = {"fraction": n8 / len(linears)}
    elif config:
        out["quant"] = {"fraction": 1.0}
    if len(linears) < len(lb) or (settings or {}).get("quantize_embeddings"):
        out["embeddings"] = {}
    return out


def table(profile, pieces, measured=None, target=TARGET):
    """The Amdahl table of a winner.

    Parameters
    ----------
    profile : dict
        A segment profile (``share`` {segment: p}, ``n_layers``; run.json ``segment_profile``).
    pieces : dict {piece: params}
        :func:`pieces_of`.
    measured : float, optional
        The winner's measured end-to-end speed-up over the reference (strict alternation).
    target : float, default 10

    Returns
    -------
    dict
        ``pieces``: [{piece, share, ceiling}] (share of the reference's time the piece acts
        on; ceiling 1 / (1 - share), None when inf); ``accelerated_share`` P (union);
        ``untouched_share`` 1 - P; ``ceiling`` 1 / (1 - P) (None when inf); ``measured``;
        ``implied_piece_speedup`` s with 1 / (1 - P + P / s) = measured (None when measured is
        missing or at / above the ceiling); ``target``; ``gap`` target / measured;
        ``reachable`` (ceiling > target); ``needed_piece_speedup`` P / (P - (1 - 1/target))
        when reachable; ``untouched`` [{segment, share}] largest first (unattributed time
        included); ``must_go`` the largest untouched shares whose removal would bring the
        untouched share to 1/target or below (empty when already there).

    Raises
    ------
    ValueError
        A profile without ``share`` / ``n_layers``, or an unknown piece (:func:`coverage`).
    """
    share = profile.get("share")
    n = profile.get("n_layers")
    if not share or not n:
        raise ValueError("the segment profile has no shares or layer count: profile the "
                         "reference (timing rounds >= 3) to get an Amdahl table.")
    cov = {name: coverage(name, params, n) for name, params in pieces.items()}
    rows = []
    for name, c in cov.items():
        p = min(1.0, sum(share.get(s, 0.0) * f for s, f in c.items()))
        rows.append({"piece": name, "share": p, "ceiling": _finite(amdahl(p))})
    covered = {}
    for s in share:
        width = min(1.0, sum(cov[k].get(s, 0.0) for k in ("quant", "w8a8") if k in cov))
        covered[s] = max([width] + [c.get(s, 0.0) for k, c in cov.items()
                                    if k not in ("quant", "w8a8")])
    P = min(1.0, sum(share[s] * covered[s] for s in share))
    untouched = [{"segment": s, "share": share[s] * (1.0 - covered[s])} for s in share
                 if share[s] * (1.0 - covered[s]) > 0]
    rest = 1.0 - sum(share.values())
    if rest > 0:
        untouched.append({"segment": "unattributed", "share": rest})
    untouched.sort(key=lambda r: -r["share"])
    u = max(0.0, 1.0 - P)
    must_go, left = [], u
    for r in untouched:
        if left <= 1.0 / target + 1e-12:
            break
        must_go.append(r["segment"])
        left -= r["share"]
    ceiling = amdahl(P)
    implied = None
    if measured and 1.0 / measured > u and P > 0:
        implied = P / (1.0 / measured - u)
    need = 1.0 - 1.0 / target
    return {"pieces": rows, "accelerated_share": P, "untouched_share": u,
            "ceiling": _finite(ceiling), "measured": measured,
            "implied_piece_speedup": implied, "target": target,
            "gap": (target / measured) if measured else None,
            "reachable": ceiling > target,
            "needed_piece_speedup": P / (P - need) if P > need else None,
            "untouched": untouched, "must_go": must_go}


def _finite(x):
    return None if math.isinf(x) else float(x)


def answer(out, winner, settings=None):
    """search.json's ``amdahl`` for a finalized ``winner``: :func:`table` of the profile the
    finalists' sweep recorded (``out/final/run.json`` ``segment_profile``) and the winner's
    measured end-to-end speed-up (``out/final/<name>/timing.json``, at the cost's batch size for
    ``latency-b<B>``, else the profiled batch size, else the largest timed), plus
    ``batch_size`` (profiled) and ``measured_batch_size``. ``{"skipped": reason}`` (one line)
    when there is no profile or a piece is unknown."""
    import json
    from pathlib import Path

    final = Path(out) / "final"
    try:
        prof = json.loads((final / "run.json").read_text()).get("segment_profile") or {}
    except (OSError, ValueError):
        return {"skipped": "no finalists' sweep (final/run.json): the winner was not timed"}
    if "skipped" in prof or not prof.get("share"):
        return {"skipped": prof.get("skipped", "the finalists' sweep recorded no segment "
                                               "profile")}
    measured, mb, region_name = None, None, None
    try:
        timing = json.loads((final / winner["name"] / "timing.json").read_text())
        region = timing.get("end_to_end") or timing.get("batches") or {}
        region_name = "end to end (texts → decisions)" if timing.get("end_to_end") else "forward"
        cost = (settings or {}).get("cost", "")
        want = [cost.split("-b")[-1]] if cost.startswith("latency-b") else []
        want += [str(prof.get("batch_size")), *sorted(region, key=int, reverse=True)]
        mb = next(b for b in want if b in region)
        measured = (region[mb].get("speedup") or {}).get("speedup_median")
    except (OSError, ValueError, StopIteration, KeyError):
        pass
    try:
        t = table(prof, pieces_of(winner, settings), measured)
    except ValueError as e:
        return {"skipped": str(e)}
    return dict(t, batch_size=prof.get("batch_size"),
                measured_batch_size=None if mb is None else int(mb), measured_region=region_name)


def _x(v):
    return "∞" if v is None else f"{v:.2f}×"


def markdown(t, batch_size=None):
    """search.md lines of a :func:`table` (a heading, the per-piece table and the answer)."""
    at = f" at B={batch_size}" if batch_size else ""
    lines = ["## Amdahl: where the winner's speed-up comes from", "",
             f"Shares of the reference's warm forward{at} (its segment profile, "
             "docs/method.md \"Amdahl\"): S = 1 / (1 − p + p/s) ≤ 1 / (1 − p).", "",
             "| piece | share of the reference's time | its ceiling 1/(1−p) |",
             "|---|---:|---:|"]
    lines += [f"| {r['piece']} | {r['share']:.1%} | {_x(r['ceiling'])} |" for r in t["pieces"]]
    lines += [f"| **all pieces** | {t['accelerated_share']:.1%} | {_x(t['ceiling'])} |", ""]
    m = t["measured"]
    if m:
        where = (f", {t['measured_region']} at B={t['measured_batch_size']}"
                 if t.get("measured_region") and t.get("measured_batch_size") else "")
        if where and batch_size and t["measured_batch_size"] != batch_size:
            where += f" (the shares are the B={batch_size} profile's)"
        lines.append(f"Measured: {m:.2f}× (strict alternation with the reference{where}); "
                     f"ceiling that remains {_x(t['ceiling'])}; {t['target']:g}× needs "
                     f"{t['gap']:.2f}× more." if m < t["target"] else
                     f"Measured: {m:.2f}×, at or past {t['target']:g}×.")
        if t["implied_piece_speedup"]:
            lines.append("That is the pieces' share at "
                         f"{t['implied_piece_speedup']:.2f}× its reference speed.")
    else:
        lines.append(f"Not measured; ceiling that remains {_x(t['ceiling'])}.")
    top = ", ".join(f"{r['segment']} {r['share']:.1%}" for r in t["untouched"][:4])
    lines.append(f"Untouched: {t['untouched_share']:.1%} of the time ({top or 'none'}).")
    if t["reachable"]:
        lines.append(f"{t['target']:g}× is within the ceiling: the pieces' share must run at "
                     f"least {t['needed_piece_speedup']:.2f}× faster.")
    else:
        lines.append(f"{t['target']:g}× is out of reach of these pieces however fast they get: "
                     f"the untouched share must fall to {1 / t['target']:.0%} or less; "
                     f"{', '.join(t['must_go'])} would have to go.")
    return lines + [""]

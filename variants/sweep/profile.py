"""Where the reference forward's time goes: segment shares, Amdahl ceilings and work-count slopes.

Method (docs/method.md, "Amdahl"): time each segment of the forward, take its
share p of the *whole* (un-segmented, warm) forward, report what the segments do not explain as
**unattributed**, and bound a family's end-to-end speed-up by the Amdahl ceiling 1 / (1 - p) of
the segments it accelerates. The work counts and their slopes are in :mod:`variants.sweep.work_counts`.

Families that act on depth (token pruning after layer a, early exit after layer e) only shrink
the layers after their cut point, so their shares are scaled by (N - a) / N
(:data:`FAMILY_DEPTH`, :func:`prune_speedup`, :func:`exit_speedup`); crediting them with the
whole encoder printed a meaningless ceiling (48x and more).
"""

import time

import mlx.core as mx
import numpy as np

from variants.runtime import parallel
from variants.arch.encoder import ACTIVATIONS, attention_bias, mean_pool
from variants.models.choice import COSINE_SCALE

SEGMENTS = ("tokenisation", "embeddings", "qkv_proj", "attention_core", "out_proj", "mlp_gemm",
            "mlp_act", "norms", "pooling", "head", "postprocess")

#: Segments inside each encoder layer whose cost is linear in the number of tokens.
PER_TOKEN_SEGMENTS = ("qkv_proj", "out_proj", "mlp_gemm", "mlp_act", "norms")
#: Segments inside each encoder layer whose cost is quadratic in the tokens (QKᵀ, softmax, PV).
QUADRATIC_SEGMENTS = ("attention_core",)
LAYER_SEGMENTS = PER_TOKEN_SEGMENTS[:1] + QUADRATIC_SEGMENTS + PER_TOKEN_SEGMENTS[1:]

# Segments each family makes cheaper (its best case: the segment costs nothing).
# quant / lowrank shrink the encoder GEMMs of every layer. prune and exit act only on the layers
# *after* their cut point, so their segments count with the depth fraction (N - a) / N of
# ``FAMILY_DEPTH`` (the profile sums each segment over all N layers, which have equal shapes):
# - prune after layer a keeping a fraction rho of the tokens: layers a+1..N run on rho L tokens,
#   per-token segments cost rho times, attention rho^2 times (:func:`prune_speedup`); the ceiling
#   (rho -> 0) frees those layers entirely. Embeddings, layers 1..a, pooling, head, tokenisation
#   and post-processing are untouched.
# - exit after layer e: an exited example skips layers e+1..N (:func:`exit_speedup`); the ceiling
#   is every example exiting there (and the batch shrinking with it).
FAMILY_SEGMENTS = {
    "quant": ("qkv_proj", "out_proj", "mlp_gemm"),
    "lowrank": ("qkv_proj", "out_proj", "mlp_gemm"),
    "prune": LAYER_SEGMENTS,
    "exit": LAYER_SEGMENTS,
}
#: Depth-limited families: the keyword of their cut point and its default for the ceiling
#: (the earliest cut the sweep's ladders use: prune after layer 1, exit heads from layer 1).
FAMILY_DEPTH = {"prune": ("after_layer", 1), "exit": ("exit_layer", 1)}


def amdahl(p, s=float("inf")):
    """End-to-end speed-up when a share ``p`` of the time gets ``s`` times faster.

    Returns 1 / (1 - p + p / s); with ``s`` = inf that is the ceiling 1 / (1 - p).

    Examples
    --------
    >>> round(amdahl(0.0532), 3)
    1.056
    >>> amdahl(0.5, 2.0)
    1.3333333333333333
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a share in [0, 1], got {p}.")
    if s <= 0:
        raise ValueError(f"s must be > 0, got {s}.")
    rest = 1.0 - p + (0.0 if s == float("inf") else p / s)
    return float("inf") if rest == 0 else 1.0 / rest


def _clock(acc, name, fn):
    t0 = time.perf_counter()
    out = fn()
    mx.eval(out)
    acc[name] = acc.get(name, 0.0) + (time.perf_counter() - t0) * 1e3
    return out


def _segmented_forward(encoder, ids, mask, types, acc):
    """The encoder forward + mean pooling, one ``mx.eval`` per segment, times added into ``acc``.
    Returns (pooled (B, D), the number of token rows each layer's GEMMs ran on).

    Runs the batch the way :class:`variants.arch.encoder.BertEncoder` does, so the segments time the
    same work as the whole forward: packed over the streams when enough of the batch is padding
    (:mod:`variants.runtime.packing`; the pack and unpack gathers count as embeddings and pooling), else
    the padded batch split by sequences, one part per stream (a batch the forward splits by
    heads, B < streams, runs as one padded part on one stream: the head split is not
    segmented). Every segment evaluates all parts at once, each on its own stream, so a
    segment's time is its wall time with the cores shared the same way.
    """
    m = np.array(mask)
    x = encoder.embed(ids, types)
    bias = None if m.all() else attention_bias(mask, x.dtype)
    # the forward's head split (B < streams) is timed as one padded part, like the batch it runs
    head_split = encoder._head_split(m) is not None
    plan = None if head_split else encoder._packing_plan(m, bias)
    if plan is not None:
        parts = _clock(acc, "embeddings", lambda: plan.split(x))
        ctxs, xs = [p for p, _ in parts], [h for _, h in parts]

        def project(a, h, part):
            return a.packed_project(h, part)

        def core(a, t, part):
            return a.packed_core(*t, part)

        def join(hs):
            return plan.unpack(mx.concatenate(hs, axis=0) if len(hs) > 1 else hs[0])
    else:
        x = _clock(acc, "embeddings", lambda: x)
        cuts = [(0, m.shape[0])] if head_split else parallel.bounds(m.shape[0],
                                                                     encoder._row_parts(m))
        ctxs = [None if bias is None else bias[a:b] for a, b in cuts]
        xs = [x[a:b] for a, b in cuts]

        def project(a, h, _):
            return a.project(h)

        def core(a, t, bb):
            return a.core(*t, bb)[0]

        def join(hs):
            return mx.concatenate(hs, axis=0) if len(hs) > 1 else hs[0]
    ss = parallel.streams()[:len(xs)]

    def each(fn, *parts):
        """fn applied to every part, each on its own stream (a list, one entry per part)."""
        out = []
        for s, args in zip(ss, zip(*parts)):
            with mx.stream(s):
                out.append(fn(*args))
        return out

    for layer in encoder.layers:
        a = layer.attention
        qkv = _clock(acc, "qkv_proj", lambda: each(lambda h, c: project(a, h, c), xs, ctxs))
        ctx = _clock(acc, "attention_core", lambda: each(lambda t, c: core(a, t, c), qkv, ctxs))
        o = _clock(acc, "out_proj", lambda: each(a.output, ctx))
        xs = _clock(acc, "norms", lambda: each(lambda t, u: layer.attention_norm(t + u), xs, o))
        u = _clock(acc, "mlp_gemm", lambda: each(layer.mlp_in, xs))
        g = _clock(acc, "mlp_act", lambda: each(ACTIVATIONS[layer.hidden_act], u))
        y = _clock(acc, "mlp_gemm", lambda: each(layer.mlp_out, g))
        xs = _clock(acc, "norms", lambda: each(lambda t, w: layer.output_norm(t + w), xs, y))
    rows = sum(h.shape[0] for h in xs) if plan is not None else int(m.size)
    return _clock(acc, "pooling", lambda: mean_pool(join(xs), mask)), rows


def segment_profile(model, texts, *, rounds=3, warmup=1):
    """Segment profile of a decision model's forward on one batch of ``texts``, end to end.

    ``model`` is a :class:`variants.models.decision.DecisionModel` whose ``module`` is an encoder +
    mean-pool net (``module.encoder``); the head is ``module.head`` when present (sentiment) or
    the option-cosine step of the choice model (``model.forward`` minus the embedding).

    Parameters
    ----------
    model : DecisionModel
    texts : list of str
        One batch (tokenised to the batch's longest text).
    rounds : int, default=3
        Rounds; each times the segmented forward and the whole forward back to back.
    warmup : int, default=1

    Returns
    -------
    profile : dict
        ``segments_ms`` {segment: median ms}, ``total_ms`` (median un-segmented forward incl.
        tokenisation and post-processing), ``share`` {segment: p} (of ``total_ms``, or of the
        segments' sum when that is larger, so the shares never add up to more than 1),
        ``unattributed_ms`` and ``unattributed_share`` (total minus the segments; negative
        when per-segment synchronisation costs more than it hides), ``segments_sum_ms``, ``batch_size``,
        ``seq_len``, ``gemm_rows`` (token rows each layer's GEMMs ran on: the real tokens when
        the batch was packed, else B·L), ``rounds`` and ``n_layers`` (encoder layers; the
        prune / exit ceilings need it).
    """
    enc_module = model.module
    encoder = enc_module.encoder

    def tokenise():
        encs, _ = model.tokenizer.encode(list(texts))
        return [mx.array(a) for a in model.tokenizer.batch(encs)]

    def head(pooled):
        if hasattr(enc_module, "head"):
            return enc_module.head(pooled)
        opts = model._options()[: min(3, len(model.option_texts))]
        return COSINE_SCALE * (pooled @ opts.T)

    def post(logits):
        return np.array(mx.softmax(logits, axis=-1))

    def segmented():
        acc = {}
        t0 = time.perf_counter()
        ids, mask, types = tokenise()
        acc["tokenisation"] = (time.perf_counter() - t0) * 1e3
        pooled, rows = _segmented_forward(encoder, ids, mask, types, acc)
        logits = _clock(acc, "head", lambda: head(pooled))
        t0 = time.perf_counter()
        post(logits)
        acc["postprocess"] = (time.perf_counter() - t0) * 1e3
        return acc, (*ids.shape, rows)

    def whole():
        t0 = time.perf_counter()
        ids, mask, types = tokenise()
        post(head(enc_module.embed(ids, mask, types)) if hasattr(enc_module, "embed")
             else head(mean_pool(encoder(ids, mask, types).last_hidden, mask)))
        return (time.perf_counter() - t0) * 1e3

    for _ in range(warmup):
        segmented()
        whole()
    runs, totals = [], []
    for _ in range(rounds):
        acc, shape = segmented()
        runs.append(acc)
        totals.append(whole())
    seg = {s: float(np.median([r.get(s, 0.0) for r in runs])) for s in SEGMENTS}
    total = float(np.median(totals))
    un = total - sum(seg.values())
    # Shares of the larger of the two: when per-segment synchronisation makes the segments add up
    # to more than the whole forward (negative unattributed time), shares still sum to <= 1.
    denom = max(total, sum(seg.values()))
    return {"segments_ms": seg, "total_ms": total,
            "share": {s: v / denom for s, v in seg.items()},
            "unattributed_ms": un, "unattributed_share": un / total,
            "batch_size": int(shape[0]), "seq_len": int(shape[1]), "gemm_rows": int(shape[2]),
            "segments_sum_ms": float(sum(seg.values())), "rounds": rounds,
            "n_layers": len(encoder.layers)}


def _depth_fraction(cut, n_layers):
    if int(n_layers) != n_layers or n_layers < 1:
        raise ValueError(f"n_layers must be an integer >= 1, got {n_layers}.")
    if int(cut) != cut or not 0 <= cut <= n_layers:
        raise ValueError(f"the cut layer must be an integer in [0, {n_layers}], got {cut}.")
    return (n_layers - cut) / n_layers


def _share(profile, segs):
    return sum(profile["share"][s] for s in segs)


def _n_layers(profile, n_layers):
    n = n_layers if n_layers is not None else profile.get("n_layers")
    if n is None:
        raise ValueError("n_layers is needed for the prune and exit ceilings: pass n_layers= or "
                         "use a profile from segment_profile (it records n_layers).")
    return n


def amdahl_ceilings(profile, family_segments=None, *, n_layers=None, depth=None):
    """{family: (p, ceiling 1/(1-p))} of the segments each family accelerates.

    Parameters
    ----------
    profile : dict
        :func:`segment_profile` output (``share`` {segment: p}; ``n_layers``).
    family_segments : dict {family: tuple of segment}, optional
        Default ``FAMILY_SEGMENTS``. Families in ``FAMILY_DEPTH`` (prune, exit) count their
        segments times the depth fraction (N - cut) / N: they only touch the layers after their
        cut point.
    n_layers : int, optional
        Encoder layers N (default ``profile["n_layers"]``).
    depth : dict {family: cut layer}, optional
        Cut point per depth-limited family (default ``FAMILY_DEPTH``'s: layer 1).

    Returns
    -------
    dict {family: (p, ceiling)}
        p in [0, 1]; ceiling = :func:`amdahl` (p) (inf when p = 1).

    Raises
    ------
    ValueError
        If a depth-limited family is asked for without a layer count, or a cut is out of range.
    """
    out = {}
    depth = dict(depth or {})
    for fam, segs in (family_segments or FAMILY_SEGMENTS).items():
        p = _share(profile, segs)
        if fam in FAMILY_DEPTH:
            cut = depth.get(fam, FAMILY_DEPTH[fam][1])
            p *= _depth_fraction(cut, _n_layers(profile, n_layers))
        p = min(1.0, max(0.0, p))
        out[fam] = (p, amdahl(p))
    return out


def prune_speedup(profile, *, after_layer, keep_ratio, n_layers=None):
    """Amdahl speed-up of token pruning after layer ``after_layer`` keeping ``keep_ratio``.

    Layers a+1..N run on rho·L tokens: their per-token segments (``PER_TOKEN_SEGMENTS``) cost
    rho times as much, attention (``QUADRATIC_SEGMENTS``) rho² times; each segment's share is
    scaled by the depth fraction (N - a) / N. Speed-up = 1 / (1 - p_tok (1 - rho) - p_att
    (1 - rho²)). Padding the batch drops as well is not counted (measured speed-ups may beat
    it at large batches).

    Parameters
    ----------
    profile : dict
        :func:`segment_profile` output.
    after_layer : int
        a, in [0, N].
    keep_ratio : float
        rho, in (0, 1].
    n_layers : int, optional
        N (default ``profile["n_layers"]``).

    Returns
    -------
    dict
        ``p_per_token``, ``p_attention`` (shares after depth scaling), ``speedup`` (at rho),
        ``ceiling`` (rho -> 0: 1 / (1 - p_per_token - p_attention)).

    Raises
    ------
    ValueError
        If ``keep_ratio`` is outside (0, 1] or the layer arguments are out of range.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}.")
    f = _depth_fraction(after_layer, _n_layers(profile, n_layers))
    p_tok = f * _share(profile, PER_TOKEN_SEGMENTS)
    p_att = f * _share(profile, QUADRATIC_SEGMENTS)
    saved = p_tok * (1.0 - keep_ratio) + p_att * (1.0 - keep_ratio ** 2)
    return {"p_per_token": p_tok, "p_attention": p_att,
            "speedup": 1.0 / (1.0 - saved) if saved < 1 else float("inf"),
            "ceiling": amdahl(min(1.0, p_tok + p_att))}


def exit_speedup(profile, *, exit_layer, exit_share=1.0, n_layers=None):
    """Amdahl speed-up when a share ``exit_share`` of the work leaves after ``exit_layer``.

    p = (N - e) / N × share of ``LAYER_SEGMENTS``; speed-up = 1 / (1 - exit_share · p). Inside a
    batch an exited example saves nothing unless the batch shrinks, so ``exit_share`` is the
    share of the *batch work* removed, not of examples.

    Returns
    -------
    dict
        ``p`` (after depth scaling), ``speedup`` (at ``exit_share``), ``ceiling`` (all exit).

    Raises
    ------
    ValueError
        If ``exit_share`` is outside [0, 1] or the layer arguments are out of range.
    """
    if not 0.0 <= exit_share <= 1.0:
        raise ValueError(f"exit_share must be in [0, 1], got {exit_share}.")
    p = min(1.0, _depth_fraction(exit_layer, _n_layers(profile, n_layers))
            * _share(profile, LAYER_SEGMENTS))
    return {"p": p, "speedup": amdahl(exit_share * p), "ceiling": amdahl(p)}

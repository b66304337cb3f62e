"""The per-piece latency model of the composed search (``variants search --cost latency-b1 /
latency-b32``), measured once on this machine and cached.

Measurements at the timing batch (B texts of the search split, tokenised as the sweep
tokenises them; B = 1 or 32), each the median of a few calls after a warm-up:

- ``forward_ms`` and ``w8a8_forward_ms``: the reference's whole forward (token ids -> logits)
  and the same model with every encoder Linear W8A8 (built natively, as it runs: fused layers,
  one stacked q|k|v GEMM), alternated call by call;
- ``gemm_fp32_ms``: every encoder Linear alone, fp32 (``x @ W.T + b``), on the batch's token
  rows, summed;
- ``gemm_int8_ms``: the same Linears as W8A8 (:class:`variants.runtime.int8_linear.Int8Linear`
  on the compiled integer GEMM where it runs here: per-token quantization included).

Then the shares of the forward: the encoder GEMMs' p_g and the rest of the encoder layers' p_r
(attention, activations, norms) from the reference's segment profile
(:func:`variants.sweep.profile.segment_profile`) where it can be taken (BERT-style encoders),
else p_g = gemm_fp32 / forward (at most 0.95; the Linears timed alone) and p_r 80% of the rest;
the untouched rest 1 - p_g - p_r (tokenisation, embeddings, pooling, head). A composed
candidate's predicted time, as a share of the reference's (Amdahl, the design document's
formula applied per piece):

    t = (1 - p_g - p_r) + d · (p_g · g + p_r)

with g the W8A8 GEMMs' time over fp32's (:func:`gemm_ratio`: from the two whole forwards,
(w8a8 / forward - (1 - p_g)) / p_g, so the W8A8 base is predicted as measured; 1 without W8A8),
and d the share of the layers'
per-token work still done: pruning after layer a at keep ratio ρ gives (a + (N - a) ρ) / N (the
calibration texts' realised ratio once built), early exit the mean share of layers run on
calibration (before it is built: :data:`EXIT_PRIOR`), both multiplied when both are in. The
predicted speed-up is 1 / t. What the model leaves out (pruning's token selection, exit's
per-layer head and synchronisation, quantizing an embedding table: a lookup) is why the
finalists are timed, and their measured speed-up stands beside the prediction.
"""

import json
import statistics
import time
from pathlib import Path

#: the share of layers an exit candidate is assumed to run before it is built (replaced by the
#: calibration's measured mean once built)
EXIT_PRIOR = 0.75
GEMM_CAP = 0.95
ROUNDS = 7


def _median_ms(fn, rounds=ROUNDS):
    import mlx.core as mx

    mx.eval(fn())
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        mx.eval(fn())
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def measure(reference, texts, batch):
    """The three measurements (module docstring) on the first ``batch`` of ``texts`` (for B = 1,
    the text of median token length), and the segment profile's layer share where one can be
    taken. Returns a JSON-able dict."""
    import mlx.core as mx
    import mlx.nn as nn

    from variants.arch import activations
    from variants.runtime.int8_linear import Int8Linear, _kernel

    tok = reference.tokenizer
    texts = list(texts)
    if batch == 1:
        encs, _ = tok.encode(texts)
        lengths = [len(e.ids) for e in encs]
        texts = [texts[sorted(range(len(texts)), key=lambda i: lengths[i])[len(texts) // 2]]]
    else:
        texts = texts[:batch]
    encs, _ = tok.encode(texts)
    ids, mask, types = [mx.array(a) for a in tok.batch(encs)]
    module = reference.module
    forward_ms = _median_ms(lambda: module(ids, mask, types))
    rows = int(mask.sum().item())  # BERT packs the real tokens; the GEMMs run on about these
    mods = dict(module.named_modules())
    paths = activations.target_linears(module)
    fp32 = int8 = 0.0
    for p in paths:
        lin = mods[p]
        if not isinstance(lin, nn.Linear):
            continue
        x = mx.random.normal((rows, lin.weight.shape[1]), key=mx.random.key(0))
        q = Int8Linear(lin, native=_kernel() is not None)
        fp32 += _median_ms(lambda: lin(x))
        int8 += _median_ms(lambda: q(x))
    # the W8A8 model as it runs (fused layers, stacked q|k|v) against the reference, alternated
    from variants.families.w8a8 import build as w8a8
    from variants.families.w8a8.family import W8A8Config

    variant, _ = w8a8.build(reference, W8A8Config(), mode="native")
    ref_ms, w8_ms = [], []
    for _ in range(ROUNDS):
        ref_ms.append(_median_ms(lambda: module(ids, mask, types), 1))
        w8_ms.append(_median_ms(lambda: variant.module(ids, mask, types), 1))
    forward_ms, w8a8_ms = statistics.median(ref_ms), statistics.median(w8_ms)
    out = {"batch_size": len(texts), "seq_len": int(ids.shape[1]), "rows": rows,
           "forward_ms": forward_ms, "w8a8_forward_ms": w8a8_ms,
           "gemm_fp32_ms": fp32, "gemm_int8_ms": int8,
           "n_layers": len(module.encoder.layers), "linears": len(paths),
           "int8_native": _kernel() is not None, "gemm_share": None, "rest_layer_share": None}
    try:
        from variants.sweep.profile import LAYER_SEGMENTS, segment_profile
        from variants.sweep.ref_profile import skip_reason

        if skip_reason(reference, 3) is None:
            prof = segment_profile(reference, texts, rounds=3, warmup=1)
            gemm = ("qkv_proj", "out_proj", "mlp_gemm")
            out["gemm_share"] = sum(prof["share"][s] for s in gemm)
            out["rest_layer_share"] = sum(prof["share"][s] for s in LAYER_SEGMENTS
                                          if s not in gemm)
    except (ValueError, RuntimeError, AttributeError):  # a model the profile cannot time
        pass
    return out


def load(reference, texts, batch, cache_dir, key):
    """:func:`measure`'s dict, cached in ``cache_dir/search/latency-model-<key>-B<batch>.json``
    (``key``: the model, the compute path and the versions the times depend on)."""
    path = Path(cache_dir) / "search" / f"latency-model-{key}-B{batch}.json"
    if path.is_file():
        return json.loads(path.read_text()), path
    m = measure(reference, texts, batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(m, indent=1) + "\n")
    tmp.replace(path)
    return m, path


def shares(m):
    """(p_g, p_r): the GEMMs' and the rest of the layers' shares of the forward: the segment
    profile's where it has one, else p_g = gemm_fp32 / forward (at most :data:`GEMM_CAP`) and
    p_r = 80% of the rest."""
    if m.get("gemm_share") is not None:
        return float(m["gemm_share"]), float(m["rest_layer_share"])
    p_g = min(GEMM_CAP, m["gemm_fp32_ms"] / m["forward_ms"])
    return p_g, 0.8 * (1.0 - p_g)


def gemm_ratio(m):
    """g: the encoder GEMMs' time as W8A8 over fp32. From the whole W8A8 forward against the
    reference's where measured (g = (w8a8 / forward - (1 - p_g)) / p_g: the GEMMs as they run,
    fused and stacked), else from the Linears timed alone; clipped to [0.05, 1.5]."""
    if m.get("w8a8_forward_ms"):
        p_g, _ = shares(m)
        g = (m["w8a8_forward_ms"] / m["forward_ms"] - (1.0 - p_g)) / p_g
    else:
        g = m["gemm_int8_ms"] / m["gemm_fp32_ms"]
    return min(1.5, max(0.05, g))


def depth(config, n_layers, summ=None):
    """d: the share of the layers' per-token work a candidate still does (module docstring)."""
    d = 1.0
    if "prune" in config:
        if summ is not None:
            d *= float(summ["prune_work_ratio"])
        else:
            a, r = config["prune"]["after_layer"], config["prune"]["keep_ratio"]
            d *= (a + (n_layers - a) * r) / n_layers
    if "exit" in config:
        d *= float(summ["exit_expected_cost"]) if summ is not None else EXIT_PRIOR
    return d


def predict(m, config, summ=None):
    """Predicted speed-up (> 0) of composed ``config`` over the reference under model ``m``
    (module docstring); ``summ``: its build summary once built
    (:func:`variants.families.composed.build.summary`)."""
    p_g, p_r = shares(m)
    g = gemm_ratio(m) if "w8a8" in config else 1.0
    d = depth(config, m["n_layers"], summ)
    t = (1.0 - p_g - p_r) + d * (p_g * g + p_r)
    return 1.0 / t

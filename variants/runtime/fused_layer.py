"""A whole post-norm BERT layer as one compiled MLX op on the CPU (``fused_layer.cpp`` in
:mod:`variants.runtime.qkernel`): the reference layer's fast path.

A MiniLM layer in MLX ops is ~30 primitives of ~16 us fixed cost each on this CPU: at B=1 L=24
about 1.5 of its 3.3 ms were not arithmetic. The compiled layer does the same algebra as
:class:`variants.arch.encoder.TransformerLayer` on the folded weights (:mod:`variants.runtime.fused`): five
OpenBLAS GEMMs for the projections, the attention per (sequence, head) with the additive key
bias, exp(s - max) softmax, bias + erf-GELU (or ReLU), residual + layer norm, all float32
(outputs equal the MLX path to float32 round-off: tests/runtime/test_fused_layer.py).

It runs only when all of these hold, else the caller keeps the MLX path (the same results):
MLX's default device is the CPU, the extension is built (:func:`variants.runtime.qkernel.load`),
``VARIANTS_FUSED_LAYER`` is not ``off``, the layer is a plain fp32 reference layer (plain
biased ``nn.Linear`` projections at full width, affine layer norms, ``hidden_act`` ``gelu`` /
``gelu_exact`` / ``relu``), no attention probabilities are asked for, and the bias is a key
padding bias (B or 1, 1, 1, L) or None. Low-rank or pruned variants fail the plain Linear
test and take the MLX path.

A quantized layer whose six projections all run :mod:`variants.runtime.qlinear`'s compiled
``dequant-cpp+gemm`` (:func:`qweights`) runs as ``fused_bert_qlayer`` (``fused_qlayer.cpp``):
the same op on the packed weights, dequantized per call into one scratch buffer (the size of
the largest single Linear's qlinear buffer, from MLX's allocator: it counts in the peak memory)
and multiplied unfolded as the MLX path does (``q = (x Wq^T + bq) * scale``, ``k``, ``v`` with
their biases), named ``fused-qlayer-cpp`` in timing records; bit widths and group sizes may
differ per projection (mixed-precision maps).

A W8A8 layer whose six projections all run :mod:`variants.runtime.int8_linear`'s compiled
op (:func:`i8weights`) runs as ``fused_bert_int8layer``
(``fused_int8_layer.cpp``): each projection's per-token quantization, oneDNN integer GEMM and
fp32 epilogue as ``int8_linear`` computes them (the same codes and values for the same input),
q, k and v on one quantization of x and one GEMM on their int8 weights stacked once per weight
set (when their SmoothQuant factors are equal or absent), the activation fused into the
intermediate epilogue; each whole-weight GEMM on the weight's blob reordered once for oneDNN's
matmul primitive (:func:`variants.runtime.int8_linear.prepacked`; the stacked q|k|v packed
once per weight set, the others the Linears' own); named ``fused-int8layer-cpp`` in timing
records.
"""


import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.runtime import device, env, int8_linear, parallel, qkernel, qlinear
from variants.runtime.derived import DerivedWeights

ENV_SWITCH = "VARIANTS_FUSED_LAYER"
#: the forward path's name in timing records (:func:`path_name`)
NAME = "fused-layer-cpp"
#: the quantized layer's path name (:func:`qweights`)
QNAME = "fused-qlayer-cpp"
#: the W8A8 layer's path name (:func:`i8weights`)
I8NAME = "fused-int8layer-cpp"
#: hidden_act -> the kernel's activation code (gelu: erf form, as variants.runtime.fast_ops.gelu)
ACTS = {"gelu": 0, "gelu_exact": 0, "relu": 1}
#: calls of at most this many rows multiply by the kernel's own GEMM on weights pre-packed in
#: 16-column panels (:func:`panels`); larger ones by OpenBLAS on the (K, N) weights
PANEL_ROWS = 32


def enabled():
    """False when ``VARIANTS_FUSED_LAYER`` is ``off`` / ``0`` / ``false`` / ``no``, or inside
    :func:`variants.runtime.plain.plain`."""
    from variants.runtime import plain

    if plain.active():
        return False
    return env.switch_on(ENV_SWITCH)


def _kernel():
    if not (enabled() and device.is_cpu()):
        return None
    mod = qkernel.load()
    return mod if mod is not None and hasattr(mod, "fused_bert_layer") else None


def one_stream_threads(rows=None):
    """How many parts a compiled layer splits into when no other stream is busy (B = 1): 2
    splits each phase's heads, output columns or rows in two, the second part on the kernel's
    helper thread (blocking waits, no spinning), so both cores work on one sequence. Default:
    2 from ``parallel.MIN_ROWS`` rows (``rows``: B * L of the call; None counts as many), else 1;
    always 1 when the stream split is off (``VARIANTS_STREAMS=1``). ``VARIANTS_FUSED_THREADS=1``
    or ``2`` forces it.

    Measured (bench/peers.py, MiniLM B = 1, MLX/ORT fp32 tokens/s, 7 alternated rounds, fresh
    clone on the quiet 2-core machine): one part 0.78 / 0.78 / 0.62 at L = 24 / 128 / 512, two
    parts 0.78 / 0.86 / 0.92. On the shared machine under load 5-7 two parts were slower (median
    ms 20.1 / 124 / 546 against 18.4 / 102 / 487): the helper thread then waits for a core."""
    if len(parallel.streams()) == 1:
        return 1
    raw = env.choice("VARIANTS_FUSED_THREADS")
    if raw in ("1", "2"):
        return int(raw)
    return 2 if rows is None or rows >= parallel.MIN_ROWS else 1


def _affine_norm(n):
    return isinstance(n, nn.LayerNorm) and "weight" in n and "bias" in n


def weights(layer):
    """The kernel's 12 arrays ``(w_qkv_t (D, 3D), b_q, w_o_t (D, D), b_o, g1, b1,
    w_i_t (D, F), b_i (F,), w_u_t (F, D), b_u, g2, b2)`` (vectors (D,) unless noted; cached
    derived weights, :meth:`variants.runtime.fused.FusedAttention.folded` and
    :meth:`variants.runtime.fused.FusedMLP.mlp_weights`) or None when ``layer`` is not a plain fp32
    reference layer."""
    att = getattr(layer, "attention", None)
    if (not hasattr(att, "folded") or not hasattr(layer, "mlp_weights")
            or getattr(layer, "hidden_act", None) not in ACTS):
        return None
    if not (_affine_norm(layer.attention_norm) and _affine_norm(layer.output_norm)):
        return None
    folded = att.folded()
    mlp = layer.mlp_weights() if folded is not None else None
    if mlp is None:
        return None
    w_qkv, b_q, b_o, w_o = folded
    D = w_o.shape[0]
    if (w_qkv.shape != (D, 3 * D) or w_o.shape != (D, D) or att.n_heads * att.head_dim != D
            or w_qkv.dtype != mx.float32):
        return None
    n1, n2 = layer.attention_norm, layer.output_norm
    w = (w_qkv, b_q, w_o, b_o, n1.weight, n1.bias, mlp[0], mlp[1], mlp[2], mlp[3],
         n2.weight, n2.bias)
    # one float16 / bfloat16 parameter (a norm, a bias) keeps the whole layer on the MLX path
    return w if all(a.dtype == mx.float32 for a in w) else None


def _cpp_qlinear(m):
    """Whether ``m`` is a biased :class:`variants.runtime.qlinear.CpuQuantizedLinear` whose calls run
    the compiled ``dequant-cpp+gemm`` kernel now."""
    return (type(m) is qlinear.CpuQuantizedLinear and "bias" in m
            and m.kernel == qlinear.NAMES["cpp"] and m["weight"].dtype == mx.uint32
            and m["scales"].dtype in qlinear.SCALE_DTYPES
            and m["biases"].dtype == m["scales"].dtype and m["bias"].dtype == mx.float32)


def qweights(layer):
    """The quantized layer's arrays for ``fused_bert_qlayer``: ``(proj, group_sizes, bits,
    norms)`` with ``proj`` the 24 arrays ``(w uint32 (N, K * bits / 32), scales (N, K /
    group_size) float32, float16 or bfloat16, biases (same), bias (N,))`` of query, key,
    value, out, intermediate, output (``mx.quantize``'s affine packing; N, K = D, D for the attention and D, F / F, D for the
    MLP), ``group_sizes`` and ``bits`` 6 ints each, ``norms`` ``(g1, b1, g2, b2)`` (D,); or None
    unless every projection is a compiled-kernel :class:`variants.runtime.qlinear.CpuQuantizedLinear`
    (:func:`_cpp_qlinear`) and the layer is otherwise a reference layer (affine norms, an
    ``ACTS`` activation)."""
    att = getattr(layer, "attention", None)
    if not hasattr(att, "folded") or getattr(layer, "hidden_act", None) not in ACTS:
        return None
    mods = tuple(getattr(o, n, None) for o, n in (
        (att, "query"), (att, "key"), (att, "value"), (att, "out"), (layer, "intermediate"),
        (layer, "output")))
    if not all(_cpp_qlinear(m) for m in mods):
        return None
    n1, n2 = getattr(layer, "attention_norm", None), getattr(layer, "output_norm", None)
    if not (_affine_norm(n1) and _affine_norm(n2)):
        return None
    D = mods[3]["weight"].shape[0]
    F = mods[4]["weight"].shape[0]
    shapes = [(m["weight"].shape[0], m["scales"].shape[1] * m.group_size) for m in mods]
    if shapes != [(D, D)] * 4 + [(F, D), (D, F)] or att.n_heads * att.head_dim != D:
        return None
    proj = [m[k] for m in mods for k in ("weight", "scales", "biases", "bias")]
    return (proj, [int(m.group_size) for m in mods], [int(m.bits) for m in mods],
            [n1.weight, n1.bias, n2.weight, n2.bias])


def _int8_linear(m):
    """Whether ``m`` is a biased :class:`variants.runtime.int8_linear.Int8Linear` whose calls run
    the compiled integer GEMM now."""
    return (type(m) is int8_linear.Int8Linear and "bias" in m
            and m.kernel in (int8_linear.NAMES["native"], int8_linear.NAMES["prepacked"])
            and m["wq"].dtype == mx.int8 and m["w_scale"].dtype == mx.float32
            and m["colsum"].dtype == mx.int32 and m["bias"].dtype == mx.float32
            and ("inv_smooth" not in m or m["inv_smooth"].dtype == mx.float32))


def _same_smooth(mods):
    """Whether the Int8Linears ``mods`` quantize their input alike: none has SmoothQuant
    factors, or all have equal ones."""
    sm = [m["inv_smooth"] if "inv_smooth" in m else None for m in mods]
    if all(s is None for s in sm):
        return True
    if any(s is None for s in sm):
        return False
    return all(bool(mx.array_equal(sm[0], s)) for s in sm[1:])


def i8weights(layer):
    """The W8A8 layer's arrays for ``fused_bert_int8layer``: ``(proj, smooth, qkv_shared,
    norms, packed)`` with ``proj`` the 16 arrays ``(wq int8 (N, K), w_scale float32 (N,), colsum int32
    (N,), bias float32 (N,))`` of q|k|v stacked (N = 3D), out, intermediate, output;
    ``smooth`` the six projections' SmoothQuant 1/s (K,) float32 or None; ``qkv_shared`` True
    when q, k and v quantize x alike (:func:`_same_smooth`); ``norms`` ``(g1, b1, g2, b2)``;
    ``packed`` the four weights' prepacked uint8 blobs (each None where oneDNN has no matmul
    primitive: that GEMM runs ``dnnl_gemm_u8s8s32``).
    The stacked arrays and their blob are built once per weight set (cached on the layer like :func:`panels`).
    None unless every projection is a compiled-kernel Int8Linear (:func:`_int8_linear`) and the
    layer is otherwise a reference layer (affine norms, an ``ACTS`` activation, full-width
    heads)."""
    att = getattr(layer, "attention", None)
    if not hasattr(att, "folded") or getattr(layer, "hidden_act", None) not in ACTS:
        return None
    mods = tuple(getattr(o, n, None) for o, n in (
        (att, "query"), (att, "key"), (att, "value"), (att, "out"), (layer, "intermediate"),
        (layer, "output")))
    n1, n2 = getattr(layer, "attention_norm", None), getattr(layer, "output_norm", None)
    parts = mods + (n1, n2)
    if not all(isinstance(m, nn.Module) for m in parts):
        return None
    # the answer for these modules, their arrays and flags as they are now (the checks below
    # cost ~0.1 ms a layer, paid on every forward of a few tokens otherwise)
    key = parts + tuple(v for m in parts for v in m.values()) + tuple(
        getattr(m, "_native", None) for m in mods)
    memo = layer.__dict__.get("_i8memo")
    if memo is None:
        memo = layer.__dict__["_i8memo"] = DerivedWeights()
    return memo.get(key, lambda: _i8weights(layer, att, mods, n1, n2))


def _i8weights(layer, att, mods, n1, n2):
    if not all(_int8_linear(m) for m in mods):
        return None
    if not (_affine_norm(n1) and _affine_norm(n2)):
        return None
    D, F = mods[3]["wq"].shape[0], mods[4]["wq"].shape[0]
    if ([m["wq"].shape for m in mods] != [(D, D)] * 4 + [(F, D), (D, F)]
            or att.n_heads * att.head_dim != D):
        return None
    keys = ("wq", "w_scale", "colsum", "bias")
    sources = tuple(m[k] for m in mods[:3] for k in keys + ("inv_smooth",) if k in m)
    cache = getattr(layer, "_fused_int8", None)
    if cache is None:
        cache = layer._fused_int8 = DerivedWeights()

    def build():
        qkv = [mx.concatenate([m[k] for m in mods[:3]]) for k in keys]
        return qkv, _same_smooth(mods[:3]), int8_linear.prepacked(layer.attention, qkv[0])

    qkv, shared, qkv_packed = cache.get(sources, build)
    proj = list(qkv) + [m[k] for m in mods[3:] for k in keys]
    smooth = [m["inv_smooth"] if "inv_smooth" in m else None for m in mods]
    packed = [qkv_packed] + [int8_linear.prepacked(m, m["wq"]) for m in mods[3:]]
    return proj, smooth, shared, [n1.weight, n1.bias, n2.weight, n2.bias], packed


def panels(layer, w):
    """The four (K, N) projection weights of ``w`` (:func:`weights`) as (N/16, K, 16) panels
    (panel p = columns 16p..16p+15, contiguous; one extra copy of the projection weights, built
    on the first call with at most ``PANEL_ROWS`` rows and cached like ``w``), or None when a
    width is not a multiple of 16."""
    mats = (w[0], w[2], w[6], w[8])
    if any(m.shape[1] % 16 for m in mats):
        return None
    cache = getattr(layer, "_fused_panels", None)
    if cache is None:
        cache = layer._fused_panels = DerivedWeights()
    return cache.get(mats, lambda: tuple(
        mx.contiguous(m.reshape(m.shape[0], m.shape[1] // 16, 16).transpose(1, 0, 2))
        for m in mats))


def _run(kernel, layer, w, rows, lens, key_bias, threads, kind="fp32"):
    common = dict(heads=layer.attention.n_heads, eps1=float(layer.attention_norm.eps),
                  eps2=float(layer.output_norm.eps), act=ACTS[layer.hidden_act],
                  threads=int(threads))
    lens = [int(n) for n in lens]
    if kind == "int8":
        proj, smooth, shared, norms, packed = w
        return kernel.fused_bert_int8layer(rows, lens, key_bias, proj, smooth, shared, norms,
                                           q_scale=float(layer.attention.scale), packed=packed,
                                           **common)
    if kind == "q":
        proj, gs, bits, norms = w
        return kernel.fused_bert_qlayer(rows, lens, key_bias, proj, gs, bits, norms,
                                        q_scale=float(layer.attention.scale),
                                        panels=rows.shape[0] <= PANEL_ROWS, **common)
    if rows.shape[0] <= PANEL_ROWS:
        p = panels(layer, w)
        w = w if p is None else (*w, *p)
    return kernel.fused_bert_layer(rows, lens, key_bias, list(w), **common)


def _weights_any(layer):
    """(arrays, kind): :func:`weights` ("fp32"), else :func:`qweights` ("q"), else
    :func:`i8weights` ("int8"), or (None, None)."""
    w = weights(layer)
    if w is not None:
        return w, "fp32"
    q = qweights(layer)
    if q is not None:
        return q, "q"
    i8 = i8weights(layer) if hasattr(_kernel(), "fused_bert_int8layer") else None
    return (i8, "int8") if i8 is not None else (None, None)


def _width(w, kind):
    return {"fp32": lambda: w[2].shape[0], "q": lambda: w[3][0].shape[0],
            "int8": lambda: w[0][4].shape[0]}[kind]()


def forward(layer, x, bias, threads=0):
    """The layer on ``x`` (B, L, D) float32 with ``bias`` (B or 1, 1, 1, L) additive key bias or
    None -> (B, L, D), or None when the fused layer does not apply (the caller runs the MLX
    path). ``threads`` >= 2: split over the kernel's helper thread (only when no other stream
    is busy, :func:`one_stream_threads`); 0 or 1: on the calling stream alone. A quantized
    layer (:func:`qweights`) runs ``fused_bert_qlayer``, a W8A8 one (:func:`i8weights`)
    ``fused_bert_int8layer``."""
    kernel = _kernel()
    if kernel is None or x.ndim != 3 or x.dtype != mx.float32:
        return None
    w, kind = _weights_any(layer)
    if w is None or x.shape[-1] != _width(w, kind):
        return None
    B, L, D = x.shape
    kb = None
    if bias is not None:
        if bias.ndim != 4 or bias.shape[1:3] != (1, 1) or bias.shape[0] not in (1, B) \
                or bias.shape[-1] != L:
            return None  # a per-query or per-head bias: the MLX path
        kb = mx.broadcast_to(bias.reshape(bias.shape[0], L).astype(mx.float32), (B, L))
        kb = kb.reshape(B * L)
    y = _run(kernel, layer, w, x.reshape(B * L, D), [L] * B, kb, threads, kind)
    return y.reshape(B, L, D)


def forward_packed(layer, x, part, threads=0):
    """The layer on a packed part (:mod:`variants.runtime.packing`): ``x`` (n, D) the part's real tokens,
    sequence after sequence -> (n, D), or None when the fused layer does not apply. No bias:
    each sequence attends to its own real tokens only."""
    kernel = _kernel()
    if kernel is None or x.ndim != 2 or x.dtype != mx.float32 or part.lens is None:
        return None
    w, kind = _weights_any(layer)
    if w is None or x.shape[-1] != _width(w, kind):
        return None
    return _run(kernel, layer, w, x, part.lens, None, threads, kind)


def applies(layers):
    """Whether the fused layer (fp32, quantized or W8A8) runs for every layer of ``layers``
    here."""
    return _kernel() is not None and all(_weights_any(layer)[0] is not None
                                         for layer in layers)


def _names(layers):
    """The compiled paths ``layers`` run here: a sorted list of NAME / QNAME / I8NAME."""
    if _kernel() is None:
        return []
    names = {"fp32": NAME, "q": QNAME, "int8": I8NAME}
    return sorted({names[k] for w, k in map(_weights_any, layers) if w is not None})


def path_name(layers):
    """``"fused-layer-cpp"`` (fp32 layers), ``"fused-qlayer-cpp"`` (quantized ones) or
    ``"fused-int8layer-cpp"`` (W8A8 ones), comma-joined when mixed, when :func:`applies`; else
    None."""
    return ", ".join(_names(layers)) if layers and applies(layers) else None


def used_by(layers):
    """``"fused-layer-cpp"``, ``"fused-qlayer-cpp"`` and/or ``"fused-int8layer-cpp"``
    (comma-joined) when any of the BERT ``layers`` runs compiled here, else None: for timing
    records (:func:`variants.arch.encoder.compiled_paths` finds a module's layers)."""
    return ", ".join(_names(layers)) or None


def lens_of(mask_rows):
    """Real tokens per sequence of ``mask_rows`` (b, L) 0/1 NumPy: a tuple of ints."""
    return tuple(int(n) for n in np.asarray(mask_rows).astype(bool).sum(axis=1))

"""A quantized ModernBERT layer as one compiled MLX op on the CPU (``fused_mbert_qlayer.cpp`` in
:mod:`variants.runtime.qkernel`), as :mod:`variants.runtime.fused_layer`'s ``qweights`` is to MiniLM's layer.

A quantized ModernBERT (:func:`variants.families.quant.build.quantize_module`, then
:func:`variants.runtime.qlinear.use_cpu_path`) has no fp32 fast weights
(:func:`variants.arch.modernbert_fast.layer_weights` is None), so its layers used to run the plain MLX
path, each projection a ``dequant-cpp+gemm`` call. Here each layer whose four projections
(``Wqkv``, ``Wo``, ``Wi``, the MLP's ``Wo``) all run that compiled kernel (:func:`_cpp_qlinear`)
runs as one op: every phase part dequantizes the weight rows it multiplies (bit-identical to
``mx.dequantize``) into one scratch buffer of max(3D, 2F) x D floats from MLX's allocator (it
counts in ``mx.get_peak_memory()``: the size of the largest single Linear's qlinear buffer),
then the plain path's algebra, unfolded (q scaled by 1/sqrt(head_dim) after the projection;
GeGLU's input and gate halves are rows [0, F) and [F, 2F) of ``Wi``), with
:mod:`variants.arch.modernbert_fused`'s attention, exact sliding window, rotary, norms and work
split. Bit widths and group sizes may differ per projection (mixed-precision maps); layers left
fp32 in the same stack run :mod:`variants.arch.modernbert_fused`'s op. Outputs equal the plain
quantized MLX path to float32 round-off (tests/arch/test_modernbert_fused_q.py).

It runs when :func:`variants.arch.modernbert.fast_forward` finds a layer that is not plain fp32 and
all of these hold, else the plain path (the same results): MLX's default device is the CPU,
the extension is built, ``VARIANTS_FUSED_LAYER`` is not ``off``, every layer is quantized as
above or an fp32 layer the fused op takes, the norms are float32 LayerNorms (or layer 0's
identity), the activation is in :data:`variants.arch.modernbert_fused.ACTS`, and the local
attention mode is not ``masked``. Low-rank or pruned Linears and quantized Linears on another
kernel (``quantized_matmul``, ``unpack+gemm``, ``dequant+gemm``) take the plain path. Timing
records name it :data:`NAME` (:func:`used_by`).

W8A8 layers (every projection a native :class:`variants.runtime.int8_linear.Int8Linear`) run in the
same stack as :mod:`variants.arch.modernbert_fused_i8`'s op (``fused-mbert-int8layer-cpp``).
"""


import mlx.core as mx
import numpy as np

from variants.arch import modernbert_fused as mf
from variants.arch import modernbert_fused_i8 as mi8
from variants.runtime import env, parallel, qlinear
from variants.arch.encoder import MASK_BIAS

#: the quantized layers' path name in timing records
NAME = "fused-mbert-qlayer-cpp"
#: calls of at most this many rows (per stream) dequantize into 16-column panels for the
#: kernel's small-row GEMM, larger ones into (N, K) rows for OpenBLAS. Measured (3
#: ModernBERT-base layers, q8 / q4 g64, 7 alternated rounds, shared machine; OpenBLAS time /
#: panels time): B=1 L=24 1.07 / 1.03, L=128 0.98 / 1.01, L=256 0.97 / 0.97, B=2 L=64 0.90 /
#: 0.93 (the panels' transposing dequantization costs what the panel GEMM saves beyond a few
#: dozen rows; the fp32 op's panels are built once, hence its larger PANEL_ROWS)
QPANEL_ROWS = 64


def _kernel():
    k = mf._kernel()
    return k if k is not None and hasattr(k, "fused_mbert_qlayer") else None


def _cpp_qlinear(m):
    """Whether ``m`` is a :class:`variants.runtime.qlinear.CpuQuantizedLinear` (bias or not) whose calls
    run the compiled ``dequant-cpp+gemm`` kernel now, with float32 bias and float32, float16 or
    bfloat16 scales and biases (the same dtype)."""
    return (type(m) is qlinear.CpuQuantizedLinear and m.kernel == qlinear.NAMES["cpp"]
            and m["weight"].dtype == mx.uint32 and m["scales"].dtype in qlinear.SCALE_DTYPES
            and m["biases"].dtype == m["scales"].dtype
            and ("bias" not in m or m["bias"].dtype == mx.float32))


def qlayer_args(layer):
    """The op's arguments for a quantized :class:`variants.arch.modernbert_layers.ModernBertLayer`:
    ``(proj, group_sizes, bits, norms, eps1, eps2, act)`` with ``proj`` the 16 arrays ``(w uint32
    (N, K * bits / 32), scales (N, K / group_size), biases (same), bias (N,) or None)`` of
    ``Wqkv`` (3D, D), ``Wo`` (D, D), ``Wi`` (2F, D), the MLP's ``Wo`` (D, F), ``group_sizes`` and
    ``bits`` 4 ints each, ``norms`` ``(g1, b1, g2, b2)`` (D,) or None where absent; or None
    unless every projection is a compiled-kernel quantized Linear (:func:`_cpp_qlinear`)."""
    att, mlp = layer.attn, layer.mlp
    mods = (att.Wqkv, att.Wo, mlp.Wi, mlp.Wo)
    if not all(_cpp_qlinear(m) for m in mods):
        return None
    act = mf.ACTS.get(mlp.hidden_activation)
    n1, n2 = mf._norm(layer.attn_norm), mf._norm(layer.mlp_norm)
    if act is None or n1 is False or n2 is False or n2[0] is None:
        return None
    D = mods[1]["weight"].shape[0]
    F = mods[3]["scales"].shape[1] * mods[3].group_size
    shapes = [(m["weight"].shape[0], m["scales"].shape[1] * m.group_size) for m in mods]
    if shapes != [(3 * D, D), (D, D), (2 * F, D), (D, F)] or att.n_heads * att.head_dim != D:
        return None
    proj = [m[k] if k in m else None for m in mods for k in ("weight", "scales", "biases", "bias")]
    return (proj, [int(m.group_size) for m in mods], [int(m.bits) for m in mods],
            [n1[0], n1[1], n2[0], n2[1]], n1[2], n2[2], act)


def _layer_args(layer):
    """("q", :func:`qlayer_args`), ("i8", :func:`variants.arch.modernbert_fused_i8.i8layer_args`;
    where the op is built with oneDNN) or ("f", :func:`variants.arch.modernbert_fused.layer_args`),
    or None."""
    q = qlayer_args(layer)
    if q is not None:
        return "q", q
    i8 = mi8.i8layer_args(layer)
    if i8 is not None:
        return "i8", i8
    f = mf.layer_args(layer)
    return None if f is None else ("f", f)


def _stack(kernel, encoder, all_args, x, mask, threads, i8_threads=None):
    """The layers on ``x`` (b, L, D) with ``mask`` (b, L) NumPy 0/1 -> (b, L, D); W8A8 layers
    in ``i8_threads`` parts (None: ``threads``), the others in ``threads``."""
    i8_threads = threads if i8_threads is None else i8_threads
    b, L, D = x.shape
    tabs = mf._tables(encoder.args, L)
    half = encoder.args.local_attention // 2
    kb = None
    if not mask.all():
        kb = mx.array(((1 - mask.astype(np.float32)) * MASK_BIAS).reshape(b * L))
    h = x.reshape(b * L, D)
    for layer, (kind, a) in zip(encoder.layers, all_args):
        cos, sin = tabs[layer.is_global]
        hw = -1 if layer.is_global else half
        if kind == "i8":
            h = mi8.run(kernel, layer, a, h, [L] * b, kb, cos, sin, hw, i8_threads)
            continue
        if kind == "q":
            proj, gs, bits, norms, eps1, eps2, act = a
            h = kernel.fused_mbert_qlayer(
                h, [L] * b, kb, cos, sin, proj, gs, bits, norms, heads=layer.attn.n_heads,
                q_scale=float(layer.attn.scale), eps1=eps1, eps2=eps2, act=act, half=hw,
                threads=threads, panels=b * L <= QPANEL_ROWS)
            continue
        w, eps1, eps2, act = a
        if b * L <= mf.PANEL_ROWS:
            p = mf.panels(layer, w)
            w = w if p is None else (*w, *p)
        h = kernel.fused_mbert_layer(h, [L] * b, kb, cos, sin, list(w), heads=layer.attn.n_heads,
                                     eps1=eps1, eps2=eps2, act=act, half=hw,
                                     local_block=mf.LOCAL_BLOCK, threads=threads)
    return h.reshape(b, L, D)


def forward(encoder, x, mask, mode):
    """The layer stack of a :class:`variants.arch.modernbert.ModernBertEncoder` with at least one
    quantized layer on embeddings ``x`` (B, L, D) float32 with ``mask`` (B, L) NumPy 0/1,
    positions 0..L-1, before ``final_norm`` -> (B, L, D); None when the op does not apply (see
    the module docstring). Work split as :func:`variants.arch.modernbert_fused.forward`, but
    at B = 1 W8A8 layers run in two parts only from
    :data:`variants.arch.modernbert_fused_i8.SPLIT_ROWS_B1` real tokens."""
    kernel = _kernel()
    if kernel is None or mode == "masked" or x.dtype != mx.float32 or x.ndim != 3:
        return None
    all_args = [_layer_args(layer) for layer in encoder.layers]
    if any(a is None for a in all_args) or all(a[0] == "f" for a in all_args):
        return None
    ss = parallel.streams()
    B, L = mask.shape
    if B >= 2 and len(ss) > 1 and B * L >= mf.SPLIT_BATCH_ROWS:
        outs = []
        for s, (a, b) in zip(ss, parallel.bounds(B, len(ss))):
            with mx.stream(s):
                outs.append(_stack(kernel, encoder, all_args, x[a:b], mask[a:b], 1))
        return mx.concatenate(outs, axis=0)
    tokens = int(mask.sum())
    threads = 2 if len(ss) > 1 and (B >= 2 or tokens >= mf.SPLIT_ROWS_B1) else 1
    i8_threads = 2 if len(ss) > 1 and (B >= 2 or tokens >= mi8.SPLIT_ROWS_B1) else 1
    forced = env.choice("VARIANTS_FUSED_THREADS")  # as modernbert_fused
    if forced in ("1", "2") and len(ss) > 1:
        threads = i8_threads = int(forced)
    return _stack(kernel, encoder, all_args, x, mask, threads, i8_threads)


def applies(encoder):
    """Whether :func:`forward` runs the ops for ``encoder``'s layers here (auto / windowed local
    attention): at least one quantized or W8A8 layer, every layer quantized, W8A8 or fused
    fp32."""
    if _kernel() is None:
        return False
    kinds = [_layer_args(layer) for layer in encoder.layers]
    return all(k is not None for k in kinds) and any(k[0] != "f" for k in kinds)


def used_by(encoder):
    """The ops ``encoder`` (a ModernBERT encoder on its fast path, windowed local attention) runs
    its layers through here, comma-joined: :data:`variants.arch.modernbert_fused.NAME` for fp32
    layers, :data:`NAME` for quantized ones,
    :data:`variants.arch.modernbert_fused_i8.NAME` for W8A8 ones; None when :func:`applies` is
    False. For timing records (:func:`variants.arch.modernbert.compiled_paths` finds the
    encoders of a module)."""
    if not applies(encoder):
        return None
    kinds = {_layer_args(layer)[0] for layer in encoder.layers}
    names = {"f": mf.NAME, "q": NAME, "i8": mi8.NAME}
    return ", ".join(names[k] for k in ("f", "q", "i8") if k in kinds)

"""A W8A8 ModernBERT layer as one compiled MLX op on the CPU (``fused_mbert_int8layer.cpp`` in
:mod:`variants.runtime.qkernel`), as :func:`variants.runtime.fused_layer.i8weights` is to MiniLM's layer.

A W8A8 ModernBERT (:func:`variants.families.w8a8.build.build`, ``native``) has no fp32 fast
weights, so its layers used to run the plain MLX path: each of ``Wqkv``, ``Wo``, ``Wi``, the
MLP's ``Wo`` an ``int8_linear`` call (quantize, oneDNN integer GEMM, epilogue) with ~20 MLX
ops between them. Here each layer whose four projections all run that compiled kernel
(:func:`_native_int8`) runs as one op: each GEMM input quantized once per part (``Wqkv``'s
3D rows and ``Wi``'s 2F rows one GEMM each), the epilogues fused (scales, bias, the query's
1/sqrt(head_dim), the residual, GeGLU), with :mod:`variants.arch.modernbert_fused`'s attention,
exact sliding window, rotary, norms and work split. SmoothQuant's 1/s per projection is
applied inside its quantizer, as ``int8_linear`` does. Outputs equal the plain W8A8 MLX path
and the simulated (fake-quantized fp32) layer to float32 round-off
(tests/arch/test_modernbert_fused_i8.py).

:mod:`variants.arch.modernbert_fused_q` dispatches: it runs a stack whose layers are each
quantized, W8A8 (:func:`i8layer_args`) or fp32-fused, under the conditions its docstring
lists, and MLX's default device being the CPU with oneDNN built in. Timing records name it
:data:`NAME`.
"""

import mlx.core as mx

from variants.arch import modernbert_fused as mf
from variants.runtime import int8_linear
from variants.runtime.derived import DerivedWeights

#: the W8A8 layers' path name in timing records
NAME = "fused-mbert-int8layer-cpp"
#: B = 1 runs each W8A8 layer in two parts over the kernel's helper thread from this many real
#: tokens (fp32 layers from :data:`variants.arch.modernbert_fused.SPLIT_ROWS_B1` = 8; the BERT
#: layers from :data:`variants.runtime.parallel.MIN_ROWS`): the integer GEMMs of a few dozen rows
#: take ~0.5 ms a layer, less than the helper's four hand-offs cost on a shared machine.
#: Measured (3 ModernBERT-base layers, one process, alternated rounds, 2-core machine at load
#: 4-5; p10 ms one part / two parts): L=24 2.6 / 7.0, 64 11.9 / 14.8, 128 20.3 / 22.7.
SPLIT_ROWS_B1 = 32


def kernel():
    """The compiled extension when it has the op and oneDNN and the fused layers apply here
    (:func:`variants.arch.modernbert_fused._kernel`), else None."""
    k = mf._kernel()
    ok = (k is not None and hasattr(k, "fused_mbert_int8layer")
          and int8_linear._kernel() is not None)  # oneDNN, with an exact scheme here
    return k if ok else None


def _native_int8(m):
    """Whether ``m`` is an :class:`variants.runtime.int8_linear.Int8Linear` (bias or not) whose calls
    run the compiled integer GEMM now, with float32 scales, bias and 1/s."""
    return (type(m) is int8_linear.Int8Linear
            and m.kernel in (int8_linear.NAMES["native"], int8_linear.NAMES["prepacked"])
            and m["wq"].dtype == mx.int8 and m["w_scale"].dtype == mx.float32
            and m["colsum"].dtype == mx.int32
            and all(k not in m or m[k].dtype == mx.float32 for k in ("bias", "inv_smooth")))


def i8layer_args(layer):
    """The op's arguments for a W8A8 :class:`variants.arch.modernbert_layers.ModernBertLayer`:
    ``(proj, smooth, norms, eps1, eps2, act)`` with ``proj`` the 16 arrays ``(wq int8 (N, K),
    w_scale float32 (N,), colsum int32 (N,), bias float32 (N,) or None)`` of ``Wqkv`` (3D, D),
    ``Wo`` (D, D), ``Wi`` (2F, D), the MLP's ``Wo`` (D, F), ``smooth`` their SmoothQuant 1/s
    (K,) float32 or None, ``norms`` ``(g1, b1, g2, b2)`` (D,) or None where absent; or None
    unless the op applies here (:func:`kernel`), every projection is a compiled-kernel
    Int8Linear (:func:`_native_int8`), the norms float32 LayerNorms (or layer 0's identity) and
    the activation in :data:`variants.arch.modernbert_fused.ACTS`."""
    return _memo(layer)[0]


def _memo(layer):
    """(:func:`i8layer_args`, the four weights' prepacked blobs or None) of ``layer``, kept on
    the layer until its modules, their arrays, their ``native`` flags or the loaded extension
    change (the checks cost ~0.1 ms a layer, paid on every forward of a few tokens otherwise)."""
    att, mlp = layer.attn, layer.mlp
    parts = (att.Wqkv, att.Wo, mlp.Wi, mlp.Wo, layer.attn_norm, layer.mlp_norm)
    key = (kernel(), mlp.hidden_activation, att.n_heads, att.head_dim) + parts + tuple(
        v for m in parts for v in m.values()) + tuple(m.__dict__.get("_native") for m in parts)
    memo = layer.__dict__.get("_i8memo")
    if memo is None:
        memo = layer.__dict__["_i8memo"] = DerivedWeights()
    return memo.get(key, lambda: _build(layer))


def _build(layer):
    args = _args(layer) if kernel() is not None else None
    if args is None:
        return None, None
    mods = (layer.attn.Wqkv, layer.attn.Wo, layer.mlp.Wi, layer.mlp.Wo)
    return args, [int8_linear.prepacked(m, m["wq"]) for m in mods]


def _args(layer):
    att, mlp = layer.attn, layer.mlp
    mods = (att.Wqkv, att.Wo, mlp.Wi, mlp.Wo)
    if not all(_native_int8(m) for m in mods):
        return None
    act = mf.ACTS.get(mlp.hidden_activation)
    n1, n2 = mf._norm(layer.attn_norm), mf._norm(layer.mlp_norm)
    if act is None or n1 is False or n2 is False or n2[0] is None:
        return None
    D, F = mods[1]["wq"].shape[0], mods[3]["wq"].shape[1]
    if ([m["wq"].shape for m in mods] != [(3 * D, D), (D, D), (2 * F, D), (D, F)]
            or att.n_heads * att.head_dim != D):
        return None
    proj = [m[k] if k in m else None for m in mods for k in ("wq", "w_scale", "colsum", "bias")]
    smooth = [m["inv_smooth"] if "inv_smooth" in m else None for m in mods]
    return proj, smooth, [n1[0], n1[1], n2[0], n2[1]], n1[2], n2[2], act


def run(kernel, layer, args, h, lens, kb, cos, sin, half, threads):
    """``layer`` through the op on rows ``h`` (n, D) (``args``: :func:`i8layer_args`); each
    projection's whole-weight GEMM on its prepacked blob
    (:func:`variants.runtime.int8_linear.prepacked`, made on the first call, kept on the Linear)."""
    proj, smooth, norms, eps1, eps2, act = args
    memo = _memo(layer)
    packed = memo[1] if args is memo[0] else [
        int8_linear.prepacked(m, m["wq"])
        for m in (layer.attn.Wqkv, layer.attn.Wo, layer.mlp.Wi, layer.mlp.Wo)]
    return kernel.fused_mbert_int8layer(h, lens, kb, cos, sin, proj, smooth, norms,
                                        heads=layer.attn.n_heads, q_scale=float(layer.attn.scale),
                                        eps1=eps1, eps2=eps2, act=act, half=half, threads=threads,
                                        packed=packed)

"""A whole ModernBERT pre-norm layer as one compiled MLX op on the CPU (``fused_mbert_layer.cpp``
in :mod:`variants.runtime.qkernel`): the fast path's (:mod:`variants.arch.modernbert_fast`) layers, each ~25-30
MLX primitives of ~16 us fixed cost, as one primitive each.

The op does :func:`variants.arch.modernbert_fast.layer_forward`'s algebra on the same derived weights
(:func:`variants.arch.modernbert_fast.layer_weights`): x + Wo·attn(LN1(x)), then
x + Wout·(act(h·Win) * (h·Wgate)) with h = LN2(x), rotary q and k from
:func:`variants.arch.modernbert_fast.rope_for_length`'s tables (the layer's global or local θ), the
key padding bias, and the local layers' sliding window computed exactly (each query's softmax
over its keys |q - k| <= local_attention // 2 only, blocks of 16 queries multiplying only the
keys their window reaches); float32 throughout, outputs equal the MLX path to float32 round-off
(tests/arch/test_modernbert_fused.py).

It runs when all of these hold, else :func:`variants.arch.modernbert.fast_forward` keeps the MLX path
(the same results): MLX's default device is the CPU, the extension is built
(:func:`variants.runtime.qkernel.load`), ``VARIANTS_FUSED_LAYER`` is not ``off`` (the switch the BERT
layer op reads, :mod:`variants.runtime.fused_layer`), every layer has fast weights (plain fp32
``nn.Linear`` projections) and float32 layer norms, the activation is in :data:`ACTS`, and the
local attention mode is not ``masked`` (kept as the A/B baseline of
:mod:`variants.arch.modernbert_window`). Timing records name it :data:`NAME` (:func:`used_by`).

Work split: B = 1 from :data:`SPLIT_ROWS_B1` real tokens, each layer in two parts (heads, output
columns) over the kernel's helper thread; B >= 2 by sequences over the streams. Memory: besides
the fast path's derived weights, calls of at most :data:`PANEL_ROWS` rows build the projection
weights once more as 16-column panels (ModernBERT-base: ~20 MB a layer), kept with the layer.
"""

import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.runtime import env, fused_layer, parallel
from variants.runtime.derived import DerivedWeights
from variants.arch.encoder import MASK_BIAS

#: the forward path's name in timing records
NAME = "fused-mbert-layer-cpp"
#: hidden_activation -> the kernel's code: 0 erf GELU (variants.runtime.fast_ops.gelu / nn.gelu),
#: 1 ReLU, 2 tanh GELU (nn.gelu_approx)
ACTS = {"gelu": 0, "gelu_exact": 0, "relu": 1, "gelu_new": 2, "gelu_pytorch_tanh": 2}
#: B = 1 splits each layer in two parts over the kernel's helper thread from this many rows
SPLIT_ROWS_B1 = 8
#: B >= 2 splits the batch by sequences over :func:`variants.runtime.parallel.streams` (one op per stream
#: and layer, one part each) from this many rows B * L (as the MLX fast path); below, one op per
#: layer runs in two parts over the helper thread. Measured (3 ModernBERT-base layers, one
#: process, 7 alternated rounds, shared 2-core machine; split-by-streams time / two-parts time):
#: B=2 L=24 0.88 (24 rows a stream: the panel GEMM), B=8 L=24 0.99 and 1.06 (two runs),
#: B=8 L=64 0.98, B=3 L=70 1.05, B=4 L=128 0.92, B=8 L=128 0.93.
SPLIT_BATCH_ROWS = parallel.MIN_ROWS
#: calls of at most this many rows (per stream) multiply by the kernel's panel GEMM on weights
#: pre-packed in 16-column panels (:func:`panels`: one more copy of the projection weights,
#: built on the first such call), larger ones by OpenBLAS. Unlike MiniLM's 384-wide layers
#: (fused_layer.PANEL_ROWS = 32), ModernBERT-base's gain up to a few hundred rows: time with
#: panels / with OpenBLAS (3 layers, one process, 5-7 alternated rounds, shared machine) B=1
#: L=48 0.90, 64 0.90, 96 0.89, 128 0.97 and 0.88, 256 0.95 and 0.96, 512 0.98; B=8 L=128
#: (512 rows a stream) 1.04.
PANEL_ROWS = 256
#: a local layer's query block in the op (0: its own choice, see fused_mbert_layer.cpp)
LOCAL_BLOCK = 0


def _kernel():
    k = fused_layer._kernel()
    return k if k is not None and hasattr(k, "fused_mbert_layer") else None


def _norm(n):
    """(weight, bias or None, eps) of a float32 LayerNorm, (None, None, 0.0) for the identity,
    or False for anything else."""
    if type(n) is nn.Identity:
        return None, None, 0.0
    if not isinstance(n, nn.LayerNorm) or "weight" not in n:
        return False
    b = n.bias if "bias" in n else None
    if n.weight.dtype != mx.float32 or (b is not None and b.dtype != mx.float32):
        return False
    return n.weight, b, float(n.eps)


def layer_args(layer):
    """(the op's 14 arrays (:func:`variants.arch.modernbert_fast.layer_weights`' ten, then g1, b1,
    g2, b2: None where absent), eps1, eps2, act code) of a
    :class:`variants.arch.modernbert_layers.ModernBertLayer`, or None when the op does not apply."""
    from variants.arch import modernbert_fast

    w = modernbert_fast.layer_weights(layer)
    act = ACTS.get(layer.mlp.hidden_activation)
    n1, n2 = _norm(layer.attn_norm), _norm(layer.mlp_norm)
    if w is None or act is None or n1 is False or n2 is False or n2[0] is None:
        return None
    if any(a is not None and a.dtype != mx.float32 for a in w):
        return None
    return (*w, n1[0], n1[1], n2[0], n2[1]), n1[2], n2[2], act


def panels(layer, w):
    """The five (K, N) weights of ``w`` (w_qkv_t, w_o_t, w_in_t, w_gate_t, w_out_t) as
    (N/16, K, 16) panels for the kernel's small-row GEMM (cached like the weights; one more
    copy of them), or None when a width is not a multiple of 16."""
    mats = (w[0], w[2], w[4], w[6], w[8])
    if any(m.shape[1] % 16 for m in mats):
        return None
    cache = layer.__dict__.setdefault("_mbert_panels", DerivedWeights())
    return cache.get(mats, lambda: tuple(
        mx.contiguous(m.reshape(m.shape[0], m.shape[1] // 16, 16).transpose(1, 0, 2))
        for m in mats))


def _tables(args, L):
    from variants.arch.modernbert_fast import rope_for_length

    hd = args.hidden_size // args.num_attention_heads
    out = {}
    for is_global, theta in ((True, args.global_rope_theta), (False, args.local_rope_theta)):
        cos, sin = rope_for_length(L, theta, hd)[:2]
        out[is_global] = (cos.reshape(L, hd), sin.reshape(L, hd))
    return out


def _stack(kernel, encoder, all_args, x, mask, threads):
    """The layers on ``x`` (b, L, D) with ``mask`` (b, L) NumPy 0/1 -> (b, L, D)."""
    b, L, D = x.shape
    tabs = _tables(encoder.args, L)
    half = encoder.args.local_attention // 2
    kb = None
    if not mask.all():
        kb = mx.array(((1 - mask.astype(np.float32)) * MASK_BIAS).reshape(b * L))
    h = x.reshape(b * L, D)
    for layer, (w, eps1, eps2, act) in zip(encoder.layers, all_args):
        if b * L <= PANEL_ROWS:
            p = panels(layer, w)
            w = w if p is None else (*w, *p)
        cos, sin = tabs[layer.is_global]
        h = kernel.fused_mbert_layer(h, [L] * b, kb, cos, sin, list(w), heads=layer.attn.n_heads,
                                     eps1=eps1, eps2=eps2, act=act,
                                     half=-1 if layer.is_global else half,
                                     local_block=LOCAL_BLOCK, threads=threads)
    return h.reshape(b, L, D)


def forward(encoder, x, mask, mode):
    """The layer stack of a :class:`variants.arch.modernbert.ModernBertEncoder` on embeddings ``x``
    (B, L, D) float32 with ``mask`` (B, L) NumPy 0/1, positions 0..L-1, before ``final_norm``
    -> (B, L, D); None when the op does not apply (see the module docstring)."""
    kernel = _kernel()
    if kernel is None or mode == "masked" or x.dtype != mx.float32 or x.ndim != 3:
        return None
    all_args = [layer_args(layer) for layer in encoder.layers]
    if any(a is None for a in all_args):
        return None
    ss = parallel.streams()
    B, L = mask.shape
    if B >= 2 and len(ss) > 1 and B * L >= SPLIT_BATCH_ROWS:
        outs = []
        for s, (a, b) in zip(ss, parallel.bounds(B, len(ss))):
            with mx.stream(s):
                outs.append(_stack(kernel, encoder, all_args, x[a:b], mask[a:b], 1))
        return mx.concatenate(outs, axis=0)
    threads = 2 if len(ss) > 1 and (B >= 2 or mask.sum() >= SPLIT_ROWS_B1) else 1
    forced = env.choice("VARIANTS_FUSED_THREADS")  # as variants.runtime.fused_layer
    threads = int(forced) if forced in ("1", "2") and len(ss) > 1 else threads
    return _stack(kernel, encoder, all_args, x, mask, threads)


def applies(encoder):
    """Whether :func:`forward` runs the op for ``encoder``'s layers here (auto / windowed
    local attention)."""
    return _kernel() is not None and all(layer_args(layer) is not None
                                         for layer in encoder.layers)


def used_by(encoder):
    """:data:`NAME` when ``encoder`` (a ModernBERT encoder on its fast path, windowed local
    attention) runs its layers through the op here, else None: for timing records
    (:func:`variants.arch.modernbert.compiled_paths` finds the encoders of a module)."""
    return NAME if applies(encoder) else None

"""What changes a model's outputs besides its weights, data and tokenizer: the package and MLX
versions and the compute path this process takes. A part of every cache key
(:meth:`variants.models.decision.DecisionModel.cache_key`), so outputs computed by another version or
along another path are recomputed, never mixed in.

The compute path is read from the switches that choose it, as they are set now (each is read
afresh when a kernel runs, so a key made after a change sees it):

- ``qkernel``: the compiled CPU kernel for quantized Linears (``VARIANTS_QKERNEL``,
  :func:`variants.runtime.qkernel.enabled`);
- ``fused_layer``: the compiled encoder layers (``VARIANTS_FUSED_LAYER``,
  :func:`variants.runtime.fused_layer.enabled`);
- ``streams``: the CPU streams a layer splits over (``VARIANTS_STREAMS``; 1 = no split),
  ``fused_threads``: a compiled layer's parts (``VARIANTS_FUSED_THREADS``; "auto" unless forced);
- ``modernbert_attention``: ModernBERT's local attention path (``VARIANTS_MODERNBERT_ATTENTION``);
- ``blas``: the BLAS library MLX's CPU GEMMs run on (:data:`variants.BLAS_INFO`).

Only the switches are read (nothing is built or loaded): a kernel that is switched on but
cannot be built falls back to MLX with the same results (:mod:`variants.runtime.qkernel`).
"""

import os


def key_part():
    """``{"mlx_variants": str, "mlx": str, "path": {...}}`` (module docstring), JSON-able."""
    import mlx.core as mx

    import variants
    from variants.runtime import fused_layer
    from variants.arch import modernbert_window
    from variants.runtime import env, parallel, qkernel

    blas = variants.BLAS_INFO.get("library")
    path = {"qkernel": qkernel.enabled(), "fused_layer": fused_layer.enabled(),
            "streams": parallel._requested(),
            "fused_threads": env.choice("VARIANTS_FUSED_THREADS"),
            "modernbert_attention": env.choice(modernbert_window.ENV),
            "blas": os.path.basename(blas) if blas else None}
    return {"mlx_variants": variants.__version__, "mlx": mx.__version__, "path": path}

"""Run as a script by tests/runtime/test_isa_matrix.py: MiniLM with every encoder Linear a W8A8
Linear on the compiled integer GEMMs (native: the fused int8 layers), its pooled embeddings
(deterministic: no head) of TEXTS written to ``argv[1]`` (npz: ``emb`` float32 (N, 384),
``isa``, ``scheme``, ``kernel``), under whatever ``ONEDNN_MAX_CPU_ISA`` / ``VARIANTS_KERNEL_ISA``
the process was started with."""

import sys

import variants  # noqa: F401  (OpenBLAS before mlx)
import numpy as np

TEXTS = ["The soup was cold and the waiter never came back.", "Best pasta in years!",
         "Fine.", "I would not go back, although the dessert was lovely and the staff kind.",
         "Not bad at all, honestly.", "Terrible. Just terrible.",
         "The room was clean but the wifi kept dropping every ten minutes.", "ok"] * 3


def embeddings():
    """(emb (N, 384) float32, kernel name, oneDNN ISA, int8 scheme)."""
    import mlx.core as mx

    from variants.checkpoints.load import load_checkpoint
    from variants.families.w8a8 import build as w8a8
    from variants.families.w8a8.family import W8A8Config
    from variants.models import sentiment
    from variants.runtime import int8_linear

    model = sentiment.build(load_checkpoint())
    v, info = w8a8.build(model, W8A8Config(), mode="native")
    enc, _ = model.tokenizer.encode(TEXTS)
    ids, mask, types = (mx.array(a) for a in model.tokenizer.batch(enc)[:3])
    emb = np.array(v.module.embed(ids, mask, types))
    return emb, info["kernel"], int8_linear.cpu_isa(), int8_linear.scheme()


if __name__ == "__main__":
    emb, kernel, isa, scheme = embeddings()
    np.savez(sys.argv[1], emb=emb, kernel=kernel, isa=isa, scheme=scheme)

"""Quantized embedding tables that read back in float32 by the one round trip every path follows
(:func:`variants.layer_maps.formats.dequantize`).

``mlx.nn.QuantizedEmbedding`` calls ``mx.dequantize`` on the gathered rows, which computes in
the scales' dtype: on float16 / bfloat16 scales (mlx-lm's layout, issue 42) its rows are half
precision (~1e-3 away from the float32 round trip at 4 bits), and for the microscaling modes
(``mxfp4``, ``mxfp8``, ``nvfp4``: uint8 scales) MLX 0.32 returns bfloat16.
:class:`Fp32QuantizedEmbedding` has the same parameters and names; its rows are
``float32(scale) * q + float32(bias)`` (affine) or ``mx.dequantize(..., dtype=float32)``
(microscaling), float32 — bit-identical to ``nn.QuantizedEmbedding`` on float32 scales.
"""

import mlx.nn as nn

from variants.layer_maps import formats as F


class Fp32QuantizedEmbedding(nn.QuantizedEmbedding):
    """``nn.QuantizedEmbedding`` (same parameters) whose call gives float32 rows:
    ``ids`` (...) int -> (..., dims) float32 (module docstring)."""

    def __call__(self, x):
        biases = self.get("biases")
        fmt = F.Format(self.bits, self.group_size, getattr(self, "mode", "affine"))
        return F.dequantize(self["weight"][x], self["scales"][x],
                            None if biases is None else biases[x], fmt)


def use_fp32_rows(module):
    """Turn every ``nn.QuantizedEmbedding`` inside ``module`` into a
    :class:`Fp32QuantizedEmbedding` in place (the same arrays: nothing copied). Returns
    ``module``."""
    for _, m in module.named_modules():
        if type(m) is nn.QuantizedEmbedding:
            m.__class__ = Fp32QuantizedEmbedding
    return module

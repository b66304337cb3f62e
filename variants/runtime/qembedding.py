"""A quantized embedding table whose half-precision scales are read in float32.

``nn.QuantizedEmbedding`` gathers rows with ``mx.dequantize``, which on float16 / bfloat16
scales computes ``scale * q + bias`` in that half precision and returns it (1e-4 relative away
from the float32 product at fp16). The suite's definition of a stored tensor
(:mod:`variants.families.quant.formats`) is ``float32(scale) * q + float32(bias)`` in float32,
the weight the simulated build and the compiled kernels use; :class:`Fp32QuantizedEmbedding`
(same parameters and names, so the stored bytes and the exported arrays do not change) gathers
by that definition.
"""

import mlx.core as mx
import mlx.nn as nn


class Fp32QuantizedEmbedding(nn.QuantizedEmbedding):
    """``nn.QuantizedEmbedding`` whose rows are ``float32(scale) * q + float32(bias)``;
    ``x`` (...) int -> (..., dims) float32."""

    def __call__(self, x):
        if getattr(self, "mode", "affine") != "affine":
            return mx.dequantize(self["weight"][x], self["scales"][x], None,
                                 group_size=self.group_size, bits=self.bits, mode=self.mode,
                                 dtype=mx.float32)
        return mx.dequantize(self["weight"][x], self["scales"][x].astype(mx.float32),
                             self["biases"][x].astype(mx.float32),
                             group_size=self.group_size, bits=self.bits)

"""DWQ's trainable packed Linears: the weight ``scale · q + bias`` per group with fixed integer
codes (:class:`AffineLinear`), its scales and biases relative to a start
(:class:`RelativeAffineLinear`), and its codes trained too (:class:`LearnedCodeAffineLinear`).
At their start each equals ``mx.dequantize`` of the packed tensors it was made from."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np


class AffineLinear(nn.Module):
    """A Linear whose weight is ``scales * q + biases`` per group of ``group_size`` inputs, with
    fixed integer codes q (o, n) and ``scales``/``biases`` (o, n / group_size);
    ``input_scale`` (n,) (AWQ) multiplies the input first. ``x`` (..., n) -> (..., o)."""

    def __init__(self, codes, scales, biases, group_size, bias=None, input_scale=None):
        super().__init__()
        o, n = codes.shape
        self._codes = mx.array(np.asarray(codes, np.float32).reshape(o, n // group_size,
                                                                      group_size))
        self._shape = (o, n)
        self._input_scale = None if input_scale is None else mx.array(input_scale)
        self.scales = mx.array(np.asarray(scales, np.float32))
        self.biases = mx.array(np.asarray(biases, np.float32))
        if bias is not None:
            self.bias = bias

    def group_scales(self):
        return self.scales

    def group_biases(self):
        return self.biases

    def group_codes(self):
        """(o, n / g, g) float32: the integer codes (fixed here)."""
        return self._codes

    def weight(self):
        """(o, n) float32 dequantized weight (what ``mx.dequantize`` gives for these tensors)."""
        return (self.group_codes() * self.group_scales()[..., None]
                + self.group_biases()[..., None]).reshape(self._shape)

    def __call__(self, x):
        if self._input_scale is not None:
            x = x * self._input_scale
        y = x @ self.weight().T
        return y + self.bias if "bias" in self else y


class RelativeAffineLinear(AffineLinear):
    """:class:`AffineLinear` whose trainable parameters are relative to a start (s0, b0):
    scales = s0 · (1 + ``scale_unit`` · ``scale_delta``), biases = b0 + s0 · ``bias_delta``
    (both (o, n / g), zeros at the start: then exactly s0 and b0). ``scale_unit``
    (:func:`scale_unit`) makes one step of θ move a weight by the same share of its code step
    at every width."""

    def __init__(self, codes, scales, biases, group_size, bias=None, input_scale=None,
                 scale_unit=1.0):
        super().__init__(codes, scales, biases, group_size, bias, input_scale)
        self._s0, self._b0 = self.scales, self.biases
        self._unit = float(scale_unit)
        del self.scales, self.biases
        self.scale_delta = mx.zeros(self._s0.shape)
        self.bias_delta = mx.zeros(self._b0.shape)

    def group_scales(self):
        return self._s0 * (1 + self._unit * self.scale_delta)

    def group_biases(self):
        return self._b0 + self._s0 * self.bias_delta


class LearnedCodeAffineLinear(RelativeAffineLinear):
    """:class:`RelativeAffineLinear` whose integer codes train too (learned rounding): each
    weight's code is ``clip(round(codes + code_delta), 0, 2^bits − 1)`` with ``code_delta``
    (o, n / g, g) float32 in code steps, trained through the rounding by the straight-through
    estimator (Bengio et al. 2013; the rounding variable of AdaRound, Nagel et al. 2020, and of
    quantization-aware training, trained end to end here). ``code_delta`` starts at
    ``code_start`` (zeros: the start's codes exactly, as ``round(q + δ) = q`` for |δ| < ½);
    the trained parameter is δ / ``code_unit``, so Adam moves a code by about ``code_unit`` ×
    the learning rate per step."""

    def __init__(self, codes, scales, biases, group_size, bias=None, input_scale=None,
                 scale_unit=1.0, bits=4, code_start=None, code_unit=1.0):
        super().__init__(codes, scales, biases, group_size, bias, input_scale, scale_unit)
        self._qmax = float(2 ** int(bits) - 1)
        self._code_unit = float(code_unit)
        start = (np.zeros(self._codes.shape, np.float32) if code_start is None else
                 np.asarray(code_start, np.float32).reshape(self._codes.shape))
        self.code_delta = mx.array(start / self._code_unit)  # in code_unit code steps

    def group_codes(self):
        """(o, n / g, g) float32: the integer codes of the current ``code_delta`` in the forward,
        the continuous ``codes + code_delta`` in the backward."""
        u = self._codes + self._code_unit * self.code_delta
        return u + mx.stop_gradient(self._rounded(u) - u)

    def _rounded(self, u):
        return mx.clip(mx.round(u), 0.0, self._qmax)

    def codes(self):
        """(o, n) uint8: the integer codes the layer holds now."""
        q = self._rounded(self._codes + self._code_unit * self.code_delta)
        return np.array(q, np.float32).reshape(self._shape).astype(np.uint8)


def scale_unit(bits):
    """θ's unit for a ``bits``-wide layer: 15 / (2^bits − 1) (1 at 4 bits). A relative change θ
    of a group's scale moves its largest code's weight by θ · (2^bits − 1) code steps, so the
    same step is four times as large against the rounding noise at 6 bits as at 4 (MiniLM
    sentiment, 6 bits with 6-bit embeddings: at unit 1 the held-out KL rose 0.000238 ->
    0.000245 and only the hidden-state term fell)."""
    return 15.0 / (2 ** int(bits) - 1)

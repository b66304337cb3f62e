"""AWQ's input-scaled Linear: ``linear(x * input_scale)``.

AWQ (Lin et al. 2024) quantizes W·diag(s) and divides the layer's input by s. In a post-LN
BERT the LayerNorm that precedes a Linear is also the residual stream, so 1/s cannot be folded
into it: the layer carries ``input_scale`` = 1/s (n,) float32 and multiplies its input by it
(n multiplies per token). A weights folder stores it as ``<path>.input_scale`` beside the packed
``<path>.linear.weight`` / ``scales`` / ``biases``, and lists the paths in its ``mlx_variants``
block (:func:`input_scaled_paths`), so a loader puts the layers in place before
``load_weights`` (:func:`place_input_scales`), as it does factored layers.
"""

import mlx.core as mx
import mlx.nn as nn

from variants.arch.activations import set_module


class InputScaledLinear(nn.Module):
    """``linear(x * input_scale)``: ``input_scale`` (n,) float32 = 1/s, ``linear`` the Linear
    (packed ``nn.QuantizedLinear`` in a built variant) of W diag(s). ``x`` (..., n) -> (..., o)."""

    def __init__(self, linear, input_scale):
        super().__init__()
        self.linear = linear
        self.input_scale = mx.array(input_scale)

    def __call__(self, x):
        return self.linear(x * self.input_scale)


def input_scaled_paths(module):
    """Sorted module paths of ``module``'s :class:`InputScaledLinear` layers."""
    return sorted(p for p, m in module.named_modules() if isinstance(m, InputScaledLinear))


def check_paths(value):
    """``value`` (a folder's ``mlx_variants.input_scaled``; None = none) as a list of encoder
    Linear paths. Raises ValueError (naming what it is) unless it is a list of distinct
    ``encoder.`` paths: the learned quantizers scale encoder Linears only."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ValueError(f"input_scaled is {type(value).__name__}, not a list of layer paths")
    bad = [p for p in value if not p.startswith("encoder.")]
    if bad or len(set(value)) != len(value):
        raise ValueError(f"input_scaled names {bad[0]!r}, not an encoder Linear" if bad else
                         "input_scaled names a layer twice")
    return value


def place_input_scales(module, paths, prefix=""):
    """Wrap the Linear at each of ``paths`` in an :class:`InputScaledLinear` (scale 1, the
    file's ``input_scale`` loads over it), in place, ready for ``mlx.nn.quantize`` (its Linear
    is then at ``<path>.linear``) and ``load_weights``. ``prefix``: the part of the paths above
    ``module`` (``"encoder."`` when ``module`` is the encoder of the model the paths name);
    paths outside it are skipped.

    Raises
    ------
    KeyError
        If a path is not a Linear of ``module``.
    """
    modules = dict(module.named_modules())
    for path in paths:
        if not path.startswith(prefix):
            continue
        rel = path[len(prefix):]
        linear = modules.get(rel)
        if not isinstance(linear, nn.Linear):
            raise KeyError(f"{path} is not a Linear of the model")
        set_module(module, rel, InputScaledLinear(linear, mx.ones((linear.weight.shape[1],))))

"""A factored Linear layer (two ``nn.Linear``: ``down`` then ``up``) and how an exported folder
records and rebuilds where such layers sit (the low-rank family builds them,
:mod:`variants.families.lowrank.build`; an exported folder's loaders put them back in place).
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np


class LowRankLinear(nn.Module):
    """y = (x W_vᵀ) W_uᵀ + b as two nn.Linear layers ``down`` (k, n) and ``up`` (m, k).

    Parameters
    ----------
    w_u : array of shape (m, k)
    w_v : array of shape (k, n)
    bias : array of shape (m,), optional

    Raises
    ------
    ValueError
        If the factors' shapes do not chain (``w_u``'s columns != ``w_v``'s rows).
    """

    def __init__(self, w_u, w_v, bias=None):
        super().__init__()
        m, k = w_u.shape
        k2, n = w_v.shape
        if k != k2:
            raise ValueError(f"factor shapes {w_u.shape} and {w_v.shape} do not chain")
        self.down = nn.Linear(n, k, bias=False)
        self.up = nn.Linear(k, m, bias=bias is not None)
        self.down.weight = mx.array(np.asarray(w_v, np.float32))
        self.up.weight = mx.array(np.asarray(w_u, np.float32))
        if bias is not None:
            self.up.bias = mx.array(np.asarray(bias, np.float32))

    def __call__(self, x):
        return self.up(self.down(x))


def factor_shapes(module):
    """``{path: {"out", "rank", "in", "bias"}}`` of the :class:`LowRankLinear` layers of
    ``module`` (paths as ``module.named_modules()`` gives them; ``in`` unpacked when ``down`` is
    an ``nn.QuantizedLinear``: 32 // bits values per uint32), sorted by path."""
    out = {}
    for p, m in module.named_modules():
        if isinstance(m, LowRankLinear):
            k, n = m.down.weight.shape
            if isinstance(m.down, nn.QuantizedLinear):
                n = n * 32 // m.down.bits
            out[p] = {"out": int(m.up.weight.shape[0]), "rank": int(k), "in": int(n),
                      "bias": "bias" in m.up}
    return dict(sorted(out.items()))


def place_lowrank(module, factored, prefix=""):
    """Replace each Linear of ``module`` at a path of ``factored`` (:func:`factor_shapes`'s
    dict) with a zero :class:`LowRankLinear` of those shapes, in place, ready for
    ``load_weights``. ``prefix``: the part of the paths above ``module`` (``"encoder."`` when
    ``module`` is the encoder of the model the paths name); paths outside it are skipped.

    Raises
    ------
    KeyError
        If a path's parent module is not in ``module``.
    """
    modules = None
    for path, f in factored.items():
        if not path.startswith(prefix):
            continue
        modules = modules if modules is not None else dict(module.named_modules())
        parent_path, _, name = path[len(prefix):].rpartition(".")
        parent = modules[parent_path] if parent_path else module
        layer = LowRankLinear(np.zeros((f["out"], f["rank"]), np.float32),
                              np.zeros((f["rank"], f["in"]), np.float32),
                              np.zeros(f["out"], np.float32) if f["bias"] else None)
        if name.isdigit():
            parent[int(name)] = layer
        else:
            setattr(parent, name, layer)

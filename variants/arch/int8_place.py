"""A W8A8 variant's Int8Linears in a weights folder (:mod:`variants.families.artifact`): which
modules they are (:func:`int8_layers`, the ``mlx_variants.w8a8`` block of ``config.json``) and
their skeletons put back in place before the stored tensors fill them (:func:`place_int8`).

Each :class:`variants.runtime.int8_linear.Int8Linear` is stored under its Linear's transformers
name with its own parameter names (:mod:`variants.checkpoints.hf_names`): ``<name>.wq`` int8
(out, in) weight codes, ``<name>.w_scale`` float32 (out,) per-output-channel scales,
``<name>.colsum`` int32 (out,) their row sums, ``<name>.bias`` float32 (out,), and with
SmoothQuant ``<name>.inv_smooth`` float32 (in,) = 1 / s (Xiao et al. 2023). No transformers
layout has them: only this package's loaders read them. Nothing is re-quantized on load.
"""

from variants.arch.activations import set_module

#: the keys of one entry of the block
KEYS = ("in", "out", "bias", "smooth", "native")


def int8_layers(module):
    """``{path: {"in", "out", "bias", "smooth", "native"}}`` of ``module``'s Int8Linears
    (sorted by path): shapes (features), whether each has a bias and SmoothQuant factors,
    and whether its calls run the compiled integer GEMM where it is built (``native``)."""
    from variants.runtime.int8_linear import Int8Linear

    out = {}
    for p, m in sorted(module.named_modules()):
        if isinstance(m, Int8Linear):
            o, i = m["wq"].shape
            out[p] = {"in": int(i), "out": int(o), "bias": "bias" in m,
                      "smooth": "inv_smooth" in m, "native": bool(m._native)}
    return out


def check_layers(value):
    """``value`` (a folder's ``mlx_variants.w8a8``; None = none) as a ``{path: entry}`` dict.
    Raises ValueError (naming what it is) unless each path is an ``encoder.`` path and each
    entry has :data:`KEYS` with positive integer shapes."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"w8a8 is {type(value).__name__}, not a {{path: entry}} map")
    for p, e in value.items():
        if not (isinstance(p, str) and p.startswith("encoder.")):
            raise ValueError(f"w8a8 names {p!r}, not an encoder Linear")
        if not (isinstance(e, dict) and set(KEYS) <= set(e)
                and all(isinstance(e[k], int) and not isinstance(e[k], bool) and e[k] > 0
                        for k in ("in", "out"))):
            raise ValueError(f"w8a8 entry of {p} is not {{{', '.join(KEYS)}}} with positive "
                             "integer shapes")
    return value


def place_int8(module, layers, prefix=""):
    """Replace the module at each path of ``layers`` (:func:`int8_layers`'s map) with an empty
    Int8Linear of its shape (:func:`variants.runtime.int8_linear.empty_int8`), in place, ready
    for ``load_weights``. ``prefix``: the part of the paths above ``module`` (``"encoder."``
    when ``module`` is the encoder); paths outside it are skipped.

    Raises
    ------
    KeyError
        A path that is not a Linear of ``module`` with the entry's shape.
    """
    import mlx.nn as nn

    from variants.runtime.int8_linear import empty_int8

    modules = dict(module.named_modules())
    for path, e in layers.items():
        if not path.startswith(prefix):
            continue
        rel = path[len(prefix):]
        linear = modules.get(rel)
        if not isinstance(linear, nn.Linear) or tuple(linear.weight.shape) != (e["out"],
                                                                               e["in"]):
            raise KeyError(f"{path} is not a ({e['out']}, {e['in']}) Linear of the model")
        set_module(module, rel, empty_int8(e["out"], e["in"], bool(e["bias"]),
                                           bool(e["smooth"]), bool(e["native"])))

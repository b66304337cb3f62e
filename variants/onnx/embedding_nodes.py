"""ONNX nodes gathering embedding rows from every table kind the suite's variants hold, each
row exactly the float32 row the MLX module returns.

- ``nn.Embedding``: ``Gather`` on the float32 table.
- ``nn.QuantizedEmbedding`` / :class:`variants.runtime.qembedding.Fp32QuantizedEmbedding`
  (affine any width and scale dtype, or a microscaling mode): the stored codes, scales and
  biases as initializers; the ids' rows of each are gathered, then dequantized by
  :func:`variants.onnx.dequant_nodes.dequantize` (``float32(scale) * q + float32(bias)``, or the
  mode's tables), as ``Fp32QuantizedEmbedding`` computes them: per call, on the gathered rows
  only (the file keeps the packed table). A plain ``nn.QuantizedEmbedding`` with half-precision
  scales computes its rows in half precision in MLX (~1e-4 away); the graph gives the float32
  round trip, which the quant family's variants use (``use_fp32_rows``).
- :class:`variants.runtime.row_embedding.RowWidthEmbedding` (a word table stored by use): each
  id's ``row_table`` / ``row_index`` gathered, each format's table read at the ids it holds
  (the other ids read its row 0) and the rows chosen per id with ``Where``: what
  :meth:`RowWidthEmbedding.__call__` returns, bit for bit.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.layer_maps import formats as F
from variants.onnx import dequant_nodes


def _flat_rows(g, ids, hint):
    return g.op("Reshape", [ids, g.ints([-1])], f"{hint}/flat_ids")


def _unflatten(g, rows, ids, dims, hint):
    shape = g.op("Concat", [g.op("Shape", [ids], f"{hint}/ids_shape"), g.ints([dims])],
                 f"{hint}/out_shape", axis=0)
    return g.op("Reshape", [rows, shape], f"{hint}/rows")


def _table_rows(g, flat, codes, scales, biases, fmt, hint):
    """(n, dims) float32 rows ``flat`` (n,) of one stored table (initializers made here)."""
    packed = g.const(dequant_nodes.code_bytes(codes), f"{hint}.codes")
    s = g.const(dequant_nodes.stored(scales), f"{hint}.scales")
    take = (lambda t, h: g.op("Gather", [t, flat], f"{hint}/{h}_rows"))
    b = None if biases is None else take(g.const(dequant_nodes.stored(biases),
                                                 f"{hint}.biases"), "biases")
    return dequant_nodes.dequantize(g, take(packed, "codes"), take(s, "scales"), b, fmt, hint)


def _row_width(g, flat, m, hint):
    rt = g.op("Gather", [g.const(np.array(m.row_table).astype(np.int64), f"{hint}.row_table"),
                         flat], f"{hint}/table")
    ri = g.op("Gather", [g.const(np.array(m.row_index).astype(np.int64), f"{hint}.row_index"),
                         flat], f"{hint}/index")
    out = None
    for k, (t, fmt) in enumerate(zip(m.tables, m.formats)):
        th = f"{hint}.tables.{k}"
        here = g.op("Equal", [rt, g.scalar(k, np.int64)], f"{th}/here")
        idx = ri if len(m.tables) == 1 else g.op(
            "Where", [here, ri, g.scalar(0, np.int64)], f"{th}/index")
        rows = _table_rows(g, idx, t["weight"], t["scales"], t.get("biases"), fmt, th)
        if out is None:
            out = rows
        else:
            pick = g.op("Unsqueeze", [here, g.ints([-1])], f"{th}/pick")
            out = g.op("Where", [pick, rows, out], f"{th}/merged")
    return out


def embedding(g, ids, module, name):
    """Nodes gathering the rows of ``ids`` (an int64 tensor name, any shape) from ``module``;
    returns the (*ids.shape, dims) float32 tensor name.

    Raises
    ------
    ValueError
        A module that is not one of the table kinds of the module docstring (named with its
        path ``name``).
    """
    from variants.runtime.row_embedding import RowWidthEmbedding

    if type(module) is nn.Embedding:
        w = np.array(module.weight.astype(mx.float32))
        return g.op("Gather", [g.const(w, f"{name}.weight"), ids], f"{name}/rows")
    if isinstance(module, nn.QuantizedEmbedding):
        flat = _flat_rows(g, ids, name)
        rows = _table_rows(g, flat, module["weight"], module["scales"], module.get("biases"),
                           dequant_nodes.format_of(module), name)
        dims = module["weight"].shape[1] * 32 // module.bits
        return _unflatten(g, rows, ids, dims, name)
    if isinstance(module, RowWidthEmbedding):
        flat = _flat_rows(g, ids, name)
        return _unflatten(g, _row_width(g, flat, module, name), ids, module.dims, name)
    raise ValueError(f"{name}: a {type(module).__name__} has no ONNX form here (the table kinds "
                     "are nn.Embedding, nn.QuantizedEmbedding, RowWidthEmbedding)")


"""A word-embedding table whose rows are stored in different formats: one packed table per
format with an index (issue 42, item 3: frequent rows wider, rows never seen narrowest).

:class:`RowWidthEmbedding` holds, for each format ``k`` it uses (a
:class:`variants.layer_maps.formats.Format`), the rows stored in it as one quantized table
(``tables.<k>.weight`` packed uint32, ``tables.<k>.scales``, ``tables.<k>.biases`` for affine;
exactly what ``formats.quantize`` returns for those rows, in vocabulary order), plus
``row_table`` (uint8, (vocab,): the table of each row) and ``row_index`` (int32, (vocab,): the
row's position in its table). A row reads back as ``formats.dequantize`` of its stored arrays
(the canonical float32 round trip: ``float32(scale) * q + float32(bias)``, or MLX's
``mx.dequantize`` for the microscaling modes), so the module's output is the simulated form,
bit for bit. Plain MLX reads it the same way: ``t, r = row_table[ids], row_index[ids]``, gather
row ``r`` of table ``t`` and dequantize it (:data:`CARD`).

The ``mlx_variants.row_embedding`` block of an exported ``config.json``
(:func:`row_embedding_block`) records each such module's formats and row counts by module path,
so the loaders rebuild its skeleton (:func:`place_row_embeddings`) before ``load_weights``.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.layer_maps import formats as F

#: the config.json block key (inside ``mlx_variants``)
BLOCK_KEY = "row_embedding"
#: how a plain-MLX user reads one (the model card's lines)
CARD = ("A word-embedding table stored by use (`<name>.tables.<k>.weight` / `.scales` / "
        "`.biases`, one packed table per format, `<name>.row_table` uint8 and "
        "`<name>.row_index` int32 per token id; `config.json`'s `mlx_variants.row_embedding` "
        "gives each table's `bits`, `group_size`, `mode`, `scale_dtype`) reads in plain MLX as "
        "`t, r = row_table[ids], row_index[ids]`, then row `r` of table `t` through "
        "`mx.dequantize(weight[r], scales[r], biases[r], group_size, bits, mode=mode)`.",
        "Cast half-precision `scales` / `biases` to float32 before `mx.dequantize` (and pass "
        "`dtype=mx.float32` for the microscaling modes) to reproduce the judged numbers: MLX "
        "otherwise computes those rows in half precision (~1e-4 away).")


def _fmt_dict(fmt, rows):
    return {"bits": int(fmt.bits), "group_size": int(fmt.group_size), "mode": fmt.mode,
            "scale_dtype": fmt.scale_dtype, "rows": int(rows)}


class RowWidthEmbedding(nn.Module):
    """An embedding table of ``vocab`` rows of ``dims`` stored one packed table per format.

    Parameters
    ----------
    tables : list of (codes, scales, biases or None)
        Each format's stored arrays (``formats.quantize`` of its rows, in vocabulary order).
    formats : list of Format
        The format of each table (same length as ``tables``).
    row_table : array (vocab,) uint8
        The table each row is stored in.
    row_index : array (vocab,) int32
        The row's position in its table.

    Raises
    ------
    ValueError
        Lengths that do not agree, a row pointing outside its table.
    """

    def __init__(self, tables, formats, row_table, row_index):
        super().__init__()
        formats = [F.Format(*f) for f in formats]
        if not tables or len(tables) != len(formats) or len(formats) > 256:
            raise ValueError(f"{len(tables)} tables for {len(formats)} formats; pass one "
                             "(codes, scales, biases) per format, 1 to 256 of them")
        rt = np.asarray(row_table).astype(np.int64)
        ri = np.asarray(row_index).astype(np.int64)
        if rt.ndim != 1 or rt.shape != ri.shape:
            raise ValueError(f"row_table {rt.shape} and row_index {ri.shape} are not one "
                             "(vocab,) pair; pass one entry per token id")
        sizes = np.array([int(t[0].shape[0]) for t in tables])
        if rt.size and (rt.min() < 0 or rt.max() >= len(tables) or ri.min() < 0
                        or np.any(ri >= sizes[np.clip(rt, 0, len(tables) - 1)])):
            raise ValueError("row_table / row_index point outside the tables; build the "
                             "module with RowWidthEmbedding.from_embedding")
        self._formats = tuple(formats)  # "_": not a parameter
        dims = {int(q.shape[1]) * 32 // f.bits for (q, _, _), f in zip(tables, formats)}
        if len(dims) != 1:
            raise ValueError(f"the tables hold rows of {sorted(dims)} values; pass tables of "
                             "one embedding dimension")
        self.num_embeddings, self.dims = int(rt.size), dims.pop()
        self.tables = [{"weight": q, "scales": s, **({"biases": b} if b is not None else {})}
                       for q, s, b in tables]
        self.row_table = mx.array(rt.astype(np.uint8))
        self.row_index = mx.array(ri.astype(np.int32))
        self.freeze()

    @property
    def formats(self):
        """The :class:`Format` of each table, in table order (a tuple)."""
        return self._formats

    @classmethod
    def from_embedding(cls, emb, row_format, formats):
        """The module of ``emb`` (``nn.Embedding``, weight (vocab, dims) float32) with row ``i``
        stored in ``formats[row_format[i]]`` (``row_format``: (vocab,) ints); a format no row
        takes is left out.

        Raises
        ------
        ValueError
            ``row_format`` not (vocab,) or out of range; ``dims`` not divisible by a used
            format's group size.
        """
        w = emb.weight if isinstance(emb, nn.Module) else emb
        w = mx.array(w).astype(mx.float32)
        vocab, dims = w.shape
        rf = np.asarray(row_format)
        if rf.shape != (vocab,) or not np.issubdtype(rf.dtype, np.integer):
            raise ValueError(f"row_format has shape {rf.shape} ({rf.dtype}); pass one integer "
                             f"per row, shape ({vocab},)")
        if rf.size and (rf.min() < 0 or rf.max() >= len(formats)):
            raise ValueError(f"row_format holds {int(rf.min())}..{int(rf.max())}, outside the "
                             f"{len(formats)} formats; pass indices into formats")
        tables, kept = [], []
        row_table = np.zeros(vocab, np.int64)
        row_index = np.zeros(vocab, np.int64)
        for k, fmt in enumerate(formats):
            rows = np.nonzero(rf == k)[0]
            if rows.size == 0:
                continue
            fmt = F.Format(*fmt)
            if dims % fmt.group_size:
                raise ValueError(f"the embedding's {dims} values per row are not divisible by "
                                 f"group size {fmt.group_size} ({fmt.mode}); choose another "
                                 "group size")
            row_table[rows] = len(kept)
            row_index[rows] = np.arange(rows.size)
            tables.append(F.quantize(w[mx.array(rows.astype(np.int32))], fmt))
            kept.append(fmt)
        return cls(tables, kept, row_table, row_index)

    @classmethod
    def skeleton(cls, spec):
        """A zero-filled module of the shapes and dtypes ``spec`` (:meth:`spec`) gives, ready
        for ``load_weights``.

        Raises
        ------
        ValueError
            A spec that is not what :meth:`spec` writes.
        """
        try:
            vocab, dims = int(spec["vocab"]), int(spec["dims"])
            fmts = [F.Format(int(t["bits"]), int(t["group_size"]), str(t["mode"]),
                             str(t.get("scale_dtype", "float32"))) for t in spec["tables"]]
            rows = [int(t["rows"]) for t in spec["tables"]]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError("a row_embedding entry is not {vocab, dims, tables: [{bits, "
                             "group_size, mode, scale_dtype, rows}]}") from None
        tables = []
        for fmt, n in zip(fmts, rows):
            F.check_mode(fmt.mode, "row_embedding mode")
            F.check_scale_dtype(fmt.scale_dtype, "row_embedding scale_dtype")
            q, s, b = F.quantize(mx.zeros((1, dims), mx.float32), fmt)
            tables.append(tuple(None if a is None else mx.zeros((n, a.shape[1]), a.dtype)
                                for a in (q, s, b)))
        if not tables:
            raise ValueError("a row_embedding entry lists no tables")
        ri = np.zeros(vocab, np.int64)
        return cls(tables, fmts, np.zeros(vocab, np.int64), ri)

    def spec(self):
        """``{"vocab", "dims", "tables": [{bits, group_size, mode, scale_dtype, rows}]}``: what
        the config block records to rebuild the skeleton (:meth:`skeleton`)."""
        return {"vocab": self.num_embeddings, "dims": self.dims,
                "tables": [_fmt_dict(f, t["weight"].shape[0])
                           for f, t in zip(self.formats, self.tables)]}

    def _rows(self, k, idx):
        t = self.tables[k]
        b = t.get("biases")
        return F.dequantize(t["weight"][idx], t["scales"][idx],
                            None if b is None else b[idx], self.formats[k])

    def __call__(self, ids):
        """``ids`` (...) int -> (..., dims) float32: each id's row as ``formats.dequantize``
        of its stored arrays."""
        ids = ids if isinstance(ids, mx.array) else mx.array(ids)
        t, r = self.row_table[ids], self.row_index[ids]
        if len(self.tables) == 1:
            return self._rows(0, r)
        # each table dequantizes only its own positions (the ids' tables are read on the host):
        # dequantizing every position in every table and selecting took 47-70 ms at B=32
        # L=128 for 4 tables of MiniLM's, this 9-17 ms (one table: 5-8 ms; a loaded 2 cores)
        flat = np.asarray(t.reshape(-1)).astype(np.int64)
        if flat.size == 0:
            return mx.zeros((*ids.shape, self.dims), mx.float32)
        r = r.reshape(-1)
        order = np.argsort(flat, kind="stable")
        counts = np.bincount(flat, minlength=len(self.tables))
        parts, start = [], 0
        for k, n in enumerate(counts):
            if n:
                pos = mx.array(order[start:start + n].astype(np.int32))
                parts.append(self._rows(k, r[pos]))
                start += n
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        out = mx.concatenate(parts) if len(parts) > 1 else parts[0]
        return out[mx.array(inverse.astype(np.int32))].reshape(*ids.shape, self.dims)

    def dequantized(self):
        """The (vocab, dims) float32 table (the simulated ``nn.Embedding`` weight), each row
        bit-identical to what :meth:`__call__` returns for its id."""
        full = [self._rows(k, mx.arange(t["weight"].shape[0]))
                for k, t in enumerate(self.tables)]
        sizes = np.array([t["weight"].shape[0] for t in self.tables])
        offsets = mx.array(np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32))
        return mx.concatenate(full)[offsets[self.row_table.astype(mx.int32)] + self.row_index]

    @property
    def nbytes(self):
        """Stored bytes: every array's (codes, scales, biases, ``row_table``, ``row_index``)."""
        from mlx.utils import tree_flatten

        return int(sum(a.nbytes for _, a in tree_flatten(self.parameters())))

    def row_formats(self):
        """Per table: ``{bits, group_size, mode, scale_dtype, rows, bytes, bits_per_weight}``
        (for build.json), then the index arrays' bytes under ``index``."""
        out = []
        for f, t in zip(self.formats, self.tables):
            d = _fmt_dict(f, t["weight"].shape[0])
            d["bytes"] = int(sum(a.nbytes for a in t.values()))
            d["bits_per_weight"] = F.bits_per_weight(f)
            out.append(d)
        return {"tables": out, "index_bytes": int(self.row_table.nbytes + self.row_index.nbytes)}

    def _extra_repr(self):
        names = ", ".join(f"{f.token}{'' if f.mode != 'affine' else f'/g{f.group_size}'}"
                          f"x{t['weight'].shape[0]}" for f, t in zip(self.formats, self.tables))
        return f"{self.num_embeddings}, {self.dims}, tables=[{names}]"


def row_embedding_block(module):
    """``{path: spec}`` of the :class:`RowWidthEmbedding` layers of ``module`` (paths as
    ``named_modules`` gives them, sorted), or None when there are none."""
    out = {p: m.spec() for p, m in module.named_modules() if isinstance(m, RowWidthEmbedding)}
    return dict(sorted(out.items())) or None


def place_row_embeddings(module, block, prefix=""):
    """Replace the module at each path of ``block`` (:func:`row_embedding_block`'s dict; None:
    nothing) with a zero :class:`RowWidthEmbedding` skeleton, in place, ready for
    ``load_weights``. ``prefix``: the part of the paths above ``module`` (``"encoder."``);
    paths outside it are skipped.

    Raises
    ------
    ValueError
        A block that is not a {path: spec} dict, a path whose parent is not in ``module``.
    """
    if block is None:
        return module
    if not isinstance(block, dict):
        raise ValueError("mlx_variants.row_embedding is not a {path: spec} map")
    modules = None
    for path, spec in block.items():
        if not path.startswith(prefix):
            continue
        modules = modules if modules is not None else dict(module.named_modules())
        parent_path, _, name = path[len(prefix):].rpartition(".")
        parent = modules.get(parent_path) if parent_path else module
        if parent is None or not isinstance(parent, nn.Module):
            raise ValueError(f"row_embedding path {path} is not in the model")
        layer = RowWidthEmbedding.skeleton(spec)
        if name.isdigit():
            parent[int(name)] = layer
        else:
            setattr(parent, name, layer)
    return module

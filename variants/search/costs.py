"""What a candidate (a per-layer bits map) costs: stored bytes, bits per weight, FLOPs, and a
latency cost model.

- ``bytes``: the model's bytes as the native quant form stores them (packed weights, scales and
  biases of each quantized layer, every other parameter as it is), the ``model_bytes`` of
  ``build.json`` (:func:`variants.families.quant.build.quantize_module`). Each layer's stored
  bytes per width are measured once with ``mx.quantize`` on its weight, so a map's total is a
  sum (``tests/search/test_search.py`` checks it equals ``quantize_module``'s for a mixed map).
- ``bits``: stored bits per quantized weight, ``8 * quantized bytes / quantized weights``
  (scales and biases included; build.json's ``bits_per_weight``: 9.0 at 8 bits, 5.0 at 4, g64).
- ``flops``: quantization does not change the arithmetic (the CPU path dequantizes, then runs
  the fp32 GEMM): ``2 * in * out`` per token per Linear, summed; the same for every candidate,
  so ``--cost flops`` ranks candidates by bytes (the tie-break of every cost).
- ``latency-b1`` / ``latency-b32``: a cost model, not a measurement of the candidate: the time
  of each distinct (in, out, bits) quantized Linear (:class:`variants.runtime.qlinear.CpuQuantizedLinear`,
  the speed mode's kernel) on ``B * 128`` token rows, median of a few calls, measured once on
  the driver and cached in ``cache_dir/search/latency-<device>-B<B>.json``; a candidate's cost is
  the sum over its layers, in ms (attention, norms and the rest are the same for every
  candidate and left out). The finalist's real speed is the sweep's alternated timing.

A unit may also be ``"int8"`` (``variants search --w8a8``): the Linear as W8A8
(:class:`variants.runtime.int8_linear.Int8Linear`), stored as int8 weights, an fp32 scale and an
int32 column sum per output channel (8 + 64 / in bits per weight); its latency is the compiled
``int8_linear`` op's (oneDNN's integer GEMM, per-token quantization of the input included),
timed like the quantized kernels, or the simulated path's when oneDNN is missing.

Embedding tables (units of the search, :mod:`variants.search.units`) count in ``bytes`` and
``bits`` like any layer; a lookup does no multiply, so they add nothing to ``flops`` and the
latency model (a gather of B x L rows, the same order of cost at every width).
"""

import json
import statistics

import numpy as np
import time
from pathlib import Path

COSTS = ("bytes", "bits", "flops", "latency-b1", "latency-b32")
UNITS = {"bytes": "bytes", "bits": "bits/weight", "flops": "FLOPs/token",
         "latency-b1": "ms (model)", "latency-b32": "ms (model)"}
TOKENS = 128  # rows per example in the latency cost model
INT8 = "int8"  # a Linear's option beside the widths: W8A8 on integer GEMMs


class CostTable:
    """Per-layer stored sizes of one model; :meth:`of` prices a map.

    Parameters
    ----------
    module : mlx.nn.Module
        The reference's module (not modified).
    layers : list of str
        The candidate layers (every Linear the quant builder quantizes).
    bits : sequence of int or str
        The candidate options: widths, ``"int8"``, microscaling mode names.
    group_size : int
    scale_dtype : str
        The affine options' scale and bias precision (:mod:`variants.layer_maps.formats`).
    used : np.ndarray (vocab,) bool, optional
        The word-table rows the fit texts use: a ``<table>@unseen`` unit is the others, its
        table the used ones.
    unseen_extra : sequence of int
        Widths priced for ``@unseen`` units only (:mod:`variants.search.row_lowering`).

    ``error[(path, option)]``: relative squared weight error of each Linear's round trip
    (:func:`variants.search.dims.mode_rank` ranks the modes by it).
    """

    def __init__(self, module, layers, bits, group_size, scale_dtype="float32", used=None,
                 unseen_extra=()):
        import mlx.core as mx
        import mlx.nn as nn
        from mlx.utils import tree_flatten

        from variants.layer_maps import formats
        from variants.layer_maps.bits_map import UNSEEN

        mods = dict(module.named_modules())
        self.layers, self.group_size = list(layers), group_size
        self.scale_dtype = scale_dtype
        self.lookup = {p for p in self.layers if isinstance(mods[p.split("@")[0]], nn.Embedding)}
        self.unseen = {p: p.split("@")[0] for p in self.layers if UNSEEN in p}
        n_unseen = 0 if used is None else int((~np.asarray(used, bool)).sum())
        self.shape = {}
        for p in self.layers:  # (out, in); a table stored by use: its seen / unseen rows
            o, i = mods[p.split("@")[0]].weight.shape
            if p in self.unseen:
                o = n_unseen
            elif p in self.unseen.values():
                o -= n_unseen
            self.shape[p] = (int(o), int(i))
        self.vocab = {t: int(mods[t].weight.shape[0]) for t in self.unseen.values()}
        self.total_bytes = sum(v.nbytes for _, v in tree_flatten(module.parameters()))
        self.dense_bytes = {p: self.shape[p][0] * self.shape[p][1] * 4 for p in self.layers}
        self.q_bytes, self.error = {}, {}
        for p in self.layers:
            w = mods[p].weight if p in mods else None
            extra = [b for b in unseen_extra if b not in bits] if p in self.unseen else []
            for b in list(bits) + extra:
                if b == INT8:
                    if p not in self.lookup:  # int8 weights + fp32 scale + int32 column sum
                        self.q_bytes[p, b] = w.shape[0] * (w.shape[1] + 8)
                    continue
                fmt = formats.of(b, group_size, scale_dtype)
                if self.shape[p][1] % fmt.group_size:
                    continue
                self.q_bytes[p, b] = formats.stored_bytes(self.shape[p], fmt)
                if p not in self.lookup:  # relative squared error of the round trip
                    d = formats.round_trip(w, fmt) - w
                    self.error[p, b] = float(mx.sum(d * d) / mx.sum(w * w))
        self.latency = {}

    def model_bytes(self, layer_bits):
        """Bytes stored by the native form with ``layer_bits`` ({path: bits}); a table whose
        ``@unseen`` rows take another option than its own adds its row index (a uint8 table
        number and an int32 row per token: 5 bytes a row,
        :class:`variants.runtime.row_embedding.RowWidthEmbedding`)."""
        index = sum(5 * self.vocab[t] for u, t in self.unseen.items()
                    if u in layer_bits and layer_bits[u] != layer_bits.get(t))
        return int(self.total_bytes + index + sum(self.q_bytes[p, b] - self.dense_bytes[p]
                                                  for p, b in layer_bits.items()))

    def bits_per_weight(self, layer_bits):
        q = sum(self.q_bytes[p, b] for p, b in layer_bits.items())
        n = sum(self.shape[p][0] * self.shape[p][1] for p in layer_bits)
        return 8.0 * q / n

    def flops(self, layer_bits):
        return float(sum(2 * o * i for o, i in (self.shape[p] for p in layer_bits
                                                 if p not in self.lookup)))

    def of(self, cost, layer_bits):
        """The ``cost`` (one of :data:`COSTS`) of ``layer_bits``; latency needs
        :meth:`load_latency` first."""
        if cost == "bytes":
            return float(self.model_bytes(layer_bits))
        if cost == "bits":
            return self.bits_per_weight(layer_bits)
        if cost == "flops":
            return self.flops(layer_bits)
        table = self.latency[cost]
        return float(sum(table[f"{self.shape[p][1]}x{self.shape[p][0]}x{b}"]
                         for p, b in layer_bits.items() if p not in self.lookup))

    def load_latency(self, cost, bits, cache_dir, device="cpu", repeats=5):
        """Measure (or read) the per-(in, out, bits) times of ``cost`` ('latency-b1' or
        'latency-b32'); returns the cache file's path, whose name holds the versions and the
        compute path measured on (:func:`variants.arch.compute_path.key_part`): the kernel's times
        change with them."""
        from runs.io import digest
        from variants.arch import compute_path

        batch = int(cost.split("-b")[1])
        key = compute_path.key_part()
        if INT8 in bits:  # the int8 op's times: oneDNN's (prepacked or not), or simulated
            from variants.runtime.int8_linear import NAMES, _kernel, cpu_isa, scheme

            k = _kernel()
            name = ("simulated" if k is None else "prepacked"
                    if getattr(k, "has_prepack", lambda: False)() else "native")
            # oneDNN's ISA and the scheme (two GEMMs without VNNI; AMX 4x VNNI at 2048 rows)
            key = [key, NAMES[name], scheme(), cpu_isa()]
        path = Path(cache_dir) / "search" / (f"latency-{device}-B{batch}-g{self.group_size}-"
                                             f"{digest(key)}.json")
        table = json.loads(path.read_text()) if path.exists() else {}
        need = {f"{self.shape[p][1]}x{self.shape[p][0]}x{b}"
                for p in self.layers if p not in self.lookup for b in bits
                if (p, b) in self.q_bytes} - set(table)
        if need:
            for key in sorted(need):
                i, o, b = key.split("x")
                fn = int8_kernel_ms if b == INT8 else kernel_ms
                table[key] = fn(int(i), int(o), b if b == INT8 else int(b), self.group_size,
                                batch * TOKENS, repeats)
            from runs.io import write_json

            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, table)
        self.latency[cost] = table
        return path


def _median_ms(layer, x, repeats):
    import mlx.core as mx

    mx.eval(layer(x))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(layer(x))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def int8_kernel_ms(in_dims, out_dims, bits, group_size, rows, repeats=5):
    """Median ms of one :class:`variants.runtime.int8_linear.Int8Linear` call (native: the compiled
    oneDNN op where it is available, else the simulated path) on ``rows`` x ``in_dims`` fp32
    inputs, after one warm-up call; ``bits`` and ``group_size`` are unused (kernel_ms's
    signature)."""
    import mlx.core as mx
    import mlx.nn as nn

    from variants.runtime.int8_linear import Int8Linear

    mx.random.seed(0)
    layer = Int8Linear(nn.Linear(in_dims, out_dims), native=True)
    return _median_ms(layer, mx.random.normal((rows, in_dims)), repeats)


def kernel_ms(in_dims, out_dims, bits, group_size, rows, repeats=5):
    """Median ms of one :class:`variants.runtime.qlinear.CpuQuantizedLinear` call (random weights) on
    ``rows`` x ``in_dims`` fp32 inputs, after one warm-up call."""
    import mlx.core as mx
    import mlx.nn as nn

    from variants.runtime import qlinear

    mx.random.seed(0)
    lin = nn.Linear(in_dims, out_dims)
    q = nn.QuantizedLinear.from_linear(lin, group_size=group_size, bits=bits)
    q.__class__ = qlinear.CpuQuantizedLinear
    layer = q
    x = mx.random.normal((rows, in_dims))
    mx.eval(layer(x))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(layer(x))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)

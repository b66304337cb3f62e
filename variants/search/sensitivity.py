"""Per-layer quantization sensitivity: each Linear quantized alone, its effect on the outputs.

For every quantizable ``nn.Linear`` of the reference's encoder (``encoder.layers.*``, the
decision head excluded) and every candidate bit width, that one layer's weight is replaced by
its group-wise affine round trip (``mx.quantize`` then ``mx.dequantize``: the ``simulated``
quant mode, equal to the native layer to float round-off) while every other layer stays fp32,
and the split's raw option logits are compared with the reference's:

- ``max_abs_dlogit``: max over examples and valid options of |variant - reference| logit;
- ``kl_mean``: mean KL(reference ‖ variant) of the softmax of the raw logits (T = 1),
  :func:`metrics.divergence.kl_divergence_from_logits`, nats;
- ``flip_rate``: share of examples whose top-1 option changes (:func:`metrics.flips.flip`).

This is the measured ("leave-one-in") sensitivity that mlx-lm's ``dynamic_quant`` estimates
from gradients, and that Intel Neural Compressor / NNCF measure before falling layers back to
high precision. Rows are cached one unit at a time, shared by ``variants sensitivity`` and
``variants search``, and the missing units run on an executor: :mod:`variants.search.sens_cache`.

Measured (``variants sensitivity``, minilm-sentiment, 200 calibration examples, 36 Linears x
(2, 3, 4, 6, 8) bits, g64): 7 min 10 s wall for the 180 passes on the shared 2-core machine
(load ~3.4; 427 s CPU), plus 45 s fitting the head once. Median / max mean KL per layer: 8.2e-3
/ 4.9e-2 at 2 bits, 4.9e-4 / 3.8e-3 at 4, 2e-6 / 4.2e-5 at 8. The FFN up projections
(``intermediate``) lead at 2-3 bits and ``4.intermediate`` at 4 bits, ahead of the value and
down projections that mlx-lm's recipes raise (:mod:`variants.layer_maps.bits_map`).

A Linear of layer ``i`` of a plain BERT or ModernBERT encoder runs only layers ``i``.. and the
readout from the reference's recorded input of layer ``i`` (:mod:`variants.search.suffix`), to
float round-off the whole model's numbers: on 60 calibration examples the 180 passes took 67 /
75 s wall (44 / 45 s CPU) instead of 97 / 88 s (72 / 70 s CPU), alternated, loaded 2-core
machine. ModernBERT-base width (hidden 768), 100 rows, one Linear at one width: 0.03 + 0.75 ·
(L - i) CPU-s from layer ``i`` of L instead of 0.04 + 0.75 · L (2 and 4 layers, alternated).
"""

import copy
import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pandas as pd

from metrics.divergence import kl_divergence_from_logits
from metrics.flips import flip, top1
from variants.search import suffix as _suffix

COLUMNS = ["layer", "bits", "group_size", "max_abs_dlogit", "kl_mean", "flip_rate", "n"]
DEFAULT_BITS = (2, 3, 4, 6, 8)


def quantizable_layers(module, layers=None, prefix="encoder.layers."):
    """Sorted paths (layer by layer, in forward order) of the plain ``nn.Linear`` modules under
    ``prefix``; ``layers`` (a regex, searched) keeps only the matching ones. Raises ValueError
    naming ``--layers`` when none is left."""
    from variants.arch.activations import target_linears

    paths = target_linears(module, prefix=prefix)
    if layers:
        try:
            rx = re.compile(layers)
        except re.error as e:
            raise ValueError(f"--layers {layers!r} is not a valid regular expression ({e}); "
                             "e.g. --layers 'layers\\.0\\.'") from None
        paths = [p for p in paths if rx.search(p)]
    if not paths:
        raise ValueError(f"--layers {layers!r} matches no Linear under {prefix}*; paths look "
                         f"like {prefix}0.attention.value")
    return paths


def _compare(ref, out, mask):
    """(max |Δlogit|, mean KL, flip rate) of ``out`` against ``ref`` (N, K) over ``mask``. A row
    the round trip answers with NaN or inf (an overflow) is an unbounded drift, an infinite KL
    and a flip: the unit is as sensitive as a unit can be."""
    out = out.astype(np.float64)
    bad = (~np.isfinite(out) & mask).any(axis=1)
    if bad.all():
        return float("inf"), float("inf"), 1.0
    ok = ~bad
    d = np.abs(out[ok] - ref[ok])[mask[ok]]
    kl = np.full(len(out), np.inf)
    kl[ok] = kl_divergence_from_logits(ref[ok], out[ok], mask[ok])
    flips = np.ones(len(out))
    flips[ok] = flip(top1(ref[ok], mask[ok]), top1(out[ok], mask[ok]))
    return (float("inf") if bad.any() else float(d.max()), float(kl.mean()),
            float(flips.mean()))


def measure(reference, taskset, *, bits=DEFAULT_BITS, group_size=64, layers=None, batch_size=32,
            progress=None, paths=None, suffix_forward=True, round_trip=None):
    """The sensitivity table (module docstring) of ``reference`` on ``taskset``.

    Parameters
    ----------
    reference : variants.models.decision.DecisionModel
        Not modified (a copy of its module is edited).
    taskset : variants.datasets.tasks.TaskSet
        The split compared on (N examples).
    bits : sequence of int
        Candidate widths, each in (2, 3, 4, 6, 8).
    group_size : int
        Weights per group (32, 64 or 128); a layer whose input size it does not divide is left
        out.
    layers : str, optional
        Regex keeping only the matching layer paths (:func:`quantizable_layers`).
    progress : callable(int), optional
        Called with 1 after each (layer, bits) pair.
    paths : list of str, optional
        The units to measure instead of :func:`quantizable_layers` (the search's: embedding
        tables as well as Linears; an embedding's round trip is over its rows, as
        ``nn.QuantizedEmbedding`` stores them).
    suffix_forward : bool
        For a Linear of layer ``i`` of a plain BERT or ModernBERT encoder, run only layers
        ``i``.. from the reference's recorded layer inputs (:mod:`variants.search.suffix`;
        equal to the full forward to float round-off); False runs the whole model for every
        unit.
    round_trip : callable(path, bits, group_size) -> (o, n) array, optional
        The unit's quantized-then-dequantized weight by another quantizer (a learned one:
        :func:`variants.families.quant.learned.round_trip`); None: round-to-nearest.

    Returns
    -------
    pandas.DataFrame
        :data:`COLUMNS`, one row per (layer, bits), layers in forward order; ``n`` = N.

    Raises
    ------
    ValueError
        Bad widths or group size, an empty split, no layer left.
    """
    from variants.families.quant.family import check_bits

    for b in bits:
        check_bits(int(b), group_size, prefix="--")
    if taskset is None or len(taskset) == 0:
        raise ValueError("no examples to measure sensitivity on; pass --n-examples >= 10")
    state = prepare(reference, taskset, batch_size, suffix_forward=suffix_forward)
    rows = []
    for path in paths or quantizable_layers(state["work"].module, layers):
        for row in measure_unit(state, {"path": path, "bits": list(bits),
                                        "group_size": group_size}, round_trip):
            rows.append(row)
            if progress is not None:
                progress(1)
    if not rows:
        raise ValueError(f"no layer's input size is divisible by --group-size {group_size}; "
                         "choose 32")
    return pd.DataFrame(rows, columns=COLUMNS)


def prepare(reference, taskset, batch_size=32, suffix_forward=True):
    """What every unit's measurement shares: a copy of the reference's module, the split's
    prepared batches, the reference's raw logits (float64, N x K) and option mask, and (plain
    BERT or ModernBERT encoder, ``suffix_forward``) the recorded layer inputs
    (:mod:`variants.search.suffix`).
    ``reference`` is not modified. Returns a dict, the ``state`` of :func:`measure_unit`."""
    work = reference.replace_module(copy.deepcopy(reference.module))
    batches, _ = work.prepare(taskset, batch_size)
    ref = work.raw_logits(taskset, batches).astype(np.float64)
    suffix = None
    if suffix_forward and _suffix.applies(work.module):
        suffix = _suffix.SuffixCache(work.module)
        work._reset_caches()
        with suffix.record():
            work.raw_logits(taskset, batches)
        work._reset_caches()
    return {"work": work, "taskset": taskset, "batches": batches, "ref": ref,
            "mask": np.asarray(taskset.option_mask, bool), "suffix": suffix,
            "mods": dict(work.module.named_modules())}


def measure_unit(state, spec, round_trip=None):
    """The rows (tuples in :data:`COLUMNS` order) of one unit: ``spec["path"]`` (a Linear or
    an embedding table) round-tripped alone at each of ``spec["bits"]`` with
    ``spec["group_size"]``, the others as they are. [] when the group size does not divide
    the unit's input size. The unit's weight is restored before returning, so units measured
    in any order on one ``state`` (:func:`prepare`) give the same rows."""
    work, taskset, batches, suffix = (state[k] for k in ("work", "taskset", "batches", "suffix"))
    path, group_size = spec["path"], int(spec["group_size"])
    m = state["mods"][path]
    w = m.weight
    if type(m) not in (nn.Linear, nn.Embedding) or w.shape[1] % group_size:
        return []
    rows = []
    try:
        for b in spec["bits"]:
            if round_trip is not None:  # another quantizer's weight (measure's round_trip)
                m.weight = mx.array(round_trip(path, int(b), group_size)).astype(w.dtype)
            else:
                q, s, z = mx.quantize(w, group_size=group_size, bits=int(b))
                m.weight = mx.dequantize(q, s, z, group_size=group_size,
                                         bits=int(b)).astype(w.dtype)
            work._reset_caches()  # e.g. the choice model's cached option embeddings
            at = None if suffix is None else _suffix.layer_of(path)
            if at is None:
                out = work.raw_logits(taskset, batches)
            else:
                with suffix.start_at(at):
                    out = work.raw_logits(taskset, batches)
            rows.append((path, int(b), group_size, *_compare(state["ref"], out, state["mask"]),
                         len(taskset)))
    finally:
        m.weight = w
        work._reset_caches()
    return rows


def short_name(path):
    """``encoder.layers.3.attention.value`` -> ``3.attention.value`` (plot labels)."""
    return path.replace("encoder.layers.", "")


def plot(frame, path, metric="kl_mean", title=None):
    """Heat map (layer x bits) of ``metric`` (log colour scale), seaborn, written to ``path``
    (.png). Returns ``path``."""
    import seaborn as sns
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    order = list(dict.fromkeys(frame["layer"]))
    table = frame.pivot(index="layer", columns="bits", values=metric).loc[order]
    table.index = [short_name(p) for p in table.index]
    positive = table.to_numpy()[table.to_numpy() > 0]
    norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size else None
    fig = Figure(figsize=(1.2 * len(table.columns) + 3, 0.28 * len(table) + 1.5),
                 layout="constrained")
    ax = fig.add_subplot()
    sns.heatmap(table.clip(lower=positive.min() if positive.size else 0), ax=ax, norm=norm,
                cmap="rocket_r", cbar_kws={"label": metric})
    ax.set_xlabel("bits (this layer alone; the others fp32)")
    ax.set_ylabel("layer")
    ax.set_title(title or f"per-layer sensitivity: {metric}", fontsize=10)
    fig.savefig(path, dpi=110)
    return path

"""Sensitivity of the search's options beyond the affine widths: the microscaling modes
(``mxfp4``, ``mxfp8``, ``nvfp4``) on every unit the walk moves.

Measured as :mod:`variants.search.sensitivity` measures a width (the unit alone round-tripped,
the rest fp32; mean KL of the reference's softmax to the variant's on the sensitivity rows),
through :func:`variants.search.sensitivity.measure_unit` with the format's round trip
(:func:`variants.layer_maps.formats.round_trip`). Cached as JSON under ``cache_dir/search/`` by
the reference's weights, the rows, the units, the options and the group size. (A word table's
``@unseen`` rows are not walked, so not measured: :mod:`variants.search.row_lowering`.)
"""

import json
from pathlib import Path

import numpy as np

from variants.layer_maps import formats
from variants.layer_maps.bits_map import UNSEEN

VERSION = 1


def needed(units, options):
    """The (unit, option) pairs the width table does not cover: a mode on any walked unit
    (not a table's ``@unseen`` rows)."""
    return [(u, o) for u in units for o in options
            if UNSEEN not in u and isinstance(o, str) and o in formats.MX_SHAPE]


def measure(reference, taskset, pairs, group_size, cache_dir=None, log=None):
    """``{(unit, option): kl_mean}`` of ``pairs`` (:func:`needed`) on ``taskset``."""
    from variants.arch import activations
    from variants.search import sensitivity

    if not pairs:
        return {}
    path = None
    if cache_dir is not None:
        key = reference.cache_key(activations.module_fingerprint(reference.module),
                                  taskset.fingerprint(), [list(map(str, p)) for p in pairs],
                                  group_size, "format-sensitivity", VERSION)
        path = Path(cache_dir) / "search" / f"format-sensitivity-{key}.json"
        if path.exists():
            try:
                rows = json.loads(path.read_text())
                return {(u, _token(o)): float(v) for u, o, v in rows}
            except (OSError, ValueError):
                pass
    state = sensitivity.prepare(reference, taskset)
    out = {}
    from tqdm import tqdm

    for unit, opt in tqdm(pairs, desc="format sensitivity", unit="pair", leave=False,
                          disable=None):
        m = state["mods"][unit]
        fmt = formats.of(opt, group_size)
        if m.weight.shape[1] % fmt.group_size:
            continue

        def trip(*_, w=m.weight, fmt=fmt):
            return np.asarray(formats.round_trip(w, fmt))
        rows = sensitivity.measure_unit(state, {"path": unit, "bits": [fmt.bits],
                                                "group_size": fmt.group_size}, round_trip=trip)
        if rows:
            out[unit, opt] = float(rows[0][4])
    if path is not None:
        from runs.io import write_json

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, [[u, o, v] for (u, o), v in out.items()])
    if log:
        log(f"format sensitivity: {len(out)} (unit, option) pairs measured")
    return out


def _token(o):
    return o if isinstance(o, str) and not o.isdigit() else int(o)

"""Sensitivity of the search's options beyond the affine widths: the microscaling modes
(``mxfp4``, ``mxfp8``, ``nvfp4``) on every unit, and every option on a word table's rows unseen
in the fit texts (the ``<table>@unseen`` unit).

Measured as :mod:`variants.search.sensitivity` measures a width (the unit alone round-tripped,
the rest fp32; mean KL of the reference's softmax to the variant's on the sensitivity rows),
through :func:`variants.search.sensitivity.measure_unit` with the format's round trip
(:func:`variants.layer_maps.formats.round_trip`); for ``@unseen`` only the unseen rows of
the table change. Cached as JSON under ``cache_dir/search/`` by the reference's weights, the
rows, the units, the options, the group size and the used rows.
"""

import json
from pathlib import Path

import numpy as np

from variants.layer_maps import formats
from variants.layer_maps.bits_map import UNSEEN

VERSION = 1


def needed(units, options):
    """The (unit, option) pairs the width table does not cover: a mode on any unit, every
    option on an ``@unseen`` unit."""
    return [(u, o) for u in units for o in options if o != "int8"
            and (isinstance(o, str) and o in formats.MX_SHAPE or UNSEEN in u)]


def measure(reference, taskset, pairs, group_size, used=None, cache_dir=None, log=None):
    """``{(unit, option): kl_mean}`` of ``pairs`` (:func:`needed`) on ``taskset``.

    ``used`` (vocab,) bool: the word-table rows the fit texts use (needed for ``@unseen``
    units). Raises ValueError for an ``@unseen`` unit without ``used``."""
    from runs.io import digest
    from variants.arch import activations
    from variants.search import sensitivity

    if not pairs:
        return {}
    path = None
    if cache_dir is not None:
        key = reference.cache_key(activations.module_fingerprint(reference.module),
                                  taskset.fingerprint(), [list(map(str, p)) for p in pairs],
                                  group_size, "format-sensitivity", VERSION,
                                  None if used is None else digest(np.asarray(used).tolist()))
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
        table = unit.split("@")[0]
        m = state["mods"][table]
        fmt = formats.of(opt, group_size)
        if m.weight.shape[1] % fmt.group_size:
            continue
        w = m.weight
        if UNSEEN in unit:
            if used is None:
                raise ValueError(f"{unit}: the rows the fit texts use are unknown")
            unseen = np.flatnonzero(~np.asarray(used, bool))

            def trip(*_, w=w, fmt=fmt, unseen=unseen):
                import mlx.core as mx

                full = np.array(w, copy=True)
                if unseen.size:
                    full[unseen] = np.asarray(formats.round_trip(w[mx.array(unseen)], fmt))
                return full
        else:
            def trip(*_, w=w, fmt=fmt):
                return np.asarray(formats.round_trip(w, fmt))
        rows = sensitivity.measure_unit(state, {"path": table, "bits": [fmt.bits],
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

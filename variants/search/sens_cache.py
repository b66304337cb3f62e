"""One per-unit cache of the per-layer sensitivity (:mod:`variants.search.sensitivity`), shared by
``variants sensitivity`` and ``variants search``, and the measurement of the missing units on an
executor (:mod:`variants.executors`).

Both commands measure on the same rows: the first ``n`` rows of the search split's
calibration part (:func:`rows_of`; :mod:`variants.search.split`), never the calibration or eval
split the winner is judged on. A row (one unit at one width) is read from
``cache_dir/sensitivity/<model>-<key>/<unit path>.csv`` (one file per unit, one line per width
measured); the key covers what a row depends on: the reference's weights (the fitted head
included, :func:`variants.arch.activations.module_fingerprint`), the rows (the split's
fingerprint), the group size, the batch size, :data:`VERSION`, and the model's settings,
tokenizer, device and compute path (:meth:`variants.models.decision.DecisionModel.cache_key`)
less its temperatures (a row compares raw logits; the temperatures are fitted on the
calibration split, whose size is not the table's). So a search that needs units A, B, C at
widths 4, 6, 8 reads the rows ``variants sensitivity`` measured and measures only the others;
the set of units or widths asked for is not in the key.

Missing units run as executor units (``spec = {"path", "bits", "group_size"}``,
:func:`variants.search.sensitivity.measure_unit`): in this process (``local``, the driver's
prepared state) or on workers that load the reference and the rows themselves from paths
(:func:`init_remote`; a worker whose key differs from the driver's raises). Each unit's rows
are written (atomically, merged with the widths already there) as it completes, by the driver
only. Rows are the same whichever executor measured them (each unit restores its weight; the
workers use the driver's MLX stream count).
"""

import copy
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from variants.search import sensitivity as sens

VERSION = 2  # bump when what a row means changes (it is in the key)


@dataclass
class Table:
    """``frame``: :data:`~variants.search.sensitivity.COLUMNS`, units in the order asked, widths
    ascending; ``folder``: the cache folder; ``cached`` / ``measured``: rows read / measured."""

    frame: pd.DataFrame
    folder: Path
    cached: int
    measured: int


def rows_of(parts, n):
    """The sensitivity rows of the search parts ``parts``: the first ``n`` rows of the
    search-calibration part (all of them when it has fewer)."""
    cal = parts["search-calibration"]
    return cal.subset(list(range(min(int(n), len(cal)))))


def key(reference, taskset, group_size, batch_size=32):
    """16 hex digits (module docstring)."""
    from variants.arch.activations import module_fingerprint

    raw = copy.copy(reference)
    raw.temperatures = {}
    return raw.cache_key(module_fingerprint(reference.module), taskset.fingerprint(),
                         int(group_size), int(batch_size), "sensitivity-rows", VERSION)


def folder_of(reference, taskset, cache_dir, group_size, batch_size=32):
    """``cache_dir/sensitivity/<model>-<key>``."""
    return (Path(cache_dir) / "sensitivity"
            / f"{reference.name}-{key(reference, taskset, group_size, batch_size)}")


def _unit_file(folder, path):
    return Path(folder) / f"{path}.csv"


def read_unit(folder, path):
    """{bits: row tuple} cached for unit ``path`` ({} when none). Floats are read back exactly
    (pandas writes the shortest repr and, from 3.0, parses it round-trip)."""
    f = _unit_file(folder, path)
    if not f.exists():
        return {}
    frame = pd.read_csv(f)
    if list(frame.columns) != sens.COLUMNS:
        return {}
    return {int(r.bits): (r.layer, int(r.bits), int(r.group_size), float(r.max_abs_dlogit),
                          float(r.kl_mean), float(r.flip_rate), int(r.n))
            for r in frame.itertuples()}


def write_unit(folder, path, rows):
    """Merge ``rows`` (tuples) into unit ``path``'s file, widths ascending (atomic write)."""
    from runs.io import write_csv

    have = read_unit(folder, path)
    have.update({int(r[1]): tuple(r) for r in rows})
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_csv(_unit_file(folder, path),
              pd.DataFrame([have[b] for b in sorted(have)], columns=sens.COLUMNS))


def measure_cached(reference, taskset, cache_dir, *, paths, bits, group_size=64, batch_size=32,
                   executor=None, remote=None, progress=None, log=None):
    """The sensitivity rows of ``paths`` x ``bits`` on ``taskset``, read from the cache or
    measured now (missing units only).

    Parameters
    ----------
    reference : variants.models.decision.DecisionModel
        Not modified.
    taskset : variants.datasets.tasks.TaskSet
        The rows (:func:`rows_of`).
    paths : list of str
        Units (Linears, embedding tables), forward order; a unit whose input size
        ``group_size`` does not divide is left out.
    bits : sequence of int
    executor : optional
        From :func:`variants.executors.factory.make_executor` (None: in this process).
    remote : dict, optional
        The payload of :func:`init_remote` (needed when ``executor`` is not local):
        ``sweep`` (SweepConfig keywords, absolute paths), ``n_search``, ``n_rows``.
    progress : callable(int), optional
        Called with the number of rows of each unit measured.
    log : callable(str), optional
        Gets one line: rows read, rows measured, the folder.

    Returns
    -------
    Table

    Raises
    ------
    ValueError
        Bad widths or group size, no rows, no unit left.
    RuntimeError
        A unit's worker died twice (the units measured so far are cached: rerun).
    """
    from variants.executors.local import LocalExecutor
    from variants.families.quant.family import check_bits

    bits = sorted({int(b) for b in bits})
    for b in bits:
        check_bits(b, group_size, prefix="--")
    if taskset is None or len(taskset) == 0:
        raise ValueError("no examples to measure sensitivity on; pass --n-examples >= 10")
    mods = dict(reference.module.named_modules())
    paths = [p for p in paths if not mods[p].weight.shape[1] % group_size]
    if not paths:
        raise ValueError(f"no layer's input size is divisible by --group-size {group_size}; "
                         "choose 32")
    folder = folder_of(reference, taskset, cache_dir, group_size, batch_size)
    have = {p: read_unit(folder, p) for p in paths}
    specs = [{"path": p, "bits": [b for b in bits if b not in have[p]], "group_size": group_size}
             for p in paths]
    specs = [s for s in specs if s["bits"]]
    cached = sum(len(set(bits) & set(have[p])) for p in paths)
    measured = 0
    if specs:
        executor = executor or LocalExecutor()
        if getattr(executor, "kind", "local") == "local" or remote is None:
            init = (_given, (sens.prepare(reference, taskset, batch_size),))
        else:
            init = (init_remote, (dict(remote, key=key(reference, taskset, group_size,
                                                         batch_size), batch_size=batch_size,
                                 group_size=group_size),))

        def on_result(i, spec, rows):
            nonlocal measured
            if isinstance(rows, dict):  # {"error": ...}: its worker died twice
                raise RuntimeError(f"sensitivity of {spec['path']}: {rows['error']}; rerun (the "
                                   "units measured so far are cached)")
            write_unit(folder, spec["path"], rows)
            have[spec["path"]].update({int(r[1]): tuple(r) for r in rows})
            measured += len(rows)
            if progress is not None:
                progress(len(rows))

        executor.run(*init, sens.measure_unit, specs, on_result)
    frame = pd.DataFrame([have[p][b] for p in paths for b in bits], columns=sens.COLUMNS)
    if log:
        log(f"sensitivity: {cached} of {len(frame)} rows read from the cache, {measured} "
            f"measured ({folder})")
    return Table(frame, folder, cached, measured)


def _given(state):
    """``init`` of the local executor: the driver's prepared state."""
    return state


def load_rows(payload):
    """(reference, rows) from ``payload`` (``sweep``: SweepConfig keywords; ``n_search``;
    ``n_rows``): the fitted reference (its head from the cache when the driver fitted it) and
    :func:`rows_of` the search parts. Raises SweepError / ValueError on bad input."""
    from variants.models import fitted_reference
    from variants.runtime import device
    from variants.search.split import search_tasksets
    from variants.sweep.config import SweepConfig
    from variants.sweep.inputs import cache_parts, load_inputs

    cfg = SweepConfig(**payload["sweep"]).validate()
    device.use(cfg.device or device.requested(), cfg.dtype)
    _, checkpoint, tasksets = load_inputs(cfg)
    source = cfg.resolve_model()
    from variants.models.head_output import require_softmax

    require_softmax(source, "per-layer sensitivity measures the KL between softmaxes of the raw "
                    "logits and top-1 flips (variants/search/sensitivity.py)",
                    "sweep fixed settings instead (variants sweep --family quant --bits 8, or "
                    "lowrank, prune, w8a8), each judged by the head's own contract")
    parts = search_tasksets(cfg, source, payload["n_search"])
    reference, _ = fitted_reference(source, checkpoint, tasksets,
                                    Path(cfg.results_dir) / ".cache", log=payload.get("log") or print,
                                    extra_key=cache_parts(cfg))
    return reference, rows_of(parts, payload["n_rows"])


def init_remote(payload):
    """A process / Ray worker's state: :func:`load_rows` then
    :func:`variants.search.sensitivity.prepare`. Raises RuntimeError when the worker's key is
    not the driver's ``payload["key"]`` (its rows would be another table's)."""
    reference, rows = load_rows(dict(payload, log=lambda m: None))
    mine = key(reference, rows, payload["group_size"], payload["batch_size"])
    if mine != payload["key"]:
        raise RuntimeError(f"a sensitivity worker's key {mine} is not the driver's "
                           f"{payload['key']}: its reference or rows differ")
    return sens.prepare(reference, rows, payload["batch_size"])

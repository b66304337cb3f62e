"""The search split: rows the eval (and calibration) split never sees, carved from the fit
split's rows that the reference's head was *not* fitted on.

Bundled data: the fit split (:func:`variants.datasets.splits.split_frame`) less the ``n_fit`` rows
:func:`variants.datasets.splits.sample` drew for the head, then ``n_search`` of the rest drawn the
same way (stratified by domain, seeded). Own data (``--data``): the fit split's rows after the
first ``n_fit`` in the sweep's ``sha256(f"{seed}:{id}")`` order
(:func:`variants.sweep.inputs.own_data_tasksets`). Either way the rows are then split in two by
``sha256(f"{seed}:search:{id}")``: the first ``n_search // 2`` are the search-calibration part
(the ε and the temperatures' calibration role), the rest the search-eval part (chunked, with
sequential stopping). The search never touches the calibration or eval split; the winner is
judged there afterwards.
"""

import hashlib

import numpy as np

from variants.sweep.config import SweepError

PARTS = ("search-calibration", "search-eval")


def _rank(ids, salt):
    return sorted(range(len(ids)), key=lambda i: hashlib.sha256(
        f"{salt}{ids[i]}".encode()).hexdigest())


def too_few(available, n_search, n_fit):
    return SweepError(f"--n-search {n_search} is more than the {available} fit-split rows left "
                      f"after the head's --n-fit {n_fit}; pass --n-search {available} or less "
                      "(or lower --n-fit)")


def search_tasksets(cfg, source, n_search):
    """``{"search-calibration", "search-eval": TaskSet}`` of a validated SweepConfig ``cfg``
    (module docstring). Raises SweepError naming ``--n-search`` when the fit split has fewer
    than ``n_search`` unused rows, or when ``n_search < 40``."""
    if n_search < 40:
        raise SweepError(f"--n-search {n_search} is too small; pass at least 40 (two parts of "
                         "20: the calibration part needs 1/alpha rows)")
    if cfg.data is not None:
        rows, make = _own_rows(cfg, source, n_search)
    else:
        from variants.datasets import bundled as data

        fit = data.split_frame(data.load_vader(), "fit")
        used = set(data.sample(fit, cfg.n_fit, seed=cfg.seed)["id"])
        rest = fit[~fit["id"].isin(used)].reset_index(drop=True)
        if len(rest) < n_search:
            raise too_few(len(rest), n_search, cfg.n_fit)
        rows = data.sample(rest, n_search, seed=cfg.seed)
        make = source.make_taskset
    order = _rank(rows["id"].astype(str).tolist(), f"{cfg.seed}:search:")
    half = n_search // 2
    parts = (np.sort(order[:half]), np.sort(order[half:]))
    return {name: make(rows.iloc[idx].reset_index(drop=True)) for name, idx in zip(PARTS, parts)}


def _own_rows(cfg, source, n_search):
    from variants.datasets import own as own_data

    options, scores, actions = source.fixed_options() or (None, None, None)
    defaults = dict(options=options, scores=scores, actions=actions)
    frame = own_data.read_data(cfg.data, **defaults)
    rows = own_data.split_rows(frame, "fit")
    rank = _rank(rows["id"].astype(str).tolist(), f"{cfg.seed}:")
    rest = rank[cfg.n_fit:]
    if len(rest) < n_search:
        raise too_few(len(rest), n_search, cfg.n_fit)
    rows = rows.iloc[sorted(rest[:n_search])]
    names = None if source.config is None and actions is None else source.action_names()

    def make(part):
        return own_data.to_taskset(part, action_names=names, **defaults)
    return rows, make

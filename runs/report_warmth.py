"""Whether the timed calls were warm, as the rounds themselves say: summary.csv's cold-call
counts and the report's "warm" sentence (:mod:`variants.runtime.warmth` labels each timed call;
timing.json ``ref_cold`` / ``var_cold``). No MLX.

A run written before the labels existed has no counts: the sentence then says what its
warm-up setting allows (0 warm-ups: every measurement's first round was cold) and that the
calls were not labelled.
"""

import math

#: timing.json entry key -> summary.csv suffix (``b<B>_`` / ``e2e_b<B>_`` prefixed): timed
#: calls labelled cold (ints), written only when the entry holds them.
COLD_COUNTS = ("ref_cold_calls", "var_cold_calls")


def _num(v):
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def cold_cells(prefix, entry):
    """summary.csv cells ``<prefix>ref_cold_calls`` / ``<prefix>var_cold_calls`` (int) of one
    timing.json entry; {} for an entry timed before the labels existed."""
    return {prefix + k: int(entry[k]) for k in COLD_COUNTS if k in entry}


def cold_column(r, p):
    """The timing table's ``cold calls variant (ref)`` cell of summary row ``r`` at prefix
    ``p``; {} when the row has no labels."""
    if not _num(r.get(p + "var_cold_calls")):
        return {}
    return {"cold calls variant (ref)": f"{r[p + 'var_cold_calls']:.0f} "
                                        f"({r[p + 'ref_cold_calls']:.0f})"}


def warm_text(summary, cfg):
    """The report's phrase on warmth, computed from summary.csv's forward cold counts
    (``b<B>_ref_cold_calls`` / ``b<B>_var_cold_calls``; the end-to-end region times the same
    calls) and, for rows without them, run.json's ``timing_warmup``.

    Parameters
    ----------
    summary : pandas.DataFrame
        summary.csv's table.
    cfg : dict
        run.json ``config``.

    Returns
    -------
    str
        "both warm (...)" only when every measurement is labelled and no timed call was cold;
        otherwise how many calls were cold, of which model, and in which measurements.
    """
    ref = var = 0
    where, unlabelled = [], 0
    for _, r in summary.iterrows():
        for col in summary.columns:
            if not (col.startswith("b") and col.endswith("_var_p50_ms")) \
                    or not _num(r.get(col)):
                continue
            p = col[:-len("var_p50_ms")]
            if not _num(r.get(p + "var_cold_calls")):
                unlabelled += 1
                continue
            n_ref, n_var = int(r[p + "ref_cold_calls"]), int(r[p + "var_cold_calls"])
            ref, var = ref + n_ref, var + n_var
            if n_ref or n_var:
                where.append(f"`{r['variant']}` B={p[1:-1]}")
    warmup = cfg.get("timing_warmup")
    old = (f"{unlabelled} measurement(s) carry no cold labels (timed before they were recorded)"
           if unlabelled else "")
    if not (ref or var):
        if not unlabelled:
            return ("both warm (no timed call was the first of its shape since the buffer "
                    "cache was cleared)")
        if warmup == 0:
            return (f"**not warm**: 0 warm-ups, so each measurement's first round timed cold "
                    f"calls ({old})")
        return f"after warm-ups, warmth not checked ({old})"
    text = (f"**not all warm**: {ref + var} timed calls were cold (the first of their shape "
            f"since the buffer cache was cleared; reference {ref}, variant {var}) in "
            + ", ".join(where) + ": those speed-ups are flagged")
    return text + (f"; {old}" if old else "")

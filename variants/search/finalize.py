"""The finalists on the real splits: the cheapest search-passing candidates, built, run on the
calibration and eval splits, timed and judged by the sweep itself (:class:`variants.sweep.run.Sweep`
with the finalists as its variants, its run folder ``OUT/final``), so each has the folder and
report of any sweep variant. The first that passes on eval wins; when the search's winner fails
there, the search overfitted the search split, and the next cheapest that passes both is named.
"""

import json


def finalize(search, passing, n=3):
    """Judge up to ``n`` of ``passing`` (records, cheapest first) on the real splits, one more
    at a time until one passes. Returns ``(winner record or None, finalists)``; a finalist is
    ``{id, name, bits_per_weight, model_bytes, passed_eval, failed_eval, undecided_eval,
    folder}``."""
    from variants.sweep.run import Sweep

    o = search.opts
    out = search.out / "final"
    finalists, chosen = [], []
    for rec in passing[:n]:
        chosen.append(rec)
        kw = o.sweep_kwargs()
        kw.update(run="final", timing_rounds=o.timing_rounds, timing_warmup=o.timing_warmup,
                  timing_budget_s=o.timing_budget_s, cold_start=o.cold_start,
                  progress=o.progress)
        cfg = _sweep_config(search, chosen, kw)
        sweep = Sweep(cfg, log=search.log)
        sweep.out = out  # the search's own folder (the cache stays the results dir's)
        search.log(f"judging {rec['name']} on the calibration + eval splits")
        sweep.run()
        verdict = json.loads((out / rec["name"] / "verdict.json").read_text())
        finalists.append(_finalist(rec, verdict, out))
        if verdict["passed"]:
            return rec, finalists
    return None, finalists


def composed_of(rec):
    """Whether a search record is a composed candidate the sweep builds as the composed family
    (a ``config`` beyond a uniform quant width)."""
    return bool(rec.get("config")) and set(rec["config"]) != {"quant"}


def _sweep_config(search, chosen, kw):
    """The finalists' SweepConfig: the quant family's variants, or the composed family's
    (:mod:`variants.families.composed`) when the records are composed."""
    from variants.families.composed.family import ComposedConfig
    from variants.families.composed.recipe import recipe_of
    from variants.sweep.config import SweepConfig

    o = search.opts
    if any(composed_of(r) for r in chosen):
        recipes = [recipe_of(r["config"]) for r in chosen]
        kw = dict(kw, family="composed",
                  params={"compose": recipes, "compose_group_size": o.group_size})
        cfg = SweepConfig(**kw).validate()
        cfg.variants = [ComposedConfig(r, o.group_size) for r in recipes]
        return cfg
    cfg = SweepConfig(**kw).validate()
    cfg.variants = [o.quant_config(r["default_bits"], r["bits_map"], r.get("method", "rtn"),
                                   r.get("int8", "")) for r in chosen]
    return cfg


def finalize_together(search, chosen):
    """Judge and time every record of ``chosen`` in one sweep (``OUT/final``); the winner is the
    one passing on eval with the highest measured speed-up at the cost's batch size (ties: fewer
    bytes). Returns ``(winner record or None, finalists)``; each finalist as :func:`finalize`'s
    plus ``measured_speedup`` and ``predicted_speedup``."""
    from variants.sweep.run import Sweep

    o = search.opts
    out = search.out / "final"
    if not chosen:
        return None, []
    kw = o.sweep_kwargs()
    kw.update(run="final", timing_rounds=o.timing_rounds, timing_warmup=o.timing_warmup,
              timing_budget_s=o.timing_budget_s, cold_start=o.cold_start, progress=o.progress)
    sweep = Sweep(_sweep_config(search, chosen, kw), log=search.log)
    sweep.out = out
    search.log(f"judging and timing {len(chosen)} finalists on the calibration + eval splits: "
               + ", ".join(r["name"] for r in chosen))
    sweep.run()
    batch = o.cost.split("-b")[-1] if o.cost.startswith("latency-b") else None
    finalists = []
    for rec in chosen:
        verdict = json.loads((out / rec["name"] / "verdict.json").read_text())
        f = _finalist(rec, verdict, out)
        f["predicted_speedup"] = rec.get("predicted_speedup")
        f["measured_speedup"] = _measured(out / rec["name"] / "timing.json", batch)
        finalists.append(f)
    ok = [(f, r) for f, r in zip(finalists, chosen) if f["passed_eval"]]
    budget = o.budget
    if budget is not None:  # the predicted cost after the build, against --budget
        ok = [(f, r) for f, r in ok if r["cost"] <= budget]
    faster = [(f, r) for f, r in ok if (f["measured_speedup"] or 0.0) > 1.0]
    search.none_faster = bool(ok) and not faster
    if not faster:  # passing but measured no faster than the reference: keep the reference
        return None, finalists
    ok = faster
    f, r = max(ok, key=lambda fr: (fr[0]["measured_speedup"] or 0.0, -fr[0]["model_bytes"]))
    return dict(r, measured_speedup=f["measured_speedup"]), finalists


def _measured(path, batch):
    """The forward region's median speed-up at ``batch`` (else the largest timed) in a
    timing.json; None when it has none."""
    try:
        t = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    region = t.get("batches") or {}
    b = batch if batch in region else (max(region, key=int) if region else None)
    return None if b is None else (region[b].get("speedup") or {}).get("speedup_median")


def _finalist(rec, verdict, out):
    return {"id": rec["id"], "name": rec["name"], "bits_per_weight": rec["bits_per_weight"],
            "model_bytes": rec["model_bytes"], "passed_eval": verdict["passed"],
            "failed_eval": verdict["failed"], "undecided_eval": verdict.get("undecided", []),
            "folder": str(out / rec["name"]), "clauses_search": rec.get("clauses", {}),
            "clauses_eval": {c["id"]: {k: c.get(k) for k in (
                "value", "ci_low", "ci_high", "op", "threshold", "status")}
                for c in verdict.get("clauses", [])}}

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
    from variants.sweep.config import SweepConfig

    o = search.opts
    out = search.out / "final"
    finalists, chosen = [], []
    for rec in passing[:n]:
        chosen.append(rec)
        kw = o.sweep_kwargs()
        kw.update(run="final", timing_rounds=o.timing_rounds, timing_warmup=o.timing_warmup,
                  timing_budget_s=o.timing_budget_s, cold_start=o.cold_start,
                  progress=o.progress)
        cfg = SweepConfig(**kw).validate()
        cfg.variants = [o.quant_config(r["default_bits"], r["bits_map"],
                                       r.get("method", "rtn"), r.get("int8", ""))
                        for r in chosen]
        sweep = Sweep(cfg, log=search.log)
        sweep.out = out  # the search's own folder (the cache stays the results dir's)
        search.log(f"judging {rec['name']} on the calibration + eval splits")
        sweep.run()
        verdict = json.loads((out / rec["name"] / "verdict.json").read_text())
        finalists.append({"id": rec["id"], "name": rec["name"],
                          "bits_per_weight": rec["bits_per_weight"],
                          "model_bytes": rec["model_bytes"], "passed_eval": verdict["passed"],
                          "failed_eval": verdict["failed"],
                          "undecided_eval": verdict.get("undecided", []), "folder": str(out / rec["name"]),
                          "clauses_search": rec.get("clauses", {}),
                          "clauses_eval": {c["id"]: {k: c.get(k) for k in (
                              "value", "ci_low", "ci_high", "op", "threshold", "status")}
                              for c in verdict.get("clauses", [])}})
        if verdict["passed"]:
            return rec, finalists
    return None, finalists

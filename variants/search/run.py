"""``run_search``: one search, start to end (:mod:`variants.search.driver` does the steps)."""

import time
from contextlib import ExitStack
from pathlib import Path

from runs import lock as runlock
from runs.io import make_out_dir, remove_temp_files
from variants.search.driver import N_FINALISTS, Search, SearchResult
from variants.search.report import write_all


def run_search(opts, log=print):
    """Run the search of validated :class:`SearchOptions`; returns :class:`SearchResult`.

    One search at a time per output folder: ``OUT/.lock`` is held (:func:`runs.lock.hold`, as a
    sweep holds its run folder's) from the folder's creation until search.json is written; a
    second search on the same OUT raises :class:`runs.lock.RunLocked` (exit 2) naming the
    holder. Raises ValueError / SweepError (bad input) or :class:`variants.executors.local.ExecutorError`
    (``--executor ray`` and Ray missing or its address not answering) before the first write.

    Candidates run on ``opts.executor`` (:func:`variants.executors.factory.make_executor`), its workers
    kept for the whole search. ``local`` hands the driver's own state to each candidate;
    ``process`` / ``ray`` workers get only the payload (settings and absolute paths,
    :meth:`Search.remote_payload`) and load the checkpoint and the reference outputs
    themselves, from the caches this driver writes before the first worker starts."""
    from variants.executors.factory import make_executor
    from variants.search import worker

    t0 = time.perf_counter()
    opts = opts.validate(log)
    cls = Search
    if opts.strategy == "optuna":
        from variants.search.optuna_search import OptunaSearch as cls  # composed candidates
    elif opts.strategy == "latency":
        from variants.search.latency_walk import LatencySearch as cls  # composed, by latency
    s = cls(opts, log=log)
    executor = make_executor(opts.executor, workers=opts.workers, ray_address=opts.ray_address,
                             log=log)
    with ExitStack() as held:  # OUT's lock and the cache's, until search.json is written
        with executor:  # Ray: connects here, before anything is loaded or written
            s.parts_s = {}
            s.prepare()
            s.parts_s["load and check"] = time.perf_counter() - t0
            make_out_dir(s.out, "--out" if opts.out else "--results-dir")
            held.enter_context(runlock.hold(
                s.out, log=log, fix="wait for it to finish, or pass another --out"))
            held.enter_context(runlock.cache_lock(Path(opts.results_dir) / ".cache"))
            remove_temp_files(s.out)  # a killed writer's: nobody else writes OUT now
            s.store.write_settings(s.settings)
            t = time.perf_counter()
            worker.prepare_reference(s.state, s.payload)  # the caches, before any worker starts
            s.parts_s["reference on the search split"] = time.perf_counter() - t
            s.executor = executor
            s.worker_init = ((worker.given_state, (s.state,)) if opts.executor == "local"
                             else (worker.init_worker, (s.remote_payload(),)))
            t = time.perf_counter()
            sens = s.sensitivity()
            s.parts_s["per-layer sensitivity"] = time.perf_counter() - t
            if opts.strategy == "latency":
                log(f"search: the composed space (W8A8, 8-bit embeddings, token pruning, early "
                    f"exit), strategy latency, cost {opts.cost}, executor {opts.executor} x "
                    f"{executor.workers}")
            else:
                if getattr(s, "dropped_note", ""):
                    log(s.dropped_note)
                log(f"search: {len(s.layers)} layers x options "
                    f"{list(getattr(s, 'options', opts.bits))} (cheapest first), quantizers "
                    f"{' '.join(opts.quant_methods)}, strategy "
                    f"{opts.strategy}, cost {opts.cost}, executor {opts.executor} x "
                    f"{executor.workers}")
            t = time.perf_counter()
            records = s.walk(sens)
            s.parts_s["candidates"] = time.perf_counter() - t
        # the workers are gone before the finalists' timing
        return _conclude(s, opts, records, t0, log)


def _undecided_text(records, n):
    """One sentence naming the cheapest candidate that no clause fails but one or more leaves
    undecided on ``n`` search-eval rows, and the rows that would decide each ("" if none)."""
    open_ = sorted((r for r in records if r.get("undecided") and not r["failed"]),
                   key=lambda r: (r["cost"], r["model_bytes"], r["id"]))
    if not open_:
        return ""
    r = open_[0]
    need = r.get("rows_needed") or {}
    parts = ", ".join(f"{c} (about {need[c]:,} rows would decide it)" if need.get(c) else c
                      for c in r["undecided"])
    return (f" Undecided (not a pass): {r['name']} ({r['bits_per_weight']:.3f} bits/weight) on "
            f"{parts}, at its observed rates on {n} search-eval rows; give more rows "
            "(--n-search) to decide it.")


def _conclude(s, opts, records, t0, log):
    passing = sorted((r for r in records if r["passed"]),
                     key=lambda r: (r["cost"], r["model_bytes"], r["id"]))
    winner, finalists, outcome = None, [], ""
    if not passing:
        scored = [r for r in records if r.get("slack") is not None]
        close = max(scored, key=lambda r: (r["slack"], -r["cost"])) if scored else None
        outcome = ("No candidate passes the contract on the search split."
                   + (f" Closest: {close['name']} ({close['bits_per_weight']:.3f} bits/weight), "
                      f"blocked by {', '.join(close['failed']) or close['tightest']} "
                      f"(tightest: {close['tightest']}, slack {close['slack']:+.3f})."
                      if close else "") + _undecided_text(records, len(s.state["parts"]["search-eval"])))
        # (a clause no candidate can pass on these rows stopped the search before it began:
        # variants.search.bounds.check_rows in Search.prepare)
    elif opts.finalize and not getattr(s, "finalizable", lambda r: True)(passing[0]):
        winner = passing[0]
        outcome = (f"Cheapest passing on the search split: {winner['name']} ({opts.cost} "
                   f"{winner['cost']:.6g}); a composed (cross-family) candidate is not judged "
                   "on eval (the sweep builds one family per variant).")
    elif opts.finalize:
        t = time.perf_counter()
        winner, finalists = s_finalize(s, passing)
        s.parts_s = dict(getattr(s, "parts_s", {}), **{
            "finalists on calibration + eval (build, outputs, timing)": time.perf_counter() - t})
        first = passing[0]
        measured = [f for f in finalists if f.get("measured_speedup") is not None]
        if winner is not None and measured:  # the latency walk: fastest measured on eval
            held = sum(bool(f["passed_eval"]) for f in finalists)
            outcome = (f"Winner {winner['name']}: of {len(finalists)} finalists, {held} pass on "
                       "the eval split, and it is the one measured fastest; "
                       f"{winner['model_bytes'] / 1e6:.2f} MB (report: {search_folder(s, winner)}"
                       "/report.md).")
        elif winner is None and getattr(s, "none_faster", False):
            outcome = (f"No winner: {sum(bool(f['passed_eval']) for f in finalists)} finalists "
                       "pass on the eval split, but none is measured faster than the reference "
                       f"at B={opts.cost.split('-b')[-1]} (" + ", ".join(
                           f"{f['name']} {f['measured_speedup']:.2f}×" for f in finalists
                           if f.get("measured_speedup") is not None)
                       + "): keep the reference.")
        elif winner is None:
            outcome = (f"The search's winner {first['name']} and the next "
                       f"{len(finalists) - 1} cheapest fail on the eval split: the search "
                       "overfitted the search split; no configuration passes both.")
        elif winner["id"] != first["id"]:
            outcome = (f"The search's cheapest passing candidate {first['name']} FAILS on the "
                       f"eval split ({', '.join(finalists[0]['failed_eval'])}): the search "
                       f"overfitted. The runner-up {winner['name']} passes on both: "
                       f"{winner['bits_per_weight']:.3f} bits/weight, "
                       f"{winner['model_bytes'] / 1e6:.2f} MB.")
        else:
            outcome = (f"Winner {winner['name']}: passes on the search split and on the eval "
                       f"split; {winner['bits_per_weight']:.3f} bits/weight, "
                       f"{winner['model_bytes'] / 1e6:.2f} MB (report: {finalists[-1]['folder']}"
                       "/report.md).")
    else:
        winner = passing[0]
        outcome = (f"Cheapest passing on the search split: {winner['name']} "
                   f"({winner['bits_per_weight']:.3f} bits/weight); not judged on eval "
                   "(--no-finalize).")
    if winner is not None and winner.get("measured_speedup") is not None:  # the latency walk
        b = opts.cost.split("-b")[-1]
        outcome += (f" Speed-up at B={b}: predicted {winner['predicted_speedup']:.2f}×, "
                    f"measured {winner['measured_speedup']:.2f}× (strict alternation with the "
                    "reference).")
    n_full = sum(r["n_total"] for r in records if r.get("evaluated"))
    n_used = sum(r["n_used"] for r in records if r.get("evaluated"))
    result = {
        "settings": s.settings, "out": str(s.out), "layers": s.layers,
        "reference_noise": s.state.get("noise"),
        "kept": [list(k) for k in getattr(getattr(s, "units", None), "kept", [])],
        "executor": {"kind": opts.executor, "workers": s.executor.workers,
                     "ray_address": getattr(s.executor, "address", None)},
        "sensitivity_cache": str(s.sens_path), "outcome": outcome,
        # the reference's head and temperatures: shipped, cached or fitted, and their hash
        # (variants.models.fitted_state; a finalized search's final/run.json has the same)
        "reference_fit": s.state["reference"].fitted_record,
        "winner": winner, "finalists": finalists,
        # the winner's pieces against the reference's segment profile (variants.search.amdahl)
        "amdahl": _amdahl(s, winner, finalists),
        # the exact family's savings priced by the data's repeats (variants.search.workload_price)
        "workload": _workload(s, winner), "overfitted": bool(
            finalists and not finalists[0]["passed_eval"]),
        "candidates": records,
        "totals": {"candidates": len(records),
                   "evaluated": sum(1 for r in records if not r["reused"]),
                   "reused": sum(1 for r in records if r["reused"]),
                   "lost": sum(1 for r in records if "error" in r),
                   "sensitivity_rows": dict(getattr(s, "sens_rows", {})),
                   "n_search_calibration": len(s.state["parts"]["search-calibration"]),
                   "n_search_eval": len(s.state["parts"]["search-eval"]),
                   "examples_used": n_used, "examples_full": n_full,
                   "examples_saved_share": (1 - n_used / n_full) if n_full else 0.0,
                   "saved_s": sum(r.get("saved_s", 0.0) for r in records),
                   "wall_s": time.perf_counter() - t0,
                   "parts_s": dict(getattr(s, "parts_s", {}))},
    }
    json_path, md_path, png = write_all(s.out, result)
    log(outcome)
    log(f"wrote {json_path}, {md_path}" + (f", {png}" if png else ""))
    return SearchResult(found=winner is not None, winner=winner, out=s.out, result=result)


def _amdahl(s, winner, finalists):
    """The Amdahl table of a finalized winner (None when nothing was finalized)."""
    if winner is None or not finalists:
        return None
    from variants.search.amdahl import answer

    return answer(s.out, winner, s.settings)


def search_folder(s, rec):
    """The finalists' sweep folder of ``rec`` (``OUT/final/<name>``)."""
    return s.out / "final" / rec["name"]


def _workload(s, winner):
    """The winner's measured speed-up priced with a result cache on the search split's texts."""
    if winner is None or not winner.get("measured_speedup"):
        return None
    from variants.search.workload_price import price

    parts = s.state["parts"]
    texts = [t for p in ("search-calibration", "search-eval") for t in parts[p].texts]
    return price(texts, winner["measured_speedup"])


def s_finalize(search, passing):
    if hasattr(search, "finalize"):  # the latency walk times its finalists together
        return search.finalize(passing, N_FINALISTS)
    from variants.search.finalize import finalize

    return finalize(search, passing, N_FINALISTS)

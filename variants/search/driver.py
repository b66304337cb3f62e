"""The search driver: validate, load, measure sensitivity, walk a strategy, judge every
candidate on the search split, then judge the finalists on the real calibration + eval splits
through the sweep (their folders and reports are a sweep's), and write search.json / .md / .png.

Bad input (a flag out of range, a budget below the cheapest candidate, an --out holding a
search with other settings, too few search-eval rows for a clause's bound to pass at all)
raises ValueError with one line before anything is written or measured. A
contract no candidate passes is a result: :attr:`SearchResult.found` is False and the outcome
names the closest candidate and the clause that blocks it.
"""
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from variants.search import costs as costs_mod
from variants.search import strategies
from variants.search.options import (FAMILIES, MAX_CANDIDATES, MAX_SEED, PLAIN,  # noqa: F401
                                     N_FINALISTS, SearchOptions)
from variants.search.store import Store, candidate_id


@dataclass

class SearchResult:
    found: bool
    winner: dict | None
    out: Path
    result: dict


def spec_of(layer_bits, stop=True, method="rtn"):
    """The worker spec of a map: the most common width as ``--bits`` (ties: the lowest; 8
    when every unit is int8), the other layers as exact-path ``--bits-map`` entries, the
    ``"int8"`` units as one exact-path ``--int8-layers`` regex, the quantizer ``method``."""
    import re

    from variants.search.dims import int8_pattern

    counts = Counter(b for p, b in layer_bits.items()
                     if isinstance(b, int) and "@" not in p)
    default = min(counts, key=lambda b: (-counts[b], b)) if counts else 8
    # a table's @unseen rows: an entry (first) when they differ from the table's own
    entries = [f"^{re.escape(p)}$={b}" for p, b in layer_bits.items()
               if "@" in p and b != layer_bits.get(p.split("@")[0])]
    entries += [f"^{re.escape(p)}$={b}" for p, b in layer_bits.items()
                if "@" not in p and b != default and b != costs_mod.INT8]
    spec = {"id": candidate_id(layer_bits, method), "default_bits": int(default),
            "bits_map": ",".join(entries), "stop": bool(stop)}
    int8 = int8_pattern([p for p, b in layer_bits.items() if b == costs_mod.INT8])
    if method != "rtn" or int8:
        spec.update(method=method, int8=int8)
    return spec


class Search:
    def __init__(self, opts, log=print):
        self.opts, self.log = opts, log

    # -- setup ---------------------------------------------------------------------------------
    def prepare(self):
        """Load and check everything; nothing written."""
        from variants.search import worker
        from variants.search.units import search_units

        o = self.opts
        self.payload = {"sweep": o.sweep_kwargs(), "n_search": o.n_search,
                        "chunk_size": o.chunk_size, "group_size": o.group_size,
                        "search_margin": o.search_margin, "select": o.select,
                        "quantize_embeddings": o.quantize_embeddings,
                        "quantize_head": o.quantize_head, "scale_dtype": o.scale_dtype,
                        "embedding_texts": o.embedding_texts}
        self.state = worker.load(self.payload)
        cfg = self.state["cfg"]
        alpha = self.state["settings"]["alpha"]  # the search-calibration half gives the ε too
        need = math.ceil(1.0 / alpha) - 1
        if o.n_search // 2 < need:
            raise ValueError(f"--n-search {o.n_search} gives {o.n_search // 2} search-calibration "
                             f"rows, but the contract's alpha={alpha} needs at least {need} for "
                             f"the split-conformal ε; raise --n-search to {2 * need} or more")
        from variants.search.bounds import check_rows

        # before any sensitivity or candidate work: a clause no candidate can pass on these
        # rows (its bound needs more, even with no error at all) stops the search here
        check_rows(self.state["contract"], o.n_search, self.state["parts"]["search-eval"].labels,
                   o.select, self.state["contract"].settings.get("confidence", 0.95))
        model = self.state["source"].build(self.state["checkpoint"])
        module = model.module
        self.used = None
        if o.unseen_rows:  # the word-table rows the fit split's texts use
            from variants.families.quant.row_use import used_rows

            self.used = used_rows(model, self.state["tasksets"].get("fit"),
                                  o.quant_config(8, ""))
        self.units = search_units(module, model, group_size=o.group_size,
                                  # composed (optuna) candidates quantize encoder Linears only
                                  embeddings=o.quantize_embeddings and o.strategy == "bisect"
                                  or o.quantize_embeddings and o.strategy == "greedy",
                                  quantize_head=o.quantize_head,
                                  unseen_rows=self.used is not None)
        self.layers = self.units.paths
        from variants.search import dims

        from variants.search.row_lowering import NARROW

        self.costs = costs_mod.CostTable(module, self.layers, list(o.bits) +
                                         ([costs_mod.INT8] if o.w8a8 else []) + list(o.modes),
                                         o.group_size, o.scale_dtype, self.used,
                                         unseen_extra=NARROW)
        self.out = o.out_dir(cfg.model)
        self.store = Store(self.out)
        self.settings = dict(o.settings(), model=cfg.model, inputs=cfg.inputs_identity,
                             contract_sha256=_contract_digest(o.contract))
        if any(m != "rtn" for m in o.quant_methods):  # stored verdicts of learned candidates
            from variants.families.quant import learned  # hold for this quantizer code only

            self.settings["quantizer_version"] = learned.VERSION
        if o.w8a8:  # stored verdicts of int8 candidates: judged on their native build
            self.settings["int8_judged"] = "native"
            if o.cost.startswith("latency"):  # stored costs: this CPU's int8 kernel times
                from variants.runtime.int8_linear import cpu_isa, scheme

                self.settings["int8_latency_on"] = f"{cpu_isa()} ({scheme()})"
        self.store.check_settings(self.settings, plain=PLAIN)
        if o.strategy == "latency":  # the composed walk's own cost model, measured later
            self.options, self.method = list(o.bits), "rtn"
            return
        if o.cost.startswith("latency"):
            self.latency_path = self.costs.load_latency(
                o.cost, list(o.bits) + ([costs_mod.INT8] if o.w8a8 else []),
                Path(o.results_dir) / ".cache")
        self.options = dims.options(self.costs, o.cost, o.bits, o.w8a8,
                                    [p for p in self.layers if p not in self.costs.lookup],
                                    o.modes)
        self.method = o.quant_methods[0]
        dropped = [b for b in [*o.bits, *o.modes] if b not in self.options]
        # said with the walk's first line (run.py), after every check of the input
        self.dropped_note = (f"search: {' '.join(map(str, dropped))} dropped: under "
                             f"--cost {o.cost} a more accurate option costs no more"
                             if dropped else "")
        cheapest = min(self.costs.of(o.cost, dims.sanitise({p: opt for p in self.layers},
                                                           self.costs.lookup))
                       for opt in self.options)
        if o.budget is not None and cheapest > o.budget and tuple(o.families) == ("quant",):
            raise ValueError(f"--budget {o.budget:g} is below the cheapest candidate's "
                             f"{o.cost} ({cheapest:.6g} {costs_mod.UNITS[o.cost]}, every layer "
                             f"at its cheapest option): no candidate can meet it; raise --budget")

    def remote_payload(self):
        """The payload a process / Ray worker gets: ``self.payload`` with its file paths
        (``results_dir``, ``contract``, ``model_config``, ``checkpoint``, ``data``) made
        absolute, as a Ray worker's working directory is not the driver's. Cache keys hold
        file contents, not paths, so the worker finds the driver's caches."""
        sweep = dict(self.payload["sweep"])
        for k in ("results_dir", "contract", "model_config", "checkpoint", "data"):
            if sweep.get(k) is not None and Path(sweep[k]).exists():
                sweep[k] = str(Path(sweep[k]).resolve())
        out = dict(self.payload, sweep=sweep)
        ref = self.state.get("reference")
        if ref is not None and getattr(ref, "fitted_record", None):
            # a worker whose node fits its own head (no copy of the driver's cache) is refused
            out["reference_sha256"] = ref.fitted_record.get("sha256")
        return out

    def sensitivity(self):
        """{(unit, bits): mean KL} of every unit, from the cache shared with ``variants
        sensitivity`` (:mod:`variants.search.sens_cache`); the missing units run on the
        search's executor."""
        from variants.search import sens_cache

        o = self.opts
        sub = sens_cache.rows_of(self.state["parts"], o.n_sensitivity)
        remote = {"sweep": self.remote_payload()["sweep"], "n_search": o.n_search,
                  "n_rows": o.n_sensitivity}
        table = sens_cache.measure_cached(
            self.state["reference"], sub, Path(o.results_dir) / ".cache",
            paths=[p for p in self.layers if "@" not in p],
            bits=o.bits, group_size=o.group_size, executor=getattr(self, "executor", None),
            remote=remote, log=self.log)
        frame, self.sens_path = table.frame, table.folder
        self.sens_rows = {"read": table.cached, "measured": table.measured}
        sens = {(r.layer, int(r.bits)): float(r.kl_mean) for r in frame.itertuples()}
        from variants.search import format_sens

        pairs = format_sens.needed(self.layers, self.options)
        if pairs:  # the modes (the width table has none)
            sens.update(format_sens.measure(self.state["reference"], sub, pairs, o.group_size,
                                            Path(o.results_dir) / ".cache", self.log))
        if self.opts.w8a8:
            from variants.search.dims import int8_sensitivity

            linears = [p for p in self.layers if p not in self.costs.lookup]
            sens.update(int8_sensitivity(self.state["reference"], sub, linears,
                                         Path(self.opts.results_dir) / ".cache"))
            for p in self.costs.lookup:  # becomes 8 bits (variants.search.dims.sanitise)
                sens[p, costs_mod.INT8] = sens[p, max(self.opts.bits)]
        self.method_sens = {}
        if self.opts.method_sensitivity:
            from variants.search.dims import method_sensitivity

            for method in self.opts.quant_methods:
                table = method_sensitivity(self.state, method, sub, self.layers, self.opts,
                                           self.log)
                if table:
                    self.method_sens[method] = {**sens, **table}
        return sens

    # -- candidates ----------------------------------------------------------------------------
    def record(self, layer_bits, spec, res, step):
        """The candidate's record from the worker's result: judged here, on the driver. A
        result ``{"error": ...}`` (its worker was lost twice, :mod:`variants.executors.local`) is a
        failed candidate, ``failed == ["worker lost"]``, the reason in ``error``; it is not
        stored, so a resumed search evaluates it again."""
        from runs.judge import judge_outputs
        from variants.search.bounds import complete_bounds
        from variants.search.report import tightest
        from variants.search.sequential import complete

        st = self.state
        if "error" in res:
            return self._base(layer_bits, spec, step) | {
                "passed": False, "failed": ["worker lost"], "error": res["error"],
                "stopped": False, "tightest": None, "slack": None, "clauses": {}, "n_used": 0,
                "n_total": len(st["parts"]["search-eval"]), "wall_s": 0.0, "saved_s": 0.0,
                "evaluated": False}
        ref_cal, ref_eval = st["ref"]["search-calibration"], st["ref"]["search-eval"]
        full = complete(ref_eval, res["eval"])
        ev, verdict, _ = judge_outputs(ref_cal, ref_eval, res["cal"], full, st["contract"],
                                       settings=st["settings"])
        verdict = complete_bounds(ev, verdict)
        stopped = res["n_used"] < res["n_total"]
        # stopped: only the settled clauses' slacks mean something (best-case bounds)
        tid, sl = tightest(verdict, only=res["settled"] if stopped else None)
        per_chunk = sum(res["chunk_s"]) / max(len(res["chunk_s"]), 1)
        n_chunks = math.ceil(res["n_total"] / self.opts.chunk_size)
        return self._base(layer_bits, spec, step) | {
            "passed": bool(verdict.passed), "failed": res["settled"] or verdict.failed,
            "undecided": [] if res["settled"] else verdict.undecided,
            "rows_needed": {r.id: r.rows_needed for r in verdict.results
                            if r.undecided and not res["settled"]},
            "stopped": stopped, "tightest": tid, "slack": sl,
            "clauses": {r.id: {"value": _num(r.value), "compared": _num(r.compared_value),
                               "op": r.op, "threshold": r.threshold, "status": r.status,
                               "ci": [_num(r.ci_low), _num(r.ci_high)], "compare": r.compare,
                               "detectable": r.detectable}
                        for r in verdict.results},
            "n_used": res["n_used"], "n_total": res["n_total"], "wall_s": res["wall_s"],
            "saved_s": per_chunk * (n_chunks - len(res["chunk_s"])), "evaluated": True}

    def _base(self, layer_bits, spec, step):
        c = self.costs
        method, int8 = spec.get("method", "rtn"), spec.get("int8", "")
        name = self.opts.quant_config(spec["default_bits"], spec["bits_map"], method, int8).name
        return {"id": spec["id"], "step": step, "name": name, "layer_bits": dict(layer_bits),
                "default_bits": spec["default_bits"], "bits_map": spec["bits_map"],
                **({"method": method, "int8": int8} if "method" in spec else {}),
                "cost": c.of(self.opts.cost, layer_bits), "cost_name": self.opts.cost,
                "bits_per_weight": c.bits_per_weight(layer_bits),
                "model_bytes": c.model_bytes(layer_bits), "flops": c.flops(layer_bits)}

    def evaluate_batch(self, maps, step):
        """Records of ``maps`` (one strategy step), from the store or evaluated now."""
        o = self.opts
        recs, todo = [None] * len(maps), []
        for i, m in enumerate(maps):
            spec = spec_of(m, o.stop, getattr(self, "method", "rtn"))
            old = self.store.get(spec["id"])
            if old is not None:
                recs[i] = dict(old, reused=True)
            elif o.budget is not None and self.costs.of(o.cost, m) > o.budget:
                recs[i] = self._base(m, spec, step) | {
                    "passed": False, "failed": ["over --budget"], "stopped": False,
                    "tightest": None, "slack": None, "clauses": {}, "n_used": 0,
                    "n_total": len(self.state["parts"]["search-eval"]), "wall_s": 0.0,
                    "saved_s": 0.0, "evaluated": False}
                self.store.put(recs[i])
            else:
                todo.append((i, m, spec))

        return self.evaluate_todo(todo, recs, step,
                                  lambda r: f"{r['bits_per_weight']:.3f} bpw")

    def evaluate_todo(self, todo, recs, step, what):
        """Evaluate ``todo`` (``(index, config, spec)`` triples) through the executor into
        ``recs``, logging each as it completes (``what(record)``: the cost part of the line). A
        candidate whose worker was lost twice (``error``) is not stored: a resume retries it."""
        from variants.search import worker
        from variants.search.report import record_word

        def on_result(j, spec, res):
            i, config, _ = todo[j]
            r = recs[i] = self.record(config, spec, res, step)
            if "error" not in r:
                self.store.put(r)
            self.log(f"  [{step}] {r['name']}: {what(r)}, {record_word(r)}"
                     + (f" ({', '.join(r['failed'] or r.get('undecided') or [])})"
                        if r["failed"] or r.get("undecided") else "")
                     + f", {r['n_used']}/{r['n_total']} eval rows, {r['wall_s']:.1f} s")

        if todo:
            init, init_args = self.worker_init
            self.executor.run(init, init_args, worker.evaluate_candidate,
                              [s for _, _, s in todo], on_result)
        for r in recs:
            r.setdefault("reused", False)
        return recs

    def walk(self, sens):
        """Run the strategy once per ``--quant-method`` (:mod:`variants.search.dims`; each
        walk has its own ``--max-candidates``, and a learned method's walk its own sensitivity
        table when there is one); returns every record in evaluation order (distinct
        candidates)."""
        order = []
        for method in self.opts.quant_methods:
            self.method = method
            if len(self.opts.quant_methods) > 1:
                self.log(f"search: quantizer {method}")
            order += self.walk_one(getattr(self, "method_sens", {}).get(method, sens))
        from variants.search.row_lowering import lower_unseen

        return order + lower_unseen(self, order)

    def walk_one(self, sens):
        """One strategy walk with ``self.method``."""
        from variants.search.dims import sanitise

        o = self.opts
        options = getattr(self, "options", list(o.bits))
        lookup = getattr(getattr(self, "costs", None), "lookup", set())
        ident = lambda m: candidate_id(m, getattr(self, "method", "rtn"))  # noqa: E731
        # a table's @unseen rows follow the table in the walk (lowered after it:
        # variants.search.row_lowering)
        walked = [p for p in self.layers if "@" not in p]
        follow = {p: p.split("@")[0] for p in self.layers if "@" in p}

        def full(m):
            return sanitise(dict(m, **{u: m[t] for u, t in follow.items()}), lookup)
        gen = getattr(strategies, o.strategy)(walked, options, sens, o.batch)
        seen, order, step = {}, [], 0
        try:
            maps = [full(m) for m in next(gen)]
            while True:
                new = [m for m in maps if ident(m) not in seen]
                room = o.max_candidates - len(order)
                capped = len(dict.fromkeys(ident(m) for m in new)) > room
                if capped:
                    keep = list(dict.fromkeys(ident(m) for m in new))[:room]
                    new = [m for m in new if ident(m) in keep]
                uniq = list({ident(m): m for m in new}.values())
                step += bool(uniq)  # a step of only known maps evaluates nothing
                for r in self.evaluate_batch(uniq, step):
                    seen[r["id"]] = r
                    order.append(r)
                if capped:
                    self.log(f"--max-candidates {o.max_candidates} reached; stopping the search")
                    break
                passed = [seen[ident(m)]["passed"] if ident(m) in seen else False
                          for m in maps]
                maps = [full(m) for m in gen.send(passed)]
        except StopIteration:
            pass
        return order


def _contract_digest(path):
    """sha256 of the contract file (None: the packaged default): an edited contract is another
    search."""
    if path is None:
        return None
    from contracts.contract import PACKAGED

    if path in PACKAGED:  # a packaged contract by name (--contract strict)
        import hashlib
        from importlib import resources

        text = resources.files("contracts").joinpath(f"{path}.toml").read_bytes()
        return hashlib.sha256(text).hexdigest()
    from runs.io import file_sha256

    return file_sha256(Path(path))


def _num(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)

"""The search driver: validate, load, measure sensitivity, walk a strategy, judge every
candidate on the search split, then judge the finalists on the real calibration + eval splits
through the sweep (their folders and reports are a sweep's), and write search.json / .md / .png.

Bad input (a flag out of range, a budget below the cheapest candidate, an --out holding a
search with other settings) raises ValueError with one line before anything is written. A
contract no candidate passes is a result: :attr:`SearchResult.found` is False and the outcome
names the closest candidate and the clause that blocks it.
"""

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from variants import defaults as D
from variants.search import costs as costs_mod
from variants.search import strategies
from variants.search.store import Store, candidate_id

FAMILIES = ("quant", "lowrank", "prune", "exit")  # beyond quant: --strategy optuna only
MAX_CANDIDATES = 10_000
MAX_SEED = 2**32 - 1
N_FINALISTS = 3


@dataclass
class SearchOptions:
    """One field per ``variants search`` flag."""

    contract: str | None = None
    cost: str = "bytes"
    strategy: str = "bisect"  # few candidates: log2 of the threshold maps (greedy: one per raise)
    families: tuple = ("quant",)
    seed: int = D.SEED
    max_candidates: int = 60
    budget: float | None = None
    bits: tuple = D.SEARCH_BITS
    group_size: int = D.GROUP_SIZE
    #: quantizers searched, one global choice per candidate (variants.search.dims)
    quant_methods: tuple = ("rtn",)
    #: Linears may also run as W8A8 on integer GEMMs (variants.search.dims)
    w8a8: bool = False
    #: the embedding tables are units of the search (quantized embeddings); the head only when
    #: asked (variants.search.units)
    quantize_embeddings: bool = True
    quantize_head: bool = False
    batch: int = 1
    chunk_size: int = 50
    stop: bool = True
    #: "bound": a clause passes on the search split only when its interval clears the threshold
    #: (variants.search.bounds); "value": the point value
    select: str = "bound"
    search_margin: float = 0.3  # max clauses: headroom a sample max needs (variants.search.margin)
    n_search: int | None = None  # None: from the data (variants.search.sizes)
    n_sensitivity: int = D.N_SENSITIVITY
    n_fit: int | None = None  # None: D.N_FIT on the bundled data, else from the data
    n_calibration: int = D.N_CALIBRATION
    n_eval: int = D.N_EVAL
    model: str | None = None
    model_config: str | None = None
    checkpoint: str | None = None
    data: str | None = None
    max_length: int | None = D.MAX_LENGTH
    results_dir: str = D.RESULTS_DIR
    out: str | None = None
    executor: str = "local"
    workers: int = 1
    ray_address: str | None = None
    # the finalists are timed as sweep variants, with the sweep's defaults
    timing_rounds: int = D.TIMING_ROUNDS
    timing_warmup: int = D.TIMING_WARMUP
    timing_budget_s: float = D.TIMING_BUDGET_S
    timing_batch_sizes: tuple = D.TIMING_BATCH_SIZES
    cold_start: str = D.COLD_START
    finalize: bool = True
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self, log=None):
        """Raise ValueError (one line naming the flag and the fix) for a value out of range.
        Split sizes left None are chosen here (:func:`variants.search.sizes.resolve`, which
        says so through ``log``)."""
        from variants.families.quant.family import BITS, check_bits
        from variants.search import sizes
        from variants.sweep.config import SweepConfig

        if self.n_fit is None or self.n_search is None:
            source = SweepConfig(model=self.model, model_config=self.model_config).resolve_model()
            sizes.resolve(self, source, log=log or (lambda m: None))

        if isinstance(self.out, str) and not self.out.strip():  # not the default folder
            raise ValueError("--out is empty; pass a folder")

        if self.cost not in costs_mod.COSTS:
            raise ValueError(f"--cost {self.cost!r} is unknown; choose one of "
                             f"{', '.join(costs_mod.COSTS)}")
        if self.strategy not in strategies.STRATEGIES:
            raise ValueError(f"--strategy {self.strategy!r} is unknown; choose one of "
                             f"{', '.join(strategies.STRATEGIES)}")
        self.families = tuple(dict.fromkeys(self.families))  # a repeated family is one
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ValueError(f"--families {' '.join(bad) or '(none)'}: the search covers "
                             f"{', '.join(FAMILIES)}; pass e.g. --families quant")
        from variants.search.composed import check_options

        check_options(self)
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed {self.seed} is out of range; pass 0 to {MAX_SEED}")
        if not 1 <= self.max_candidates <= MAX_CANDIDATES:
            raise ValueError(f"--max-candidates {self.max_candidates} is out of range; pass 1 "
                             f"to {MAX_CANDIDATES}")
        if self.budget is not None and not (math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"--budget {self.budget} must be a finite cost > 0 in the --cost's "
                             f"unit ({costs_mod.UNITS[self.cost]})")
        widths = sorted(set(self.bits))
        for b in widths:
            check_bits(b, self.group_size, prefix="--")
        if len(widths) < 2 and not (self.strategy == "optuna" and len(self.families) > 1):
            raise ValueError(f"--bits {' '.join(map(str, self.bits))}: give at least two widths "
                             f"to choose between, from {BITS}, e.g. --bits 4 6 8")
        self.bits = tuple(widths)
        from variants.families.quant.config import METHODS

        self.quant_methods = tuple(dict.fromkeys(self.quant_methods))
        bad = [m for m in self.quant_methods if m not in METHODS]
        if bad or not self.quant_methods:
            raise ValueError(f"--quant-method {' '.join(bad) or '(none)'}: not known; choose "
                             f"from {' '.join(METHODS)}")
        if self.strategy == "optuna" and (self.w8a8 or self.quant_methods != ("rtn",)):
            raise ValueError("--w8a8 and --quant-method other than rtn are searched by the "
                             "bisect and greedy strategies only; drop them or pass --strategy "
                             "bisect")
        for flag, v, lo in (("--batch", self.batch, 1), ("--chunk-size", self.chunk_size, 1),
                            ("--n-sensitivity", self.n_sensitivity, 10),
                            ("--n-search", self.n_search, 40)):  # two parts of 20 at least
            if v < lo:
                raise ValueError(f"{flag} {v} must be >= {lo}")
        from variants.search.bounds import SELECT

        if self.select not in SELECT:
            raise ValueError(f"--select {self.select!r} is unknown; choose one of "
                             f"{', '.join(SELECT)}")
        if not 0 <= self.search_margin < 1:
            raise ValueError(f"--search-margin {self.search_margin} must be in [0, 1), e.g. "
                             "0.25")
        if self.finalize:  # the finalists' sweep settings: now, not after the whole search
            from variants.sweep.config import SweepConfig

            SweepConfig(**dict(self.sweep_kwargs(), timing_rounds=self.timing_rounds,
                               timing_warmup=self.timing_warmup,
                               timing_budget_s=self.timing_budget_s,
                               cold_start=self.cold_start)).validate()
        return self

    def settings(self):
        """What must match to resume (search_settings.json)."""
        d = asdict(self)
        for k in ("out", "progress", "executor", "workers", "ray_address", "extra",
                  "timing_rounds", "timing_warmup",
                  "timing_budget_s", "timing_batch_sizes", "cold_start", "finalize"):
            d.pop(k)
        d["families"], d["bits"] = list(self.families), list(self.bits)
        d["quant_methods"] = list(self.quant_methods)
        for k, plain in (("quant_methods", ["rtn"]), ("w8a8", False)):
            if d[k] == plain:  # the folder of a search from before these dimensions resumes
                del d[k]
        if d["max_length"] is None:  # the tokenizer files' (searches from before the flag)
            del d["max_length"]
        return d

    def sweep_kwargs(self):
        return dict(model=self.model, model_config=self.model_config, checkpoint=self.checkpoint,
                    data=self.data, max_length=self.max_length, family="quant",
                    contract=self.contract,
                    results_dir=self.results_dir,
                    n_fit=D.N_FIT if self.n_fit is None else self.n_fit,  # None: not validated
                    n_calibration=self.n_calibration, n_eval=self.n_eval, seed=self.seed,
                    progress=False, timing_batch_sizes=tuple(self.timing_batch_sizes),
                    params={"bits": [self.bits[0]], "group_size": self.group_size,
                            "quantize_embeddings": self.quantize_embeddings,
                            "quantize_head": self.quantize_head})

    def quant_config(self, default_bits, bits_map, method="rtn", int8=""):
        """The QuantConfig of a candidate (its map as ``--bits`` + ``--bits-map``, its
        quantizer as ``--quant-method``, its W8A8 Linears as ``--int8-layers``)."""
        from variants.families.quant.family import QuantConfig

        return QuantConfig(bits=default_bits, group_size=self.group_size, bits_map=bits_map,
                           quantize_embeddings=self.quantize_embeddings,
                           quantize_head=self.quantize_head, method=method, int8=int8)

    def out_dir(self, model):
        return Path(self.out) if self.out else \
            Path(self.results_dir) / "search" / f"{model}-{self.cost}-{self.strategy}"


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

    counts = Counter(b for b in layer_bits.values() if b != costs_mod.INT8)
    default = min(counts, key=lambda b: (-counts[b], b)) if counts else 8
    entries = [f"^{re.escape(p)}$={b}" for p, b in layer_bits.items()
               if b != default and b != costs_mod.INT8]
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
                        "quantize_head": o.quantize_head}
        self.state = worker.load(self.payload)
        cfg = self.state["cfg"]
        alpha = self.state["settings"]["alpha"]  # the search-calibration half gives the ε too
        need = math.ceil(1.0 / alpha) - 1
        if o.n_search // 2 < need:
            raise ValueError(f"--n-search {o.n_search} gives {o.n_search // 2} search-calibration "
                             f"rows, but the contract's alpha={alpha} needs at least {need} for "
                             f"the split-conformal ε; raise --n-search to {2 * need} or more")
        model = self.state["source"].build(self.state["checkpoint"])
        module = model.module
        self.units = search_units(module, model, group_size=o.group_size,
                                  # composed (optuna) candidates quantize encoder Linears only
                                  embeddings=o.quantize_embeddings and o.strategy != "optuna",
                                  quantize_head=o.quantize_head)
        self.layers = self.units.paths
        from variants.search import dims

        self.costs = costs_mod.CostTable(module, self.layers, list(o.bits) +
                                         ([costs_mod.INT8] if o.w8a8 else []), o.group_size)
        self.out = o.out_dir(cfg.model)
        self.store = Store(self.out)
        self.settings = dict(o.settings(), model=cfg.model, inputs=cfg.inputs_identity,
                             contract_sha256=_contract_digest(o.contract))
        self.store.check_settings(self.settings)
        if o.cost.startswith("latency"):
            self.latency_path = self.costs.load_latency(
                o.cost, list(o.bits) + ([costs_mod.INT8] if o.w8a8 else []),
                Path(o.results_dir) / ".cache")
        self.options = dims.options(self.costs, o.cost, o.bits, o.w8a8,
                                    [p for p in self.layers if p not in self.costs.lookup])
        self.method = o.quant_methods[0]
        dropped = [b for b in o.bits if b not in self.options]
        if dropped:
            self.log(f"search: --bits {' '.join(map(str, dropped))} dropped: under --cost "
                     f"{o.cost} a more accurate option costs no more "
                     f"(options {self.options}, cheapest first)")
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
        return dict(self.payload, sweep=sweep)

    def sensitivity(self):
        from variants.search import sensitivity

        cal = self.state["parts"]["search-calibration"]
        sub = cal.subset(list(range(min(self.opts.n_sensitivity, len(cal)))))
        frame, path, cached = sensitivity.cached_measure(
            self.state["reference"], sub, Path(self.opts.results_dir) / ".cache",
            bits=self.opts.bits, group_size=self.opts.group_size, log=self.log,
            paths=self.layers)
        self.sens_path = path
        sens = {(r.layer, int(r.bits)): float(r.kl_mean) for r in frame.itertuples()}
        if self.opts.w8a8:
            from variants.search.dims import int8_sensitivity

            linears = [p for p in self.layers if p not in self.costs.lookup]
            sens.update(int8_sensitivity(self.state["reference"], sub, linears,
                                         Path(self.opts.results_dir) / ".cache"))
            for p in self.costs.lookup:  # becomes 8 bits (variants.search.dims.sanitise)
                sens[p, costs_mod.INT8] = sens[p, max(self.opts.bits)]
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
            "stopped": stopped, "tightest": tid, "slack": sl,
            "clauses": {r.id: {"value": _num(r.value), "compared": _num(r.compared_value),
                               "op": r.op, "threshold": r.threshold, "status": r.status,
                               "ci": [_num(r.ci_low), _num(r.ci_high)], "compare": r.compare}
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

        def on_result(j, spec, res):
            i, config, _ = todo[j]
            r = recs[i] = self.record(config, spec, res, step)
            if "error" not in r:
                self.store.put(r)
            self.log(f"  [{step}] {r['name']}: {what(r)}, {'PASS' if r['passed'] else 'FAIL'}"
                     + (f" ({', '.join(r['failed'])})" if r["failed"] else "")
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
        walk has its own ``--max-candidates``); returns every record in evaluation order
        (distinct candidates)."""
        order = []
        for method in self.opts.quant_methods:
            self.method = method
            if len(self.opts.quant_methods) > 1:
                self.log(f"search: quantizer {method}")
            order += self.walk_one(sens)
        return order

    def walk_one(self, sens):
        """One strategy walk with ``self.method``."""
        from variants.search.dims import sanitise

        o = self.opts
        options = getattr(self, "options", list(o.bits))
        lookup = getattr(getattr(self, "costs", None), "lookup", set())
        ident = lambda m: candidate_id(m, getattr(self, "method", "rtn"))  # noqa: E731
        gen = getattr(strategies, o.strategy)(self.layers, options, sens, o.batch)
        seen, order, step = {}, [], 0
        try:
            maps = [sanitise(m, lookup) for m in next(gen)]
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
                maps = [sanitise(m, lookup) for m in gen.send(passed)]
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

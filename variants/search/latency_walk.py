"""``--strategy latency`` (the default of ``--cost latency-b1`` / ``latency-b32``): the fastest
composed variant that passes, walked by a latency model measured on this machine.

The space: what the encoder Linears run as (W8A8 plain or with SmoothQuant; fp32 when neither
passes), the embedding tables at 8 bits or fp32, token pruning after layer a at keep ratio ρ
(a in :func:`prune_grid`, ρ in :data:`KEEP_RATIOS`), early exit on the entropy rule at a
calibration agreement target (:data:`EXIT_TARGETS`), each piece in or out
(:mod:`variants.families.composed`). Every candidate's cost is its predicted time in ms
(:mod:`variants.search.latency_model`: the reference's forward at the cost's batch size over
the predicted speed-up; after it is built, with its realised pruning work and exit depth).

The walk, piece by piece (every candidate judged on the search split, as every search judges):

1. **Linears**: the bases (W8A8, W8A8 with SmoothQuant; each with and without 8-bit
   embeddings at group 64, at group 32) in order of predicted time, then bytes; the first that
   passes is the base.
   None passing: the base is the fp32 reference, and pieces are added to it.
2. **Pruning**, then **early exit**, each on the base: settings from the mildest (least
   predicted gain) up; a setting at least as aggressive as one that failed (pruning no later
   and keeping no more; an exit target no higher) is not tried (assumed to fail too: recorded as
   skipped, never as a verdict); the most aggressive passing setting is the piece's.
3. **Both** (when each passed alone): the base with the two pieces' settings.

The passing candidates, fastest predicted first, go to the finalists' sweep together (up to
:data:`variants.search.driver.N_FINALISTS`): each is built, judged on the calibration and eval
splits and timed in strict alternation with the reference, as a sweep does; the winner is the
one that passes on eval with the highest *measured* speed-up at the cost's batch size (ties:
fewer bytes), its predicted speed-up beside it.
"""

from variants.families.composed.recipe import composed_id, name_of, recipe_of
from variants.search import latency_model
from variants.search.optuna_search import OptunaSearch

KEEP_RATIOS = (0.9, 0.7, 0.5)
EXIT_TARGETS = (0.999, 0.995, 0.99)
BASES = ({"w8a8": {"smooth": False}}, {"w8a8": {"smooth": True}})
EMBS = ({"embeddings": {"bits": 8}}, {"embeddings": {"bits": 8, "group_size": 32}}, {})


def prune_grid(n_layers):
    """The pruning layers tried: the middle layer and the one before the last (for N >= 3),
    and layer 1 (for N >= 4)."""
    return sorted({a for a in (n_layers - 2, n_layers // 2, 1) if 1 <= a < n_layers},
                  reverse=True)


def more_aggressive(piece, a, b):
    """Whether setting ``a`` of ``piece`` is at least as aggressive as ``b`` (module
    docstring)."""
    if piece == "prune":
        return a["after_layer"] <= b["after_layer"] and a["keep_ratio"] <= b["keep_ratio"]
    return a["target"] <= b["target"]


class LatencySearch(OptunaSearch):
    """:class:`variants.search.optuna_search.OptunaSearch`'s composed candidates, walked by
    predicted latency (module docstring)."""

    def finalizable(self, rec):
        return True

    def prepare(self):
        """:meth:`Search.prepare`; the embedding tables are the walk's ``emb`` piece, not units."""
        super().prepare()
        self.units.kept = [(p, "embedding tables: the walk's emb piece (8-bit at group 64 or "
                               "32, or fp32), one choice for all tables" if "embeddings" in p
                            else why) for p, why in self.units.kept]

    def model(self):
        """The latency model (measured or read from the cache) of the cost's batch size."""
        if getattr(self, "_model", None) is None:
            import hashlib
            import json
            from pathlib import Path

            from variants.arch import compute_path

            o = self.opts
            batch = int(o.cost.split("-b")[1])
            cfg = self.state["cfg"]
            key = hashlib.sha1(json.dumps([cfg.model, cfg.inputs_identity,
                                           compute_path.key_part()], default=str,
                                          sort_keys=True).encode()).hexdigest()[:12]
            texts = self.state["parts"]["search-eval"].texts
            self._model, self.latency_path = latency_model.load(
                self.state["reference"], texts, batch, Path(o.results_dir) / ".cache", key)
        return self._model

    def _linear_table(self):
        """The cost table over every encoder Linear W8A8 converts (indivisible widths too):
        bits per weight count them all."""
        if getattr(self, "linear_table", None) is None:
            from variants.arch.activations import target_linears
            from variants.search.costs import CostTable

            module = self.state["reference"].module
            self.linear_table = CostTable(module, target_linears(module), (),
                                          self.opts.group_size)
        return self.linear_table

    def _base(self, config, spec, step):
        from variants.search import composed

        m = self.model()
        summ = self._build
        speed = latency_model.predict(m, config, summ)
        if summ:
            cost = composed.costs(self._linear_table(), summ)
        else:
            cost = dict.fromkeys(("bytes", "bits", "flops"), float("nan"))
        return {"id": spec["id"], "step": step, "name": name_of(config), "config": config,
                "recipe": recipe_of(config), "families": sorted(config), "layer_bits": {},
                "default_bits": None, "bits_map": "",
                "cost": m["forward_ms"] / speed, "cost_name": self.opts.cost,
                "predicted_speedup": speed,
                "bits_per_weight": cost["bits"],
                "model_bytes": int(cost["bytes"]) if cost["bytes"] == cost["bytes"] else 0,
                "flops": cost["flops"], **({"build": summ} if summ else {})}

    def evaluate_configs(self, configs, step):
        """:meth:`OptunaSearch.evaluate_configs`, with ``--budget``: a candidate whose
        predicted time is over it is recorded as failing (``over --budget``), not built."""
        budget = self.opts.budget
        if budget is None:
            return super().evaluate_configs(configs, step)
        m = self.model()
        over = {recipe_of(c) for c in configs
                if m["forward_ms"] / latency_model.predict(m, c) > budget}
        todo = [c for c in configs if recipe_of(c) not in over]
        got = iter(super().evaluate_configs(todo, step) if todo else [])
        out = []
        for c in configs:
            if recipe_of(c) not in over:
                out.append(next(got))
                continue
            self._build = None
            r = self._base(c, self.spec(c), step) | {
                "passed": False, "failed": ["over --budget"], "stopped": False,
                "tightest": None, "slack": None, "clauses": {}, "n_used": 0,
                "n_total": len(self.state["parts"]["search-eval"]), "wall_s": 0.0,
                "saved_s": 0.0, "evaluated": False, "reused": False}
            self.log(f"  [{step}] {r['name']}: predicted {r['cost']:.4g} ms, over --budget "
                     f"{budget:g}")
            out.append(r)
        return out

    def spec(self, config):
        return {"id": composed_id(config), "config": config, "stop": bool(self.opts.stop)}

    def _order(self, configs):
        m = self.model()
        # equal predicted time: the smaller first (8-bit tables at group 64, at 32, fp32)
        return sorted(configs, key=lambda c: (-latency_model.predict(m, c), -len(c),
                                              c.get("embeddings", {}).get("group_size", 64) * -1,
                                              recipe_of(c)))

    def _try(self, configs, step):
        """Evaluate ``configs`` (in order, ``--batch`` at a time) until one passes; returns
        (the passing record or None, records)."""
        recs = []
        for i in range(0, len(configs), self.opts.batch):
            got = self.evaluate_configs(configs[i:i + self.opts.batch], step)
            recs += got
            ok = [r for r in got if r["passed"]]
            if ok:
                return ok[0], recs
        return None, recs

    def _piece(self, base, piece, settings, step):
        """Settings of ``piece`` on ``base``, mildest first; (best passing setting or None,
        records)."""
        m = self.model()
        settings = sorted(settings, key=lambda s: latency_model.predict(m, {**base, piece: s}))
        failed, best, recs = [], None, []
        for s in settings:
            if len(self._records) + len(recs) >= self.opts.max_candidates:
                break
            if any(more_aggressive(piece, s, f) for f in failed):
                self.log(f"  [{step}] {name_of({**base, piece: s})}: skipped (at least as "
                         f"aggressive as a failed {piece} setting)")
                continue
            r = self.evaluate_configs([{**base, piece: s}], step)[0]
            recs.append(r)
            if r["passed"]:
                best = s
            else:
                failed.append(s)
        return best, recs

    def walk(self, sens=None):
        """The walk (module docstring); every distinct record in evaluation order."""
        m = self.model()
        self.log(f"search: latency model at B={m['batch_size']} (L={m['seq_len']}): reference "
                 f"forward {m['forward_ms']:.2f} ms, encoder GEMMs fp32 {m['gemm_fp32_ms']:.2f} "
                 f"ms, W8A8 {m['gemm_int8_ms']:.2f} ms ({self.latency_path})")
        self._records = []
        bases = self._order([{**b, **e} for b in BASES for e in EMBS])
        found, recs = self._try(bases, 1)
        self._records += recs
        base = dict(found["config"]) if found else {}
        n = m["n_layers"]
        best = {}
        pieces = (("prune", [{"after_layer": a, "keep_ratio": r} for a in prune_grid(n)
                             for r in KEEP_RATIOS]),
                  ("exit", [{"rule": "entropy", "target": t} for t in EXIT_TARGETS]))
        for step, (piece, settings) in enumerate(pieces, start=2):
            s, recs = self._piece(base, piece, settings, step)
            self._records += recs
            if s is not None:
                best[piece] = s
        if len(best) == 2 and len(self._records) < self.opts.max_candidates:
            self._records += self.evaluate_configs([{**base, **best}], 4)
        return self._records

    def finalize(self, passing, n):
        """Finalists (the passing candidates, fastest predicted first, up to ``n``) judged and
        timed together in one sweep; the winner the eval-passing one measured fastest."""
        from variants.search.finalize import finalize_together

        return finalize_together(self, passing[:n])

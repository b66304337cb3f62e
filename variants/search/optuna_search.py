"""``--strategy optuna``: an Optuna study (TPE, seeded by ``--seed``) over the composed
cross-family space of ``--families`` (:mod:`variants.search.composed`), minimising the
``--cost`` subject to passing the contract on the search split.

The space (each family's dimension; the first family of ``--families`` in the order quant,
lowrank, prune, exit is always on, the others may be "off"):

- quant: one uniform width from ``--bits`` (group ``--group-size``);
- lowrank: parameter ratio in :data:`LOWRANK_RATIOS`, method whitened (SVD-LLM) or plain;
- prune: keep ratio in :data:`KEEP_RATIOS` after encoder layer 1 .. N-1;
- exit: calibration agreement target in :data:`EXIT_TARGETS`, rule entropy or margin.

Each trial's value is the candidate's cost; its constraint (Optuna 5's
``Trial.set_constraint``, which TPE reads; <= 0 feasible) is 0 when it passes, else the
distance to passing: minus the slack of the contract's tightest failing clause (the settled
clauses' bound when sequential stopping cut it short; 1.0 when no clause has a number; a candidate over ``--budget`` adds its excess share).
Trials run in sequence (``--batch k``: ``k`` trials asked at once, evaluated together through
the executor, then told), so a study is deterministic given the seed. A config proposed again is
told its stored result without evaluating. Resume: a fresh study with the same seed is told
the stored records of the same configs in the same order, so it retraces the interrupted path
and goes on from its end. Stops after ``--max-candidates`` distinct candidates, after
:data:`TRIALS_PER_CANDIDATE` x that many trials, or after :data:`STALE_TRIALS` trials in a row
that propose nothing new (a small space exhausted).
"""

from variants.search.composed import (FAMILIES, check_options, composed_id,  # noqa: F401
                                      name_of, require_optuna)
from variants.search.driver import Search

LOWRANK_RATIOS = (0.9, 0.7, 0.5, 0.3)
LOWRANK_METHODS = ("whitened", "plain")
KEEP_RATIOS = (0.9, 0.7, 0.5, 0.3)
EXIT_TARGETS = (0.999, 0.99, 0.97, 0.95)
EXIT_RULES = ("entropy", "margin")
TRIALS_PER_CANDIDATE = 4
STALE_TRIALS = 20  # trials in a row proposing only known configs: the space is exhausted
OFF = "off"


def suggest(trial, families, bits, n_layers):
    """A composed config from an Optuna ``trial`` (module docstring); only valid configs."""
    fams = [f for f in FAMILIES if f in families]
    config = {}
    for f in fams:
        first = f == fams[0]
        if f == "quant":
            b = trial.suggest_categorical("quant_bits", [*bits] + ([] if first else [OFF]))
            if b != OFF:
                config["quant"] = {"bits": int(b)}
        elif f == "lowrank":
            r = trial.suggest_categorical("lowrank_ratio", [*LOWRANK_RATIOS]
                                          + ([] if first else [OFF]))
            if r != OFF:
                config["lowrank"] = {"ratio": float(r), "method": trial.suggest_categorical(
                    "lowrank_method", list(LOWRANK_METHODS))}
        elif f == "prune":
            k = trial.suggest_categorical("prune_keep", [*KEEP_RATIOS] + ([] if first else [OFF]))
            if k != OFF:
                config["prune"] = {"keep_ratio": float(k), "after_layer": trial.suggest_int(
                    "prune_after", 1, n_layers - 1)}
        elif f == "exit":
            t = trial.suggest_categorical("exit_target", [*EXIT_TARGETS]
                                          + ([] if first else [OFF]))
            if t != OFF:
                config["exit"] = {"target": float(t), "rule": trial.suggest_categorical(
                    "exit_rule", list(EXIT_RULES))}
    return config


def constraint_of(rec, budget=None):
    """The trial's constraint value (module docstring): <= 0 feasible."""
    if rec["passed"]:
        c = 0.0
    else:
        c = 1.0 if rec.get("slack") is None else max(-float(rec["slack"]), 1e-9)
    if budget is not None and rec["cost"] > budget:
        c += rec["cost"] / budget - 1.0
    return c


class OptunaSearch(Search):
    """:class:`variants.search.driver.Search` with composed candidates and an Optuna walk."""

    _build = None

    def sensitivity(self):
        """Not used by the study: no per-layer table is measured."""
        self.sens_path = None
        return {}

    def finalizable(self, rec):
        """The sweep builds quant configs only: a composed winner is not judged on eval."""
        return set(rec["config"]) == {"quant"}

    def spec(self, config):
        return {"id": composed_id(config), "config": config, "stop": bool(self.opts.stop)}

    def _base(self, config, spec, step):
        from variants.search import composed

        o, c = self.opts, self.costs
        quant_only = set(config) == {"quant"}
        if quant_only:
            lb = {p: config["quant"]["bits"] for p in self.layers}
            cost = {"bytes": float(c.model_bytes(lb)), "bits": c.bits_per_weight(lb),
                    "flops": c.flops(lb)}
            if o.cost.startswith("latency"):
                cost[o.cost] = c.of(o.cost, lb)
        else:
            lb = {}
            cost = (composed.costs(c, self._build) if self._build else  # a lost worker: unbuilt
                    dict.fromkeys(("bytes", "bits", "flops", o.cost), float("nan")))
        name = name_of(config)
        if quant_only:  # the sweep's variant folder name (finalize reads it)
            from variants.families.quant.family import QuantConfig

            name = QuantConfig(bits=config["quant"]["bits"], group_size=o.group_size).name
        return {"id": spec["id"], "step": step, "name": name, "config": config,
                "families": sorted(config), "layer_bits": lb,
                "default_bits": config.get("quant", {}).get("bits"), "bits_map": "",
                "cost": cost[o.cost], "cost_name": o.cost, "bits_per_weight": cost["bits"],
                "model_bytes": int(cost["bytes"]) if cost["bytes"] == cost["bytes"] else 0,
                "flops": cost["flops"],
                **({"build": self._build} if self._build else {})}

    def record(self, config, spec, res, step):
        self._build = res.get("build")
        return super().record(config, spec, res, step)

    def evaluate_configs(self, configs, step):
        """Records of ``configs`` (distinct), from the store or evaluated now (one batch through
        the executor)."""
        recs, todo = [None] * len(configs), []
        for i, cfg in enumerate(configs):
            spec = self.spec(cfg)
            old = self.store.get(spec["id"])
            if old is not None:
                recs[i] = dict(old, reused=True)
            else:
                todo.append((i, cfg, spec))

        return self.evaluate_todo(todo, recs, step,
                                  lambda r: f"{self.opts.cost} {r['cost']:.6g}")

    def walk(self, sens=None):
        """Run the study; returns every distinct record in evaluation order."""
        optuna = require_optuna()
        o = self.opts
        n_layers = len(self.state["reference"].module.encoder.layers)
        sampler = optuna.samplers.TPESampler(
            seed=o.seed, n_startup_trials=max(3, min(10, o.max_candidates // 3)))
        study = optuna.create_study(direction="minimize", sampler=sampler)
        seen, order, step, trials, stale = {}, [], 0, 0, 0
        while (len(order) < o.max_candidates and stale < STALE_TRIALS
               and trials < TRIALS_PER_CANDIDATE * o.max_candidates):
            asked = [study.ask() for _ in range(o.batch)]
            trials += len(asked)
            configs = [suggest(t, o.families, o.bits, n_layers) for t in asked]
            new = list({composed_id(c): c for c in configs
                        if composed_id(c) not in seen}.values())
            new = new[:o.max_candidates - len(order)]
            step += bool(new)
            stale = 0 if new else stale + len(asked)
            for r in (self.evaluate_configs(new, step) if new else []):
                seen[r["id"]] = r
                order.append(r)
            for t, c in zip(asked, configs):
                r = seen.get(composed_id(c))
                if r is None:  # cut by --max-candidates
                    study.tell(t, state=optuna.trial.TrialState.FAIL)
                    continue
                t.set_constraint("contract", constraint_of(r, o.budget))
                study.tell(t, r["cost"])
        if len(order) >= o.max_candidates:
            self.log(f"--max-candidates {o.max_candidates} reached; stopping the search")
        return order

"""How often the null control passes the search's bound rule: resample its saved rows.

The null control (``variants sweep --family exact --exact-kinds null-control``) is the reference
recomputed on a second compute path: no approximation at all. Under the search's default rule
(every interval-bearing clause judged on its bound, :mod:`variants.search.bounds`) on splits of
the search's default size, it should pass almost always; issue #38 asks for >= 0.99. This
script draws ``--reps`` bootstrap copies of a null-control run's calibration and eval rows (same
sizes as the run's: the default sweep's 800 + 800, the search's default split sizes), judges
each with the default contract under the bound rule, and prints the pass rate and the clauses
that failed or were undecided — once as the search judges (conformal coverage on its value,
:data:`variants.search.bounds.VALUE_ONLY`) and once with every interval-bearing clause on its
bound (the rule before issue #38).

    python -m variants sweep --family exact --exact-kinds null-control
    python bench/null_control.py results/minilm-sentiment-exact-null-control --reps 400

Seeded (``--seed``); the figures depend only on the saved rows and the seed. No MLX.
"""

import argparse
import time
from dataclasses import replace

import numpy as np


def _load(path):
    with np.load(path, allow_pickle=False) as d:
        return {k: d[k] for k in d.files}


def _take(d, rows):
    n = len(d["ids"])
    return {k: (v[rows] if getattr(v, "ndim", 0) and len(v) == n else v) for k, v in d.items()}


def pass_rates(run, *, reps=400, seed=0, contract=None, rules=("search", "every-bound"),
               refit_boot=None, n_bootstrap=None):
    """``{rule: (passes, reps, {clause id: times not passed})}`` for each of ``rules``
    ("search", "every-bound") over ``reps`` resamples of the null-control run folder ``run``;
    ``refit_boot`` resamples of the temperature refit's bound (None: the search's
    :data:`variants.search.bounds.N_REFIT_BOOTSTRAP`, 200) and ``n_bootstrap`` resamples behind
    every other interval (None: the contract's, 1000)."""
    from contracts.checker import load_contract
    from runs.judge import judge_outputs
    from runs.settings import resolve_settings
    from variants.search import bounds

    rc, re_ = (_load(f"{run}/reference/{f}.npz") for f in ("calibration_outputs", "outputs"))
    vc, ve = (_load(f"{run}/null-control/{f}.npz") for f in ("calibration_outputs", "outputs"))
    base = load_contract(contract)
    search = bounds.bounded(base)
    every = replace(base, clauses=tuple(
        replace(c, compare="ci") if c.statistic != "count"
        and (bounds.spec(c.metric).interval is not None or c.metric in bounds.RESAMPLED) else c
        for c in base.clauses))
    rules = {k: v for k, v in {"search": search, "every-bound": every}.items() if k in rules}
    st = resolve_settings(search, n_bootstrap=n_bootstrap)
    rng = np.random.default_rng(seed)
    out = {k: [0, 0, {}] for k in rules}
    for _ in range(reps):
        ic = rng.integers(0, len(rc["ids"]), len(rc["ids"]))
        ie = rng.integers(0, len(re_["ids"]), len(re_["ids"]))
        args = (_take(rc, ic), _take(re_, ie), _take(vc, ic), _take(ve, ie))
        for name, c in rules.items():
            ev, v, _ = judge_outputs(*args, c, settings=st)
            v = bounds.complete_bounds(ev, v, n_boot=refit_boot or bounds.N_REFIT_BOOTSTRAP)
            o = out[name]
            o[0] += bool(v.passed)
            o[1] += 1
            for x in v.failed + v.undecided:
                o[2][x] = o[2].get(x, 0) + 1
    return {k: tuple(v) for k, v in out.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a null-control sweep's run folder")
    p.add_argument("--reps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--contract", default=None)
    a = p.parse_args(argv)
    t = time.perf_counter()
    res = pass_rates(a.run, reps=a.reps, seed=a.seed, contract=a.contract)
    print("| rule | passes | pass rate | not passed by clause |\n|---|---|---|---|")
    for name, (ok, n, by) in res.items():
        print(f"| {name} | {ok}/{n} | {ok / n:.4f} | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(by.items())) or '—'} |")
    print(f"\n{a.reps} resamples of {a.run}, seed {a.seed}, {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()

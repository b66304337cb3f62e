"""Wall time of independent units on the local, process and Ray executors, 1 vs 2 workers.

A unit is a realistic stand-in for one search candidate's evaluation: ``--batches`` batches of
64 texts (chosen by the unit's seed from a fixed pool) through the bundled MiniLM encoder, mean
pooled. Each worker's ``init`` loads the checkpoint itself (as ``variants search`` workers load
the checkpoint and cached reference outputs). Every configuration computes the same numbers
(checked: the pooled sums per unit must agree exactly).

Reported per configuration: wall time of ``run`` for ``--units`` units (workers' start and init
included), the time to the first result, and for Ray the ``ray.init`` start-up on its own
(timed before the run; the executor then uses that Ray). ``streams=1`` rows run each worker on
one MLX stream instead of the driver's two (process workers then keep OpenBLAS's default thread
count; Ray workers get one OpenBLAS thread, as Ray sets ``OMP_NUM_THREADS=1``). Their numbers
differ in the last bits (``max_abs_diff_vs_matched``: largest difference of a unit's pooled sum),
which is why the executors always give workers the driver's stream count.

Measured on the shared 2-core box (load average 10-13 from other work), 8 units x 2 batches,
2 alternated rounds, median wall s: local 25.7; process x1 32.0, x2 39.3; ray x1 28.2 (+ ray.init
12.4), x2 32.2 (+ 16.4); one stream per worker: process x2 51.1, ray x2 32.1. No speed-up from a
second worker here: one process already uses both cores (two MLX streams).

    PYTHONPATH=$PWD python bench/executors.py --rounds 2
"""

import argparse
import json
import time

import variants  # noqa: F401  (preloads OpenBLAS before mlx)
import numpy as np

from variants.executors import factory as executor_factory
from variants.executors import local as ex

WORDS = ("good bad movie plot actor great terrible boring fun slow dark bright story music "
         "scene ending long short best worst funny sad loved hated").split()


def init(n_pool):
    """Load the bundled MiniLM and a fixed pool of ``n_pool`` texts (seeded)."""
    import time as _t

    t = _t.perf_counter()
    from variants.checkpoints.load import load_checkpoint

    ck = load_checkpoint()
    rng = np.random.default_rng(0)
    pool = [" ".join(rng.choice(WORDS, size=rng.integers(8, 40))) for _ in range(n_pool)]
    return {"ck": ck, "pool": pool, "init_s": _t.perf_counter() - t}


def unit(state, spec):
    """``spec["batches"]`` forward passes of 64 texts picked by ``spec["seed"]``; returns the
    per-batch sums of the mean-pooled embeddings (float64) and the unit's compute time."""
    import mlx.core as mx

    from variants.arch.encoder import mean_pool

    t = time.perf_counter()
    ck, pool = state["ck"], state["pool"]
    rng = np.random.default_rng(spec["seed"])
    sums = []
    for _ in range(spec["batches"]):
        texts = [pool[i] for i in rng.choice(len(pool), size=64, replace=False)]
        ids, mask, types = ck.tokenizer.batch(ck.tokenizer.encode(texts)[0])
        out = ck.encoder(mx.array(ids), mx.array(mask), mx.array(types))
        emb = mean_pool(out.last_hidden, mx.array(mask))
        sums.append(float(np.asarray(emb, dtype=np.float64).sum()))
    return {"sums": sums, "compute_s": time.perf_counter() - t, "init_s": state["init_s"]}


def measure(kind, workers, units, batches, streams=None):
    specs = [{"seed": 1000 + i, "batches": batches} for i in range(units)]
    got, first = {}, []
    ray_init_s = None
    if kind == "ray":
        import ray

        from variants.executors.ray import driver_path_env

        t = time.perf_counter()
        with driver_path_env():
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        ray_init_s = time.perf_counter() - t
    saved = ex.driver_streams
    if streams is not None:
        ex.driver_streams = lambda: streams
    try:
        exe = executor_factory.make_executor(kind, workers=workers)
        t = time.perf_counter()

        def on_result(i, spec, result):
            first.append(time.perf_counter() - t)
            got[i] = result

        exe.run(init, (512,), unit, specs, on_result)
        wall = time.perf_counter() - t
    finally:
        ex.driver_streams = saved
        if kind == "ray":
            ray.shutdown()
    return {"kind": kind, "workers": workers, "streams": streams or ex.driver_streams(),
            "wall_s": round(wall, 2),
            "first_result_s": round(first[0], 2), "ray_init_s": ray_init_s and round(ray_init_s, 2),
            "unit_compute_s_mean": round(float(np.mean([r["compute_s"] for r in got.values()])), 3),
            "worker_init_s_mean": round(float(np.mean([r["init_s"] for r in got.values()])), 2),
            "sums": [got[i]["sums"] for i in range(units)]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--units", type=int, default=8)
    p.add_argument("--batches", type=int, default=8, help="batches of 64 texts per unit")
    p.add_argument("--rounds", type=int, default=2, help="alternated rounds (order reversed)")
    p.add_argument("--kinds", nargs="+", default=["local", "process", "ray"])
    p.add_argument("--json", help="write all rows here")
    a = p.parse_args()
    configs = [(k, w, None) for k in a.kinds for w in ((1,) if k == "local" else (1, 2))]
    configs += [(k, 2, 1) for k in a.kinds if k != "local"]
    rows, ref = [], None
    for r in range(a.rounds):
        for kind, workers, streams in (configs if r % 2 == 0 else configs[::-1]):
            row = measure(kind, workers, a.units, a.batches, streams)
            if streams is None:
                if ref is None:
                    ref = row["sums"]
                assert row["sums"] == ref, f"{kind} x{workers} computed other numbers"
            elif ref is not None:
                x, y = np.array(row["sums"]), np.array(ref)
                row["max_abs_diff_vs_matched"] = float(np.max(np.abs(x - y)))
            row.pop("sums")
            row["round"] = r
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\nmedian wall over rounds (s):")
    for kind, workers, streams in configs:
        streams = streams or ex.driver_streams()
        w = [x["wall_s"] for x in rows if (x["kind"], x["workers"], x["streams"]) ==
             (kind, workers, streams)]
        ri = [x["ray_init_s"] for x in rows if x["kind"] == kind == "ray" and
              (x["workers"], x["streams"]) == (workers, streams)]
        extra = f"  (+ ray.init {np.median(ri):.1f} s)" if ri else ""
        print(f"  {kind:8s} workers={workers} streams={streams} {np.median(w):6.1f}{extra}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

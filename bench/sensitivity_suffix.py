"""CPU seconds of one per-layer sensitivity row (one Linear at one width, the whole split) with the
suffix forward (layers i.. from the recorded input of layer i, variants/search/suffix.py) and
with the whole model, on a random-init ModernBERT-base-width checkpoint with ``--layers`` layers.

The folder: hidden 768, 12 heads, intermediate 1152, vocabulary 50,368, global attention every
3rd layer, weights N(0, 0.02), norms 1, the tiny fixture's tokenizer and config otherwise
(tests/fixtures/hf/modernbert), a ``classifier`` model TOML. Rows: the search's sensitivity rows
(``variants.search.sens_cache.load_rows``, ``--n-rows`` of them). Both states are prepared once
(the suffix one records every layer's input), then for each round, each layer's ``attn.Wqkv`` and
``mlp.Wi`` at 4 bits (g64) run under both, the order alternating round by round; CPU time from
``getrusage`` (all threads). Prints the median CPU seconds per row and unit, the two paths' rows
(equal to round-off) and the load average.

Run: ``python bench/sensitivity_suffix.py --layers 4 --n-rows 100 --rounds 3 --work /tmp/sfx``.
"""

import argparse
import json
import resource
import shutil
import time
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf" / "modernbert"
H, INTER, VOCAB = 768, 1152, 50368


def make_folder(folder, n_layers):
    """A random-init ModernBERT-base-width checkpoint folder with a sequence-classification head."""
    from safetensors.numpy import save_file

    cfg = json.loads((FIXTURE / "config.json").read_text())
    cfg.update(hidden_size=H, intermediate_size=INTER, num_attention_heads=12,
               num_hidden_layers=n_layers, vocab_size=VOCAB, global_attn_every_n_layers=3,
               layer_types=["full_attention" if i % 3 == 0 else "sliding_attention"
                            for i in range(n_layers)])
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    one = np.ones(H, np.float32)
    t = {"model.embeddings.tok_embeddings.weight": w(VOCAB, H),
         "model.embeddings.norm.weight": one, "model.final_norm.weight": one,
         "head.dense.weight": w(H, H), "head.norm.weight": one, "classifier.weight": w(3, H),
         "classifier.bias": np.zeros(3, np.float32)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        t.update({p + "attn.Wqkv.weight": w(3 * H, H), p + "attn.Wo.weight": w(H, H),
                  p + "mlp.Wi.weight": w(2 * INTER, H), p + "mlp.Wo.weight": w(H, INTER),
                  p + "mlp_norm.weight": one})
        if i:
            t[p + "attn_norm.weight"] = one
    folder.mkdir(parents=True, exist_ok=True)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE / f, folder / f)


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="encoder layers of the folder")
    ap.add_argument("--n-rows", type=int, default=100, help="sensitivity rows")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds (median)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/sensitivity-suffix"),
                    help="folder for the checkpoint, model TOML and results cache")
    a = ap.parse_args()

    from variants.search import sens_cache, sensitivity
    from variants.search.options import SearchOptions

    folder = a.work / f"mb{a.layers}"
    if not (folder / "model.safetensors").exists():
        make_folder(folder, a.layers)
    toml = a.work / f"mb{a.layers}.toml"
    toml.write_text(f'name = "mbert-base-{a.layers}"\nlogits = "classifier"\n'
                    f'checkpoint = "{folder}"\noptions = ["negative", "neutral", "positive"]\n'
                    'scores = [-1.0, 0.0, 1.0]\nactions = ["escalate", "review", "none"]\n')
    o = SearchOptions(model_config=str(toml), n_search=4 * a.n_rows, n_sensitivity=a.n_rows,
                      n_calibration=100, n_eval=100, results_dir=str(a.work / "results"),
                      finalize=False).validate()
    ref, rows = sens_cache.load_rows({"sweep": o.sweep_kwargs(), "n_search": o.n_search,
                                      "n_rows": a.n_rows})
    states, prep = {}, {}
    for suffix in (True, False):
        c = cpu_s()
        states[suffix] = sensitivity.prepare(ref, rows, suffix_forward=suffix)
        prep["suffix" if suffix else "full"] = round(cpu_s() - c, 2)
    units = [f"encoder.layers.{i}.{u}" for i in range(a.layers) for u in ("attn.Wqkv", "mlp.Wi")]
    cost = {(s, u): [] for s in (True, False) for u in units}
    got = {}
    for r in range(a.rounds):
        for u in units:
            for s in ((True, False) if r % 2 == 0 else (False, True)):
                c = cpu_s()
                out = sensitivity.measure_unit(states[s], {"path": u, "bits": [4],
                                                           "group_size": 64})
                cost[(s, u)].append(cpu_s() - c)
                got.setdefault(u, {})["suffix" if s else "full"] = [float(x) for x in out[0][3:6]]
    print(json.dumps({
        "layers": a.layers, "rows": a.n_rows, "rounds": a.rounds, "prepare_cpu_s": prep,
        "row_cpu_s": {u: {"suffix": round(float(np.median(cost[(True, u)])), 3),
                          "full": round(float(np.median(cost[(False, u)])), 3)} for u in units},
        "rows_max_abs_dlogit_kl_flip": got,
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "at": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))


if __name__ == "__main__":
    main()

"""Cold start as deployment sees it: a fresh process loads the exported folder (packed weights,
no fp32 checkpoint, no building) and answers one batch, against a fresh process that loads the
fp32 checkpoint and builds the same variant from it (what a sweep's variant cold start does).

``python -m variants.export.coldstart DIR {exported|fp32}`` prints one JSON object:

- ``import_s``: ``import mlx.core, mlx.nn`` and the package's loader;
- ``load_s``: the weights to evaluated MLX arrays (exported: :func:`load_variant`; fp32:
  ``load_checkpoint`` of the reference checkpoint, the decision model with the exported head
  and temperatures); ``build_s``: the variant built from fp32 (0 for the exported folder);
- ``first_forward_ms``: the first forward of one batch (the first eval rows, the run's batch
  size), ``mx.eval`` inside;
- ``load_peak_bytes``: MLX's allocator peak up to the end of loading/building;
  ``first_call_peak_bytes``: its peak during the first forward alone (reset before it);
  ``rss_bytes``: the process's peak resident set (``VmHWM``), everything included.
"""

import json
import subprocess
import sys
import time

MODES = ("exported", "fp32")


def child(folder, mode):
    """One cold start in this process (module docstring)."""
    t0 = time.perf_counter()
    import mlx.core as mx

    import variants  # noqa: F401  (OpenBLAS first)
    from variants.export.load import load_variant
    from variants.export.write import load_taskset
    from variants.runtime.memory import process_peak_rss_bytes
    t1 = time.perf_counter()
    model, _ = load_variant(folder) if mode == "exported" else (None, None)
    build_s = 0.0
    if mode == "fp32":
        model, build_s = _fp32(folder)
    t2 = time.perf_counter()
    load_peak = mx.get_peak_memory()
    from pathlib import Path

    cfg = json.loads((Path(folder) / "config.json").read_text())["mlx_variants"]
    ts = load_taskset(Path(folder) / "eval_rows.npz")
    ts = ts.subset(list(range(min(cfg.get("batch_size", 32), len(ts)))))
    batches, _ = model.prepare(ts, len(ts))
    mx.reset_peak_memory()
    t3 = time.perf_counter()
    model.raw_logits(ts, batches)  # one batch; evaluated inside
    t4 = time.perf_counter()
    return {"mode": mode, "import_s": t1 - t0, "load_s": t2 - t1 - build_s, "build_s": build_s,
            "first_forward_ms": (t4 - t3) * 1e3, "load_peak_bytes": int(load_peak),
            "first_call_peak_bytes": int(mx.get_peak_memory()),
            "rss_bytes": process_peak_rss_bytes(),
            "batch_rows": len(ts)}


def _fp32(folder):
    """The variant as a sweep builds it: the fp32 reference checkpoint, the exported head and
    temperatures, then the family's builder (native). Returns ``(model, build_s)``."""
    from pathlib import Path

    import mlx.core as mx

    from variants.families import get_family
    from variants.families.family import BuildInputs
    from variants.checkpoints.load import load_checkpoint
    from variants.checkpoints.packed import module_weights
    from variants.models import resolve

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    block = config["mlx_variants"]
    ck = load_checkpoint(block.get("reference_checkpoint"))
    toml = folder / "model.toml"
    source = resolve(model_config=toml) if toml.exists() else resolve(model=block["factory"])
    source.bind(ck)
    model = source.build(ck)
    file, _ = module_weights(folder, config)  # by the decision model's paths
    head = [(k, v) for k, v in file.items() if not k.startswith("encoder.")
            and not k.endswith((".scales", ".biases"))]
    if head:  # the fitted head as exported (fp32 unless --quantize-head)
        model.module.load_weights(head, strict=False)
    model.temperatures = {int(k): float(v) for k, v in block["temperatures"].items()}
    mx.eval(model.module.parameters())
    t = time.perf_counter()
    if block["family"] != "quant":
        raise ValueError(f"the fp32 cold start builds quant variants only, not {block['family']}")
    family = get_family(block["family"])
    variant, _ = family.build(model, family.config(**block["variant_config"]), BuildInputs(),
                              mode="native")
    mx.eval(variant.module.parameters())
    return variant, time.perf_counter() - t


def plan(folder):
    """``(modes, note)`` for ``variants verify DIR --cold-start``, checked before any work: the
    fp32 side builds round-to-nearest quant variants only (a low-rank build reads calibration
    activations, a learned quantizer the fit split), so the others time the exported folder alone (``note`` says so; else None). Raises
    ExportError (one line) when the fp32 reference checkpoint the folder names is not a folder
    any more."""
    from pathlib import Path

    from metrics._checks import short_path
    from variants.export.source import ExportError

    block = json.loads((Path(folder) / "config.json").read_text())["mlx_variants"]
    if block.get("family") != "quant":
        return ("exported",), (f"fp32 + build side left out: it builds quant variants only, "
                               f"not {block.get('family')}")
    method = (block.get("variant_config") or {}).get("method", "rtn")
    if method != "rtn":
        return ("exported",), (f"fp32 + build side left out: --quant-method {method} learns "
                               "from the fit split, which the folder does not hold")
    ref = block.get("reference_checkpoint")
    if ref is not None and not Path(ref).is_dir():
        raise ExportError(f"--cold-start builds the variant from its fp32 checkpoint {short_path(ref)}"
                          ", which is not a folder any more; put it back there, or drop "
                          "--cold-start")
    return MODES, None


def measure(folder, modes=MODES, timeout=900):
    """``{mode: result}``: each mode's cold start in a fresh interpreter (module docstring)."""
    out = {}
    for mode in modes:
        proc = subprocess.run([sys.executable, "-m", "variants.export.coldstart", str(folder),
                               mode], capture_output=True, text=True, timeout=timeout)
        if proc.returncode:
            raise RuntimeError(f"cold start ({mode}) failed: {proc.stderr.strip()[-400:]}")
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def table(results):
    """Markdown: the modes side by side."""
    rows = [("import s", "import_s", "{:.2f}"), ("load s", "load_s", "{:.2f}"),
            ("build s", "build_s", "{:.2f}"), ("first forward ms", "first_forward_ms", "{:.1f}"),
            ("load-time peak MB", "load_peak_bytes", "mb"),
            ("first-call peak MB", "first_call_peak_bytes", "mb"),
            ("process RSS MB", "rss_bytes", "mb")]
    modes = list(results)
    lines = ["| | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
    for label, key, fmt in rows:
        cells = [f"{results[m][key] / 1e6:.1f}" if fmt == "mb" else fmt.format(results[m][key])
                 for m in modes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1], sys.argv[2])))

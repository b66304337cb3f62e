"""Cold start of a decision model (reference or variant), measured in a fresh process.

``python -m variants.sweep.coldstart SPEC --spawned-at T`` runs in a new interpreter and prints one
JSON object with each stage timed separately:

- ``startup_s``: from the parent's spawn (``T``, ``time.time()``) to this module's ``main``:
  interpreter start-up and ``import variants`` (which preloads OpenBLAS);
- ``import_s``: ``import mlx.core, mlx.nn, numpy`` and the package modules the model needs
  (checkpoint loader, decision model, the family's builder);
- ``source``: what the child loads, as deployment would (:data:`SOURCES`): ``"exported
  artifact"`` for a variant of a family that exports (:data:`variants.families.artifact.EXPORTABLE`,
  timed in the ``native`` mode): the parent wrote its weights folder (the files ``variants
  export`` ships: packed ``weight``/``scales``/``biases``, factored layers as two Linears, the
  fitted head, temperatures and a pruning or exit rule in config.json, exit heads) and the
  child loads that folder
  (:func:`variants.families.artifact.load_variant`: no fp32 checkpoint, nothing built);
  ``"fp32 checkpoint + build"`` for the other variants (the fp32 checkpoint, then the family's
  builder); ``"fp32 checkpoint"`` for the reference;
- ``weight_load_s``: weights -> MLX arrays, evaluated: the artifact's packed load, or
  ``load_checkpoint`` (safetensors, its sha256, tokenizer) + the fitted head and temperatures
  from the sweep's cache;
- ``build_s``: the variant's builder in the speed mode, parameters evaluated (0 for the
  reference and for an artifact);
- ``weight_files_read``: every ``.safetensors`` / ``.npz`` file the child opened (Python's
  ``open`` audit events and ``mx.load``), absolute paths: the record that an artifact's cold
  start never read the fp32 checkpoint; ``artifact_bytes``: the size of its weight files
  (``model.safetensors``, and ``decision_head.safetensors`` when it has one);
- ``first_tokenise_ms`` and ``first_forward_ms``: the first tokenisation and the first forward
  (``mx.eval`` inside) of one batch; ``second_forward_ms`` is the next, warm call of the same
  batch, for comparison;
- ``total_s``: the sum of the above (startup through the first forward);
- ``model_bytes`` (parameters as stored; quantized layers count packed weights + scales +
  biases) and ``peak_memory_bytes`` (``mx.get_peak_memory`` of the whole child process);
- memory of the two moments apart (:mod:`variants.runtime.memory`: allocator peak, MLX cache, process
  RSS, bytes): ``load_peak_memory_bytes`` / ``load_cache_memory_bytes`` /
  ``load_process_rss_bytes`` once the weights are loaded and the variant built, before any call;
  ``first_call_peak_memory_bytes`` (peak reset after loading, so the first tokenisation and
  forward's own peak, the weights included) / ``first_call_cache_memory_bytes`` /
  ``first_call_process_rss_bytes`` just after the first forward; ``process_peak_rss_bytes``:
  the child's peak resident set (``VmHWM``) at the end.

The parent side is :func:`measure_cold_start`, which writes the spec (a pickle of plain data:
model name, head cache file, the batch's TaskSet, and for a variant its family, parameters,
name and any data its builder needs), runs the child and parses its JSON.
"""

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("startup_s", "import_s", "weight_load_s", "build_s", "first_tokenise_ms",
          "first_forward_ms")
#: what a cold start loads (its result's ``source``)
SOURCES = {"artifact": "exported artifact", "build": "fp32 checkpoint + build",
           "reference": "fp32 checkpoint"}
#: suffixes of the files ``weight_files_read`` records
WEIGHT_SUFFIXES = (".safetensors", ".npz")


def _now():
    return time.perf_counter()


def record_weight_reads():
    """Start recording the weight files this process opens; returns the list they are added
    to (absolute paths, in order). Python-level opens are seen by an audit hook (``open``
    events: ``open``, ``io.open``, ``os.open``, NumPy, hashing) and ``mlx.core.load`` is
    wrapped (its C++ reader raises no audit event). Audit hooks cannot be removed: call it in a
    process of its own (the child's :func:`main`)."""
    import mlx.core as mx

    seen = []

    def note(path):
        try:
            p = os.path.abspath(os.fsdecode(path))
        except TypeError:  # a file descriptor
            return
        if p.endswith(WEIGHT_SUFFIXES) and p not in seen:
            seen.append(p)

    def hook(event, args):
        if event == "open" and args:
            note(args[0])

    sys.addaudithook(hook)
    load = mx.load

    def recorded_load(file, *a, **k):
        note(file)
        return load(file, *a, **k)

    mx.load = recorded_load
    return seen


def run_spec(spec, spawned_at=None, main_at=None, reads=None):
    """Measure one cold start in *this* process (the child side). Returns the result dict.

    ``spec`` is a dict or the path of its pickle (loaded after the imports are timed, so that
    unpickling does not move NumPy's import out of ``import_s``). ``spawned_at`` and ``main_at``
    are ``time.time()`` at the parent's spawn and at ``main``'s entry (``startup_s`` is their
    difference; None when not given).

    ``spec`` keys: ``model`` (a ``variants.models.MODELS`` name or a ModelSource),
    ``checkpoint`` (its folder; None = the bundled MiniLM), ``head_path`` (the run's
    ``reference/fitted.npz``, :mod:`variants.models.fitted_state`; None = unfitted head,
    temperatures 1), ``taskset`` (the batch),
    optionally ``device``, ``dtype`` (:mod:`variants.runtime.device`), ``family``, ``params``, ``variant`` (its name in ``family.ladder(**params)``, or of ``config``, the variant's config
    when the sweep was given configs, e.g. a search's finalists),
    ``mode`` (default "native"), ``calibration``, ``fit`` (TaskSets), ``cache_dir``; or, for a
    variant loaded from its weights folder, ``artifact`` (the folder), ``model``, ``taskset``,
    ``device``, ``dtype``, ``max_length``, ``variant`` and ``family`` only (no checkpoint, no
    head file, nothing to build). ``reads``: the list :func:`record_weight_reads` fills
    (reported as ``weight_files_read``; None = not recorded).

    Raises
    ------
    ValueError
        If the variant is not in the family's ladder.
    variants.checkpoints.files.CheckpointError
        If the artifact folder does not load.
    """
    t_main = time.time() if main_at is None else main_at
    out = {"startup_s": (t_main - spawned_at) if spawned_at is not None else None}
    t0 = _now()
    import mlx.core as mx
    import mlx.nn  # noqa: F401

    # both modes import the same modules, so their import_s compare alike
    from variants.checkpoints.load import load_checkpoint  # noqa: F401
    from variants.models import get_module
    from mlx.utils import tree_flatten  # noqa: F401

    import variants.datasets.tasks  # noqa: F401  (what the spec's TaskSets unpickle into)
    import variants.models.configured  # noqa: F401  (and its ModelSource)

    if not isinstance(spec, dict):
        t_load = _now()
        with open(spec, "rb") as f:
            spec = pickle.load(f)
        t0 += _now() - t_load  # unpickling is not an import
    artifact = spec.get("artifact")
    if artifact:
        from variants.checkpoints.packed import OWN_FILE
        from variants.families.artifact import load_variant
    family = None
    if spec.get("family") and not artifact:
        from variants.families import get_family

        family = get_family(spec["family"])
    module = get_module(spec["model"])
    out["import_s"] = _now() - t0
    mx.reset_peak_memory()
    from variants.runtime import device  # the sweep's --device / --dtype (older specs: cpu, float32)

    device.use(spec.get("device") or "cpu", spec.get("dtype") or "float32")

    t0 = _now()
    ml = spec.get("max_length")  # (tokens, where set) or None
    if artifact:
        model, _ = load_variant(artifact, max_length=None if ml is None else tuple(ml))
        out["weight_load_s"] = _now() - t0
        out["build_s"] = 0.0
        out["source"] = SOURCES["artifact"]
        out["artifact_bytes"] = sum(f.stat().st_size for f in (
            Path(artifact) / "model.safetensors", Path(artifact) / OWN_FILE) if f.exists())
    else:
        model = _fp32_and_build(spec, out, module, family, t0)
    _first_calls(model, spec, out)
    if reads is not None:
        out["weight_files_read"] = list(reads)
    return out


def _fp32_and_build(spec, out, module, family, t0):
    """Load the fp32 checkpoint and the sweep's cached head, then build the variant (none for
    the reference): ``out`` gets the times and ``source``; returns the model."""
    import mlx.core as mx

    from variants.checkpoints.load import load_checkpoint
    from variants.runtime import device

    ml = spec.get("max_length")
    ck = load_checkpoint(spec.get("checkpoint"), dtype=device.mx_dtype(),
                         max_length=None if ml is None else tuple(ml))
    model = module.bind(ck).build(ck)
    head = spec.get("head_path")
    if head:
        from runs.npz_readers import read_head_cache

        state = read_head_cache(head)
        if hasattr(model, "load_head_state"):
            model.load_head_state({k[5:]: v for k, v in state.items() if k.startswith("head_")})
        model.temperatures = dict(zip(state["t_keys"].tolist(), state["t_values"].tolist()))
    mx.eval(model.module.parameters())
    out["weight_load_s"] = _now() - t0

    t0 = _now()
    if family is not None:
        by_name = {v.name: v for v in family.ladder(**spec.get("params", {}))}
        if spec.get("config") is not None and spec["config"].name == spec["variant"]:
            by_name[spec["variant"]] = spec["config"]  # the sweep's own config of the variant
        if spec["variant"] not in by_name:
            raise ValueError(f"variant {spec['variant']!r} is not in family {spec['family']!r} "
                             f"with these parameters; it has {sorted(by_name)}")
        from variants.families.family import BuildInputs

        inputs = BuildInputs(calibration=spec.get("calibration"), fit=spec.get("fit"),
                             cache_dir=Path(spec["cache_dir"]) if spec.get("cache_dir") else None)
        model, _ = family.build(model, by_name[spec["variant"]], inputs.only(family.inputs),
                                mode=spec.get("mode", "native"))
        mx.eval(model.module.parameters())
        out["build_s"] = _now() - t0
    else:
        out["build_s"] = 0.0
    out["source"] = SOURCES["build" if family is not None else "reference"]
    return model


def _first_calls(model, spec, out):
    """The memory once loaded, the first tokenisation and forward (and the warm second) of
    the spec's batch, into ``out``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from variants.runtime.memory import process_peak_rss_bytes, snapshot

    load = snapshot()  # weights loaded (and the variant built): before any call
    out["load_peak_memory_bytes"] = load["peak_bytes"]
    out["load_cache_memory_bytes"] = load["cache_bytes"]
    out["load_process_rss_bytes"] = load["rss_bytes"]
    mx.reset_peak_memory()

    ts = spec["taskset"]
    t0 = _now()
    batches, _ = model.prepare(ts, batch_size=len(ts))
    out["first_tokenise_ms"] = (_now() - t0) * 1e3
    t0 = _now()
    mx.eval(model.forward(batches[0]))
    out["first_forward_ms"] = (_now() - t0) * 1e3
    first = snapshot()  # the first call's own peak (weights included), cache and RSS after it
    out["first_call_peak_memory_bytes"] = first["peak_bytes"]
    out["first_call_cache_memory_bytes"] = first["cache_bytes"]
    out["first_call_process_rss_bytes"] = first["rss_bytes"]
    t0 = _now()
    mx.eval(model.forward(batches[0]))
    out["second_forward_ms"] = (_now() - t0) * 1e3
    out["total_s"] = ((out["startup_s"] or 0.0) + out["import_s"] + out["weight_load_s"]
                      + out["build_s"] + (out["first_tokenise_ms"] + out["first_forward_ms"]) / 1e3)
    out["model_bytes"] = int(sum(v.nbytes for _, v in tree_flatten(model.module.parameters())))
    # the allocator peak of the whole child: loading, building, both calls
    out["peak_memory_bytes"] = max(int(mx.get_peak_memory()), out["load_peak_memory_bytes"])
    out["batch_size"] = int(batches[0].input_ids.shape[0])
    out["seq_len"] = int(batches[0].input_ids.shape[1])
    out["what"] = spec.get("variant") or "reference"
    out["process_peak_rss_bytes"] = process_peak_rss_bytes()


def measure_cold_start(spec, *, timeout_s=600.0, python=None):
    """Run :func:`run_spec` in a fresh ``python -m variants.sweep.coldstart`` process.

    Parameters
    ----------
    spec : dict
        As :func:`run_spec` takes it (picklable plain data).
    timeout_s : float, default=600
        Seconds before the child is killed.
    python : str, optional
        Interpreter (default: ``sys.executable``).

    Returns
    -------
    dict
        The child's result plus ``process_wall_s`` (spawn to exit, seconds, as the parent saw
        it); on failure ``{"error": "<why>", "process_wall_s": ...}`` (never raises for a child
        failure, so a sweep does not lose its work to a cold-start problem).
    """
    fd, path = tempfile.mkstemp(suffix=".pkl", prefix="coldstart-")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(spec, f)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        t0 = time.time()
        try:
            proc = subprocess.run([python or sys.executable, "-m", "variants.sweep.coldstart", path,
                                   "--spawned-at", repr(t0)], capture_output=True, text=True,
                                  timeout=timeout_s, env=env, cwd=root)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s",
                    "process_wall_s": time.time() - t0}
        wall = time.time() - t0
        if proc.returncode != 0:
            tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no message"]
            return {"error": f"exit {proc.returncode}: {tail[0]}", "process_wall_s": wall}
        try:
            res = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": "no JSON result on stdout", "process_wall_s": wall}
        res["process_wall_s"] = wall
        return res
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def main(argv=None):
    """Child entry point: ``python -m variants.sweep.coldstart SPEC.pkl [--spawned-at T]``."""
    main_at = time.time()
    import argparse

    p = argparse.ArgumentParser(prog="python -m variants.sweep.coldstart",
                                description="Measure one cold start (import, weight load, build, "
                                            "first forward) and print it as JSON.")
    p.add_argument("spec", help="pickle written by variants.sweep.coldstart.measure_cold_start")
    p.add_argument("--spawned-at", type=float, default=None,
                   help="parent's time.time() at spawn (for startup_s)")
    args = p.parse_args(argv)
    reads = record_weight_reads()
    print(json.dumps(run_spec(args.spec, spawned_at=args.spawned_at, main_at=main_at,
                              reads=reads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The bundled models' reference in the default commands' configurations, fitted once and
shipped (:mod:`variants.models.fitted_state`): which configurations those are, and the writer
of ``variants/models/fitted/`` that ``scripts/fit_bundled_heads.py`` runs.

``variants sweep``, ``variants search`` and ``variants sensitivity`` at their defaults fit the
head on the same rows (``--n-fit`` 2000 drawn from the fit split with seed 0; the search carves
its split from the fit rows the head did not use) and the temperatures on the same 800
calibration rows, so each bundled model has one default state; :func:`default_inputs` builds
each command's inputs the way the command does, and the test of the shipped files checks that
every one of them resolves to a shipped file.
"""

import json
import platform

#: the commands whose default configuration must find a shipped state
COMMANDS = ("sweep", "search")


def default_config(model, command):
    """The validated :class:`variants.sweep.config.SweepConfig` that ``variants <command>
    --model <model>`` (nothing else given) fits its reference under. Raises ValueError for an
    unknown command."""
    from variants.sweep.config import SweepConfig

    if command == "sweep":
        return SweepConfig(model=model).validate()
    if command == "search":
        from variants.search.options import SearchOptions

        return SweepConfig(**SearchOptions(model=model).validate().sweep_kwargs()).validate()
    raise ValueError(f"command {command!r} has no default configuration; choose one of "
                     f"{', '.join(COMMANDS)}")


def default_inputs(model, command):
    """``(source, checkpoint, tasksets, extra_key)``: what ``fitted_reference`` receives in
    ``variants <command> --model <model>`` at its defaults (:func:`default_config`)."""
    from variants.runtime import device
    from variants.sweep.inputs import cache_parts, load_inputs

    cfg = default_config(model, command)
    device.use(cfg.device or device.requested(), cfg.dtype)
    _, checkpoint, tasksets = load_inputs(cfg)
    return cfg.resolve_model(), checkpoint, tasksets, cache_parts(cfg)


def _provenance():
    import mlx.core as mx
    import numpy
    import scipy
    import sklearn

    import variants
    from variants.runtime.cpu import cpu_info

    return {"mlx_variants": variants.__version__, "mlx": mx.__version__,
            "numpy": numpy.__version__, "scipy": scipy.__version__,
            "sklearn": sklearn.__version__, "python": platform.python_version(),
            "blas": dict(variants.BLAS_INFO), "cpu": cpu_info()}


def write_shipped(models, log=print):
    """Fit each of ``models`` (registered names) in its default configuration (in a temporary
    cache: never an old cached head) and write ``variants/models/fitted/<model>-<key>.npz``
    and ``index.json``; a model's other shipped files are removed. Returns index.json's dict.

    Raises ValueError when two default commands of one model would need different states (the
    test then names which)."""
    import tempfile
    from pathlib import Path

    from runs.io import write_npz
    from variants.models import fitted_reference
    from variants.models import fitted_state as fs

    index = {k: v for k, v in fs.read_index().items() if v.get("model") not in models}
    fs.FITTED_DIR.mkdir(exist_ok=True)
    for model in models:
        for old in fs.FITTED_DIR.glob(f"{model}-*.npz"):
            old.unlink()  # before fitting: fitted_reference must not find it
        keys, written = {}, None
        for command in COMMANDS:
            source, checkpoint, tasksets, extra = default_inputs(model, command)
            probe = source.build(checkpoint)
            keys[command] = fs.shipped_key(probe, checkpoint.sha256, tasksets, extra)
            if written is None:
                with tempfile.TemporaryDirectory() as tmp:
                    ref, _ = fitted_reference(source, checkpoint, tasksets, Path(tmp), log=log,
                                              extra_key=extra)
                state = fs.state_of(ref)
                written = fs.FITTED_DIR / f"{model}-{keys[command]}.npz"
                write_npz(written, state)
                index[written.name] = {
                    "model": model, "key": keys[command], "sha256": fs.state_sha256(state),
                    "commands": list(COMMANDS),
                    "inputs": {"checkpoint_sha256": checkpoint.sha256, **{
                        s: {"n": len(tasksets[s]), "fingerprint": tasksets[s].fingerprint()}
                        for s in ("fit", "calibration")}},
                    "temperatures": {str(k): v for k, v in ref.temperatures.items()},
                    "temperature_fits": {str(k): v for k, v in ref.temperature_fits.items()},
                    "fitted_with": _provenance()}
                log(f"wrote {written} (sha256 {index[written.name]['sha256']})")
        if len(set(keys.values())) != 1:
            raise ValueError(f"{model}: the default commands' keys differ {keys}; ship one "
                             "state per key (extend write_shipped)")
    fs.INDEX.write_text(json.dumps(dict(sorted(index.items())), indent=2) + "\n")
    return index

"""Registry of decision models: name -> module file (loaded with importlib, as mlx-lm does)."""

import importlib

import numpy as np

from metrics._checks import short_repr
from runs.io import write_npz

MODELS = {
    "minilm-sentiment": "sentiment",
    "minilm-choice": "choice",
}


def get_module(name):
    """The module that defines model ``name`` (``make_taskset`` and ``build``).

    Raises
    ------
    ValueError
        If ``name`` is not registered (the message lists the known names).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {short_repr(name)}; choose one of: {', '.join(MODELS)}")
    return importlib.import_module(f"variants.models.{MODELS[name]}")


def fitted_reference(name, checkpoint, tasksets, cache_dir, log=print):
    """The reference decision model with its head and temperatures fitted (or loaded from cache).

    Parameters
    ----------
    name : str
        A key of ``MODELS``.
    checkpoint : variants.checkpoint.Checkpoint
    tasksets : dict {"fit": TaskSet, "calibration": TaskSet, ...}
    cache_dir : Path
        Fitted state is cached in ``cache_dir/heads/<name>-<key>.npz``; the key covers the
        checkpoint hash, both data sets, the model's configuration and its tokenizer settings
        (:meth:`variants.decision.DecisionModel.cache_key`).

    Returns
    -------
    model : DecisionModel
    cache_key : str
    """
    mod = get_module(name)
    model = mod.build(checkpoint)
    key = model.cache_key(checkpoint.sha256, tasksets["fit"].fingerprint(),
                          tasksets["calibration"].fingerprint())
    path = cache_dir / "heads" / f"{name}-{key}.npz"
    if path.exists():
        from runs.npz_readers import read_head_cache  # CorruptFileError names the file

        state = read_head_cache(path, {k: np.shape(v) for k, v in model.head_state().items()}
                                if hasattr(model, "head_state") else None)
        if hasattr(model, "load_head_state"):
            model.load_head_state({k[5:]: v for k, v in state.items() if k.startswith("head_")})
        model.temperatures = dict(zip(state["t_keys"].tolist(), state["t_values"].tolist()))
        if "t_status" in state:  # fit statuses (caches written before they were kept lack them)
            model.temperature_fits = {k: {"temperature": t, "status": str(s)} for k, t, s in zip(
                state["t_keys"].tolist(), state["t_values"].tolist(), state["t_status"])}
        log(f"loaded fitted head and temperatures from {path}")
        return model, key
    state = {}
    if hasattr(model, "fit_head"):
        log(f"fitting {name} head on {len(tasksets['fit'])} fit examples")
        model.fit_head(tasksets["fit"])
        state.update({f"head_{k}": v for k, v in model.head_state().items()})
    log(f"fitting temperatures on {len(tasksets['calibration'])} calibration examples")
    temps = model.calibrate(tasksets["calibration"])
    state["t_keys"] = np.array(list(temps), np.int64)
    state["t_values"] = np.array(list(temps.values()), np.float64)
    state["t_status"] = np.array([model.temperature_fits.get(k, {}).get("status", "unknown")
                                  for k in temps], dtype=str)
    write_npz(path, state)
    return model, key

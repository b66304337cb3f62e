"""Registry of decision models: a name -> its shipped model TOML next to this file.

Every model, bundled or not, is a :class:`variants.models.configured.ModelSource`: a parsed model
TOML (:mod:`variants.models.model_config`), a user's ``package.module:factory``, or both.
"""

from pathlib import Path

import numpy as np

from metrics._checks import short_repr
from runs.io import write_npz

from variants.models.shipped import MODELS, shipped_config  # noqa: F401

#: sources resolved in this process by name, so that ``get_module(model.name)`` finds a model
#: from a user's TOML too (the early-exit builder asks by the reference's name)
_RESOLVED = {}


def resolve(model=None, model_config=None):
    """The :class:`~variants.models.configured.ModelSource` of ``--model`` / ``--model-config``.

    Parameters
    ----------
    model : str, optional
        A registered name (``MODELS``) or ``'package.module:factory'``.
    model_config : str or Path, optional
        A model TOML file (its ``factory =``, if any, builds the model).

    Raises
    ------
    ValueError
        An unknown name (listing the known ones); variants.models.model_config.ModelConfigError for a
        bad TOML or factory string.
    """
    from variants.models.model_config import load_model_config
    from variants.models.configured import ModelSource, import_factory

    if model_config is not None:
        cfg = load_model_config(model_config)
        source = ModelSource(cfg.name, cfg, cfg.factory)
    elif model is not None and ":" in str(model):
        import_factory(model)  # fail now, before anything is written
        mod, _, attr = str(model).partition(":")
        source = ModelSource(f"{mod.rsplit('.', 1)[-1]}-{attr}", None, str(model))
    elif model in MODELS:
        cfg = shipped_config(model)
        source = ModelSource(cfg.name, cfg, cfg.factory)
    else:
        raise ValueError(f"unknown model {short_repr(model)}; choose one of: {', '.join(MODELS)}, "
                         "or pass package.module:factory, or --model-config FILE")
    _RESOLVED[source.name] = source
    return source


def get_module(name):
    """The :class:`~variants.models.configured.ModelSource` of model ``name`` (a registered
    name, ``'package.module:factory'``, the name of a source resolved in this process, or a
    ModelSource, returned as it is): ``make_taskset(frame)``, ``build(checkpoint)``,
    ``EXIT_HEAD_KIND``.

    Raises
    ------
    ValueError
        If ``name`` is not registered (the message lists the known names).
    """
    from variants.models.configured import ModelSource

    if isinstance(name, ModelSource):
        return name
    if name in _RESOLVED and name not in MODELS:
        return _RESOLVED[name]
    return resolve(model=name)


def fitted_reference(name, checkpoint, tasksets, cache_dir, log=print, extra_key=()):
    """The reference decision model with its head and temperatures fitted (or loaded from cache).

    Parameters
    ----------
    name : str or ModelSource
        A key of ``MODELS`` or a resolved source (:func:`resolve`).
    checkpoint : variants.checkpoints.load.Checkpoint
    tasksets : dict {"fit": TaskSet, "calibration": TaskSet, ...}
    cache_dir : Path
        Fitted state is cached in ``cache_dir/heads/<name>-<key>.npz``; the key covers the
        checkpoint hash, both data sets, the model's configuration and its tokenizer settings
        (:meth:`variants.models.decision.DecisionModel.cache_key`), plus ``extra_key`` (the sweep's
        model TOML and data file identity, when given).

    Returns
    -------
    model : DecisionModel
    cache_key : str
    """
    mod = get_module(name)
    name = mod.name
    model = mod.build(checkpoint)
    key = model.cache_key(checkpoint.sha256, tasksets["fit"].fingerprint(),
                          tasksets["calibration"].fingerprint(), *extra_key)
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
    if getattr(model, "fixed_temperatures", None) is not None:
        log(f"using the fixed temperatures {model.fixed_temperatures} of the model config")
    else:
        log(f"fitting temperatures on {len(tasksets['calibration'])} calibration examples")
    temps = model.calibrate(tasksets["calibration"])
    state["t_keys"] = np.array(list(temps), np.int64)
    state["t_values"] = np.array(list(temps.values()), np.float64)
    state["t_status"] = np.array([model.temperature_fits.get(k, {}).get("status", "unknown")
                                  for k in temps], dtype=str)
    write_npz(path, state)
    return model, key

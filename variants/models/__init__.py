"""Registry of decision models: a name -> its shipped model TOML next to this file.

Every model, bundled or not, is a :class:`variants.models.configured.ModelSource`: a parsed model
TOML (:mod:`variants.models.model_config`), a user's ``package.module:factory``, or both.
"""

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
    """The reference decision model with its head and temperatures: shipped, cached or fitted.

    In this order: the state shipped with the package for exactly these inputs
    (:func:`variants.models.fitted_state.shipped`: the bundled models' default configurations,
    the same on every machine), else the results cache, else fitted here (float64 head,
    polished temperatures) and cached. The model's ``fitted_record`` says which
    (:func:`variants.models.fitted_state.record`: ``source``, ``sha256``, ``from``).

    Parameters
    ----------
    name : str or ModelSource
        A key of ``MODELS`` or a resolved source (:func:`resolve`).
    checkpoint : variants.checkpoints.load.Checkpoint
    tasksets : dict {"fit": TaskSet, "calibration": TaskSet, ...}
    cache_dir : Path
        Fitted state is cached in ``cache_dir/heads/<name>-<key>.npz``; the key covers the
        checkpoint hash, both data sets, the model's configuration and its tokenizer settings
        (:meth:`variants.models.decision.DecisionModel.cache_key`: the compute path too), plus
        ``extra_key`` (the sweep's model TOML and data file identity, when given).

    Returns
    -------
    model : DecisionModel
    cache_key : str

    Raises
    ------
    runs.readers.CorruptFileError, variants.models.fitted_state.ShippedStateError
        A cache or shipped file that does not read back (named, with the fix).
    """
    from variants.models import fitted_state as fs

    mod = get_module(name)
    name = mod.name
    model = mod.build(checkpoint)
    key = model.cache_key(checkpoint.sha256, tasksets["fit"].fingerprint(),
                          tasksets["calibration"].fingerprint(), *extra_key)
    path = cache_dir / "heads" / f"{name}-{key}.npz"
    found = fs.shipped(name, model, checkpoint.sha256, tasksets, extra_key)
    if found is not None:
        where, state = found
        fs.apply_state(model, state)
        model.fitted_record = fs.record("shipped", state, f"variants/models/fitted/{where.name}")
        log(f"using the shipped head and temperatures {where.name} "
            f"(sha256 {model.fitted_record['sha256'][:16]})")
        return model, key
    origin = f".cache/heads/{path.name}"
    if path.exists():
        state = fs.read_state(path, model)  # CorruptFileError names the file
        fs.apply_state(model, state)
        model.fitted_record = fs.record("cache", state, origin)
        log(f"loaded fitted head and temperatures from {path}")
        return model, key
    if hasattr(model, "fit_head"):
        log(f"fitting {name} head on {len(tasksets['fit'])} fit examples")
        model.fit_head(tasksets["fit"])
    if getattr(model, "head_outputs", "softmax") != "softmax":
        log(f"no temperature: the {model.head_outputs} head's logits are not a softmax "
            "(judged as they are)")
    elif getattr(model, "fixed_temperatures", None) is not None:
        log(f"using the fixed temperatures {model.fixed_temperatures} of the model config")
    else:
        log(f"fitting temperatures on {len(tasksets['calibration'])} calibration examples")
    model.calibrate(tasksets["calibration"])
    state = fs.state_of(model)
    write_npz(path, state)
    model.fitted_record = fs.record("fitted", state, origin)
    return model, key

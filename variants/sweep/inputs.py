"""The sweep's inputs, loaded and checked before anything is written: the contract, the
checkpoint (and the family's limits on it), the data splits sampled into TaskSets, and the
contract's needs of them (calibration size, strata)."""

from contracts.checker import load_contract
from variants.datasets import bundled as data
from variants.runtime import device
from variants.families import get_family
from runs.settings import check_calibration_size, check_strata, resolve_settings
from variants.checkpoints.load import load_checkpoint
from variants.models.model_config import ModelConfigError
from variants.sweep.config import MIN_FIT, SweepError


def load_inputs(cfg):
    """(contract, checkpoint, {"fit", "calibration", "eval": TaskSet}) of a validated
    :class:`variants.sweep.config.SweepConfig`.

    Raises
    ------
    SweepError
        A variant the model cannot hold (``Family.check_model``), a split size beyond the data.
    contracts.checker.ContractError, variants.checkpoints.load.CheckpointError, ValueError
        A bad contract, checkpoint, calibration size or stratum (each message names the fix).
    """
    contract = load_contract(cfg.contract)
    module = cfg.resolve_model()
    checkpoint = load_checkpoint(checkpoint_path(cfg, module), dtype=device.mx_dtype(cfg.dtype),
                                 max_length=cfg.max_length_choice())
    try:  # a classifier's options, a factory's or a marker's errors: now, not mid-run
        module.bind(checkpoint)
        decision = module.build(checkpoint)
    except ModelConfigError as e:
        raise SweepError(str(e)) from None
    contract = _contract_of_outputs(cfg, contract, module, checkpoint)
    family = get_family(cfg.family)
    try:  # family checks that need the model's shapes and its readout (before any write)
        family.check_model(decision.module, cfg.variants, model=module)
        if family.check_decision is not None:
            family.check_decision(decision, cfg.variants)
    except ValueError as e:
        raise SweepError(str(e)) from None
    sizes = {"fit": cfg.n_fit, "calibration": cfg.n_calibration, "eval": cfg.n_eval}
    data_fp = None
    if cfg.data is not None:
        tasksets, data_fp = own_data_tasksets(cfg.data, module, sizes, cfg.seed)
        cfg.inputs_identity = inputs_identity(cfg, module, checkpoint, data_fp)
        _check_option_counts(decision, tasksets)
        _check_markers(decision, tasksets, f"data file {cfg.data}")
        _check_fit_labels(module, tasksets["fit"], f"data file {cfg.data}")
        return _checked(cfg, contract, checkpoint, tasksets, decision)
    cfg.inputs_identity = inputs_identity(cfg, module, checkpoint, data_fp)
    frame = data.load_vader()
    splits = {s: data.split_frame(frame, s) for s in sizes}
    for s, n in sizes.items():  # a size beyond the split would be recorded but not used
        try:
            data.check_sample_size(splits[s], n, split=s, flag=f"--n-{s}")
        except ValueError as e:
            raise SweepError(str(e)) from None
    try:
        tasksets = {s: module.make_taskset(data.sample(splits[s], n, seed=cfg.seed))
                    for s, n in sizes.items()}
    except ModelConfigError as e:
        raise SweepError(str(e)) from None
    _check_option_counts(decision, tasksets)
    _check_markers(decision, tasksets, "the bundled data")
    return _checked(cfg, contract, checkpoint, tasksets, decision)


def _contract_of_outputs(cfg, contract, module, checkpoint):
    """The contract that judges what the model outputs (:mod:`contracts.outputs`): without
    ``--contract`` a multi-label or regression head gets its packaged one (``cfg.contract`` is
    set to its name, so run.json and an export record it); a contract with a clause that does
    not measure those outputs is refused (ContractError, one line)."""
    from contracts.outputs import check_outputs, contract_for

    outputs = module.outputs
    if cfg.contract is None and outputs != "softmax":
        cfg.contract = contract_for(outputs)
        contract = load_contract(cfg.contract)
    check_outputs(contract, outputs,
                  where=f"{checkpoint.path}/config.json" if outputs != "softmax" else "the model")
    return contract


def _check_option_counts(decision, tasksets):
    """Every option count K of the calibration and eval splits gets a temperature: a fixed one
    from the TOML, or one fitted on calibration rows with that K. Raises SweepError."""
    cal = set(tasksets["calibration"].n_options.tolist())
    needed = cal | set(tasksets["eval"].n_options.tolist())
    fixed = getattr(decision, "fixed_temperatures", None)
    if fixed is not None:
        missing = sorted(needed - set(fixed))
        if missing:
            raise SweepError(f"no fixed temperature for option counts {missing} of the data; add "
                             "them to the model TOML's [temperature] values, e.g. "
                             f'"{missing[0]}" = 1.0')
        return
    missing = sorted(needed - cal)
    if missing:
        raise SweepError(f"the eval split has rows with {missing} options but the calibration "
                         "split has none, so no temperature can be fitted for them; put such rows "
                         "in the calibration split too, or fix temperatures in the model TOML's "
                         "[temperature] values")


def _check_no_fit(cfg, decision, name):
    """``--n-fit 0`` only for a model that fits nothing: a fitted head (linear head, a marker's
    fitted scorer) on an empty fit split was scikit-learn's error, after the run folder was
    made. Raises SweepError naming --n-fit and the smallest size."""
    fits = hasattr(decision, "fit_head") and getattr(decision, "scorer", "fit") == "fit"
    if cfg.n_fit == 0 and fits:
        from variants import defaults

        raise SweepError(f"--n-fit 0: model {name} fits its head on the fit split, which would "
                         f"be empty; pass --n-fit {MIN_FIT} or more (default "
                         f"{defaults.N_FIT}), or leave it out")


def _check_fit_labels(source, fit, where):
    """A fitted linear head needs labelled fit rows of every class; a fitted marker scorer at
    least one labelled row. Raises SweepError (sklearn's own error came after writing)."""
    cfg = source.config
    if source.factory is not None or cfg is None:
        return
    labels = sorted(set(fit.labels[fit.labels >= 0].tolist()))
    n_labelled = int((fit.labels >= 0).sum())
    if cfg.logits == "linear-head" and labels != list(range(len(cfg.options))):
        want = ", ".join(map(str, range(len(cfg.options))))
        raise SweepError(f"{where}: the fit split has {n_labelled} labelled rows, of classes "
                         f"{labels} of {want}; the linear head is fitted on labels of every "
                         "class: label fit rows of each option")
    if cfg.logits == "marker" and cfg.marker_scorer == "fit" and not n_labelled:
        raise SweepError(f"{where}: the fit split has 0 labelled rows, so the marker scorer "
                         "cannot be fitted; label fit rows, or name the checkpoint's scorer "
                         "([marker] scorer)")


def _check_markers(decision, tasksets, where):
    """A marker model's prompts, tokenized now: a row whose markers were cut by truncation or
    that holds the marker token in its text is refused before anything is written."""
    if getattr(decision, "marker_id", None) is None:
        return
    for ts in tasksets.values():
        try:
            decision.prepare(ts)
        except ValueError as e:
            raise SweepError(f"{where}: {e}") from None


def _checked(cfg, contract, checkpoint, tasksets, decision):
    """The contract's needs of the TaskSets (calibration size, strata); returns load_inputs'."""
    settings = resolve_settings(contract, near_tie_margin=cfg.near_tie_margin)
    check_calibration_size(cfg.n_calibration, settings["alpha"])
    n_cal = len(tasksets["calibration"])  # own data: the split may hold fewer rows than asked
    if n_cal < cfg.n_calibration:
        try:
            check_calibration_size(n_cal, settings["alpha"])
        except ValueError as e:
            raise SweepError(f"data file {cfg.data}: its calibration split has only {n_cal} rows; "
                             f"{e}; or add calibration rows (a 'split' column)") from None
    # methods that read fit-split activations (quant: all but rtn; lowrank: all but plain SVD)
    learned = sorted({v.method for v in cfg.variants
                      if getattr(v, "method", "rtn") not in ("rtn", "plain")})
    if learned and len(tasksets["fit"]) == 0:
        fix = ("pass --n-fit 100 or more" if cfg.n_fit == 0 else
               f"add rows with split = \"fit\" to {cfg.data}" if cfg.data else
               "pass --n-fit 100 or more")
        flag, plain = (("--methods", "--methods plain") if cfg.family == "lowrank" else
                       ("--quant-method", "--quant-method rtn"))
        raise SweepError(f"{flag} {' '.join(learned)} learns from fit-split "
                         f"activations, but the fit split is empty; {fix}, or use {plain}")
    _check_no_fit(cfg, decision, cfg.model)
    ev = tasksets["eval"]
    check_strata(contract, {"task": ev.task, "option_mask": ev.option_mask})
    return contract, checkpoint, tasksets


def checkpoint_path(cfg, source):
    """The checkpoint folder: ``--checkpoint``, else the model TOML's, else None (MiniLM)."""
    if cfg.checkpoint is not None:
        return cfg.checkpoint
    return None if source.config is None else source.config.checkpoint


def inputs_identity(cfg, source, checkpoint, data_fingerprint):
    """What the user's files held, for run.json's identity and the cache keys: the parsed model
    TOML (``model_config``; only with --model-config), the checkpoint's sha256 and its
    config.json's (only when one was named) and the data file's fingerprint (only with
    --data). {} for a bundled model on the bundled data, so the default sweep's identity and
    cache keys are as before."""
    out = {}
    if cfg.model_config is not None:
        out["model_config_parsed"] = source.describe()
    if checkpoint_path(cfg, source) is not None:
        from pathlib import Path

        from runs.io import file_sha256

        out["checkpoint_sha256"] = checkpoint.sha256
        # config.json changes the model without the weights (pooling, eps, θ, window)
        out["checkpoint_config_sha256"] = file_sha256(Path(checkpoint.path) / "config.json")
    if data_fingerprint is not None:
        out["data_fingerprint"] = data_fingerprint
    return out


def cache_parts(cfg):
    """The ``inputs_identity`` parts that join the cache keys (the TOML's own path left out:
    moving the file does not change a model)."""
    ident = dict(cfg.inputs_identity)
    if "model_config_parsed" in ident:
        described = dict(ident["model_config_parsed"])
        described["config"] = {k: v for k, v in (described.get("config") or {}).items()
                               if k != "path"}
        ident["model_config_parsed"] = described
    return (ident,) if ident else ()


def _check_head_classes(path, frame, kind, classes):
    """A classifier's (or linear head's) logit k is ``classes[k]``: a row with its own options
    must list exactly those, in that order. Raises own_data.DataError naming the row."""
    from metrics._checks import short_repr
    from variants.datasets.own import fail

    for where, own in zip(frame.index, frame["options"]):
        if own is not None and list(own) != list(classes):
            raise fail(path, where, "options", f"{short_repr(list(own))} are not the {kind} "
                       f"head's classes {short_repr(list(classes))} (logit k is class k)",
                       "list the head's options in its order, or drop the row's options "
                       "(rename the classes with the model TOML's options)")


#: why a regression head's rows carry no label (variants.datasets.own.read_data ``unread``)
UNREAD_BY_REGRESSION = "a regression head is judged against the reference's values"


def own_data_tasksets(path, source, sizes, seed):
    """({"fit", "calibration", "eval": TaskSet}, data fingerprint) of the user's data file.

    Adapter to :mod:`variants.datasets.own` (``read_data``, ``split_rows``,
    ``to_taskset``, ``data_fingerprint``, ``DataError``): the model TOML's fixed options, scores
    and actions fill what the rows leave out. Each split keeps at most ``sizes[split]`` rows:
    those with the smallest ``sha256(f"{seed}:{id}")``, in file order (a split with fewer rows
    is used whole; run.json's ``data.splits`` records the sizes used).

    Raises
    ------
    SweepError
        The data module is missing, or the file is bad (its one-line DataError).
    """
    import hashlib

    try:
        from variants.datasets import own as own_data
    except ImportError:
        raise SweepError("--data needs variants.datasets.own, which this build lacks") from None
    options, scores, actions = source.fixed_options() or (None, None, None)
    defaults = dict(options=options, scores=scores, actions=actions)
    unread = (UNREAD_BY_REGRESSION if getattr(source, "outputs", "softmax") == "regression"
              else None)
    try:
        frame = own_data.read_data(path, unread=unread, **defaults)
        if source.factory is None and source.kind in ("classifier", "linear-head"):
            _check_head_classes(path, frame, source.kind, options)
        tasksets = {}
        for split, n in sizes.items():
            rows = own_data.split_rows(frame, split)
            rank = sorted(range(len(rows)), key=lambda i: hashlib.sha256(
                f"{seed}:{rows['id'].iloc[i]}".encode()).hexdigest())
            rows = rows.iloc[sorted(rank[:n])]
            tasksets[split] = own_data.to_taskset(
                rows, action_names=None if source.config is None and actions is None
                else source.action_names(), **defaults)
    except ValueError as e:  # own_data.DataError is a ValueError
        raise SweepError(str(e)) from None
    return tasksets, own_data.data_fingerprint(frame)

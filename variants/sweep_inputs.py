"""The sweep's inputs, loaded and checked before anything is written: the contract, the
checkpoint (and the family's limits on it), the data splits sampled into TaskSets, and the
contract's needs of them (calibration size, strata)."""

from contracts.checker import load_contract
from variants import data
from variants.builders import get_family
from runs.settings import check_calibration_size, check_strata, resolve_settings
from variants.checkpoint import load_checkpoint
from variants.models import get_module
from variants.sweep_config import SweepError


def load_inputs(cfg):
    """(contract, checkpoint, {"fit", "calibration", "eval": TaskSet}) of a validated
    :class:`variants.sweep_config.SweepConfig`.

    Raises
    ------
    SweepError
        A variant the model cannot hold (``Family.check_model``), a split size beyond the data.
    contracts.checker.ContractError, variants.checkpoint.CheckpointError, ValueError
        A bad contract, checkpoint, calibration size or stratum (each message names the fix).
    """
    contract = load_contract(cfg.contract)
    checkpoint = load_checkpoint()
    family = get_family(cfg.family)
    try:  # family checks that need the model's shapes
        family.check_model(checkpoint.encoder, cfg.variants, model=cfg.model)
    except ValueError as e:
        raise SweepError(str(e)) from None
    frame = data.load_vader()
    module = get_module(cfg.model)
    sizes = {"fit": cfg.n_fit, "calibration": cfg.n_calibration, "eval": cfg.n_eval}
    splits = {s: data.split_frame(frame, s) for s in sizes}
    for s, n in sizes.items():  # a size beyond the split would be recorded but not used
        try:
            data.check_sample_size(splits[s], n, split=s, flag=f"--n-{s}")
        except ValueError as e:
            raise SweepError(str(e)) from None
    tasksets = {s: module.make_taskset(data.sample(splits[s], n, seed=cfg.seed))
                     for s, n in sizes.items()}
    settings = resolve_settings(contract, near_tie_margin=cfg.near_tie_margin)
    check_calibration_size(cfg.n_calibration, settings["alpha"])
    ev = tasksets["eval"]
    check_strata(contract, {"task": ev.task, "option_mask": ev.option_mask})
    return contract, checkpoint, tasksets

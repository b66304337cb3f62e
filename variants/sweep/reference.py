"""The sweep's reference: its fitted head and temperatures, its outputs on the calibration and
eval splits (cached in ``results/.cache/reference``), and its numerical noise
(:mod:`variants.sweep.noise`). Called as :meth:`variants.sweep.run.Sweep.reference`."""

from metrics.finite import describe_rows, nonfinite_rows
from runs.outputs import DecisionOutputs
from variants.sweep.config import SweepError
from variants.models import fitted_reference
from variants.models.decision import prepared_digest
from variants.sweep.inputs import cache_parts
from variants.sweep.noise import reference_noise


class ReferenceNotFinite(SweepError):
    """The reference model answers some rows with NaN or inf: nothing can be judged against it
    (a SweepError: one line, exit 2; run.json says "incomplete" with this reason)."""


def _check_finite(sweep, split, outputs):
    bad = nonfinite_rows(outputs)
    if bad.any():
        raise ReferenceNotFinite(
            f"the reference model {sweep.cfg.model} gives NaN or inf outputs on "
            f"{describe_rows(outputs.ids, bad)} of the {split} split: no variant can be judged "
            "against it; fix the model (its outputs must be numbers) or pass another --model")


def prepare_reference(sweep):
    """Fit (or load) the reference head and compute (or load) its outputs on both splits.

    With a warm cache nothing runs through the model: the head, temperatures and outputs
    come from ``results/.cache`` (``clock.counts["reference_output_batches"]`` stays 0).
    Raises :class:`ReferenceNotFinite` when the reference answers a row with NaN or inf (such
    outputs are not cached).
    """
    cfg = sweep.cfg
    with sweep.clock("reference_forward"):
        sweep.ref_model, sweep.head_key = fitted_reference(
            cfg.resolve_model(), sweep.checkpoint, sweep.tasksets, sweep.cache, log=sweep.log,
            extra_key=cache_parts(cfg))
    sweep.batches, sweep.truncated = {}, {}
    with sweep.clock("setup"):
        for split in ("calibration", "eval"):
            sweep.batches[split], sweep.truncated[split] = sweep.ref_model.prepare(
                sweep.tasksets[split], cfg.batch_size)
    sweep.ref_outputs, sweep.ref_outputs_cached = {}, {}

    def key_of(split):
        return sweep.ref_model.cache_key(sweep.checkpoint.sha256, cfg.dtype,
                                         sweep.tasksets[split].fingerprint(),
                                         prepared_digest(sweep.batches[split]),
                                         *cache_parts(cfg))

    for split in ("calibration", "eval"):
        key = key_of(split)
        path = sweep.cache / "reference" / f"{cfg.model}-{split}-{key}.npz"
        with sweep.clock("reference_forward"):
            sweep.ref_outputs_cached[split] = path.exists()
            if path.exists():
                outputs = DecisionOutputs.load(path, "reference outputs cache file")
            else:
                outputs = sweep._outputs(sweep.ref_model, split, "reference")
                sweep.clock.counts["reference_output_batches"] += len(sweep.batches[split])
                _check_finite(sweep, split, outputs)
                outputs.save(path)
            _check_finite(sweep, split, outputs)
        sweep.ref_outputs[split] = outputs
    with sweep.clock("reference_forward"):
        sweep.ref_noise = reference_noise(sweep, key_of)
    return sweep.ref_model

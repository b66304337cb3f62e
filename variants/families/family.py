"""The family interface: what every variant family gives the sweep, the CLI and the report.

A family is one :class:`Family` value (``FAMILY`` in its ``variants/families/<name>_family.py``
file, registered by one line in :data:`variants.families.FAMILIES`). Everything in it but
``build`` and ``check_model`` is plain Python (config dataclass, CLI flags, ladder, report
lines), so the CLI and the judge read a family without importing MLX; ``build`` and
``check_model`` import the family's MLX builder module when called.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class BuildInputs:
    """Data a builder may read besides the reference model and the variant's config.

    Attributes
    ----------
    calibration : variants.datasets.tasks.TaskSet or None
        The calibration split (exit thresholds, activation statistics, realised work ratios).
    fit : variants.datasets.tasks.TaskSet or None
        The fit split (early-exit heads are distilled on it).
    cache_dir : pathlib.Path or None
        ``results/.cache``: activation statistics and exit heads are cached under it.
    """

    calibration: Any = None
    fit: Any = None
    cache_dir: Path | None = None

    def only(self, names):
        """A copy keeping only the fields in ``names`` (the others None): what a family's
        ``inputs`` says its build reads (e.g. what a cold-start child is sent)."""
        return BuildInputs(**{k: getattr(self, k) for k in ("calibration", "fit", "cache_dir")
                              if k in names})


def _no_check(encoder, configs, model=None):
    """Default ``check_model``: a family without model-dependent limits accepts any model."""


def _no_description(build, timing=None):
    """Default ``describe``: a family with nothing to add to the report (returns None)."""
    return None


@dataclass(frozen=True)
class Family:
    """One variant family, filled the same way by every family.

    Attributes
    ----------
    name : str
        The registry name (``--family``; ``summary.csv``'s ``family`` column).
    config : type
        The frozen dataclass of one variant; its ``name`` property is the variant folder's name.
    params : tuple of str
        The keyword arguments of ``ladder``/``run_name`` (= the argparse dests of its flags).
    add_arguments : callable(parser) -> None
        Adds the family's ``variants sweep`` flags (an argument group) to ``parser``.
    ladder : callable(**params) -> list of config
        The variants of one sweep; raises ValueError naming the flag and the fix.
    run_name : callable(**params) -> str
        Default run-folder suffix.
    build : callable(reference, config, inputs=BuildInputs(), mode="simulated") -> (variant, info)
        The variant DecisionModel and its build.json dict (``mode`` in ``MODES``); raises
        ValueError on bad input. Imports MLX.
    check_model : callable(encoder, configs, model=None) -> None
        Raises ValueError, before a sweep writes anything, for configs the loaded model cannot
        hold (``encoder``: the checkpoint's encoder, or the decision module, whose ``readout``
        prune and exit then check, :mod:`variants.families.readout`; ``model``: the registry
        name).
    describe : callable(build, timing=None) -> str or None
        Markdown lines for the run's report.md from a variant's build.json dict and its
        timing.json dict (None: nothing to say). Plain Python: no MLX.
    inputs : tuple of str
        The :class:`BuildInputs` fields ``build`` reads (the sweep sends a cold-start child
        only these).
    outputs_info : callable(build, outputs) -> dict, or None
        build.json additions computed from the variant's own outputs (``outputs``: {split:
        DecisionOutputs} of calibration and eval), e.g. the student family's eval fallback rate.
    time_extra : callable(reference, variant, eval_taskset, cfg, vcfg) -> dict, or None
        Family-specific timing (e.g. the exact family's workload streams): its dict is merged
        into the variant's timing.json after the common measurement (``cfg``: the
        SweepConfig; ``variant`` built in the speed mode). None: nothing more.
    timed_variant : callable(variant, vcfg) -> model, or None
        What the common alternated timing calls instead of ``variant`` (e.g. the exact
        family's cache emptied before every call: the timing repeats one request, which would
        otherwise time cache hits only). None: the variant itself.
    judged_in_speed_mode : callable(vcfg) -> bool, or None
        True when a variant must be judged on the model the speed mode builds (its quality
        build then runs in the sweep's ``--speed-mode``, not ``--quality-mode``): W8A8 Linears
        quantize activations at run time, so two paths that differ by float round-off round
        some codes differently and their outputs differ by code steps, not round-off; the
        simulated model is not the model that runs. None: never (the sweep checks the timed
        model against the judged one instead, :mod:`variants.sweep.timed_check`).
    check_decision : callable(decision, configs) -> None, or None
        Like ``check_model`` with the whole reference DecisionModel (its tokenizer and head),
        for checks that run it (an ONNX graph's inputs and outputs against the model's).
    extra_stale : callable(timing, cfg, vcfg) -> str or None, or None
        On resume: why a saved timing.json's ``time_extra`` part no longer fits the sweep's
        settings (e.g. the exact family's workloads timed with another --zipf-exponent), so
        it is measured again; None when it fits.
    """

    name: str
    config: type
    params: tuple
    add_arguments: Callable
    ladder: Callable
    run_name: Callable
    build: Callable
    check_model: Callable = _no_check
    describe: Callable = _no_description
    inputs: tuple = ("calibration",)
    outputs_info: Callable = None
    time_extra: Callable | None = None
    timed_variant: Callable | None = None
    extra_stale: Callable | None = None
    check_decision: Callable | None = None
    judged_in_speed_mode: Callable | None = None


def judged_mode(family, cfg, vcfg):
    """The mode ``vcfg``'s quality build runs in: ``cfg.speed_mode`` (the sweep's) when the
    family's ``judged_in_speed_mode`` says so for it, else ``cfg.quality_mode``."""
    if family.judged_in_speed_mode is not None and family.judged_in_speed_mode(vcfg):
        return cfg.speed_mode
    return cfg.quality_mode

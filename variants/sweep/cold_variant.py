"""A variant's cold start as deployment sees it (the parent side; the child is
:mod:`variants.sweep.coldstart`).

A variant of a family that exports (:data:`variants.families.artifact.EXPORTABLE`: quant,
uniform or mixed, with learned quantizers, quantized embeddings or ``--int8-layers``; low rank,
quantized or not; w8a8, its int8 codes, scales and SmoothQuant factors as stored; prune and exit,
their rule's settings and exit heads beside the wrapped module's weights; composed) timed in the
``native`` mode is written as its weights folder — the files ``variants export`` ships
(:func:`variants.families.artifact.write_weights`: packed ``weight`` / ``scales`` /
``biases``, factored layers as two Linears, the fitted head, temperatures, the
``mlx_variants.wrapper`` block) — into a temporary folder, and the fresh process loads that
folder: no fp32 checkpoint, nothing built. Every other variant (student, exact, or a
``simulated`` speed mode) starts from the fp32 checkpoint and its family's builder, and its
result says so (``source``).
"""

import tempfile
from dataclasses import asdict

import mlx.core as mx

from variants.families.artifact import EXPORTABLE, write_weights
from variants.sweep.timing import cold_start_spec


def from_artifact(sweep, family):
    """Whether ``family``'s variants in ``sweep`` cold-start from their weights folder."""
    return family.name in EXPORTABLE and sweep.cfg.speed_mode == "native"


def variant_cold_start(sweep, family, vcfg, timing_sets, model=None):
    """The cold start (:func:`variants.sweep.coldstart.run_spec`'s result) of variant ``vcfg``
    of ``family`` in ``sweep``: from its weights folder when :func:`from_artifact`, else from
    the fp32 checkpoint and a build.

    ``model``: the variant as built in the speed mode (the one just timed); None = built here
    when an artifact is needed. The folder is written under the system's temporary directory
    and removed after the measurement (its writing counts as ``cold_start`` time). When the
    folder cannot be written, or the child cannot load it, the cold start is measured from the
    fp32 checkpoint + build instead (its ``source`` says so; ``artifact_error`` the child's
    error).
    """
    if not from_artifact(sweep, family):
        return sweep._cold_start(cold_start_spec(sweep, timing_sets, family, vcfg), vcfg.name)
    cfg = sweep.cfg
    with tempfile.TemporaryDirectory(prefix=f"{vcfg.name}-artifact-") as folder:
        with sweep.clock("cold_start"):
            try:
                if model is None:
                    model, _ = family.build(sweep.ref_model, vcfg, sweep._inputs(family),
                                            mode="native")
                    mx.eval(model.module.parameters())
                write_weights(model, sweep.checkpoint, cfg.resolve_model(), folder,
                              family=cfg.family, variant=vcfg.name,
                              variant_config=asdict(vcfg), batch_size=cfg.batch_size,
                              near_tie_margin=cfg.near_tie_margin)
            except (OSError, ValueError, RuntimeError) as e:  # the sweep keeps its results
                sweep.log(f"{vcfg.name}: its weights folder could not be written ({e}); cold "
                          "start from the fp32 checkpoint + build instead")
                return sweep._cold_start(cold_start_spec(sweep, timing_sets, family, vcfg),
                                         vcfg.name)
        del model
        res = sweep._cold_start(cold_start_spec(sweep, timing_sets, family, vcfg,
                                                artifact=folder), vcfg.name)
    if "error" in res:  # e.g. a factory model the folder cannot rebuild: the old way, said so
        sweep.log(f"{vcfg.name}: its weights folder did not load in a fresh process; cold start "
                  "from the fp32 checkpoint + build instead")
        res = dict(sweep._cold_start(cold_start_spec(sweep, timing_sets, family, vcfg),
                                     vcfg.name), artifact_error=res["error"])
    return res

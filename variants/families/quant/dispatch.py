"""The quant family's weight build by method: round-to-nearest (:mod:`.build`, needs no data)
or a learned quantizer (:mod:`.learned`: AWQ, GPTQ, DWQ on the fit split). Below both the family
entry and the W8A8 mix (:mod:`.int8`), which build on it."""

from variants.families.family import BuildInputs


def build_weights(reference, config, inputs=BuildInputs(), mode="simulated"):
    """``(variant, info)`` of ``config`` (a QuantConfig without ``int8``) by its ``method``."""
    if config.method != "rtn":
        from variants.families.quant import learned as quant_learned

        return quant_learned.build(reference, config, mode=mode, fit=inputs.fit,
                                   cache_dir=inputs.cache_dir)
    from variants.families.quant import build as quantize

    return quantize.build(reference, config, mode=mode, calibration=inputs.calibration,
                          fit=inputs.fit)

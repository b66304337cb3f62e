"""Registry of variant families: name -> builder module (one file per family, one line here).

A builder module defines ``build(reference, cfg, mode, calibration) -> (variant, info)`` and a
config dataclass with a ``name`` property.
"""

import importlib

FAMILIES = {
    "quant": "quantize",
    "lowrank": "lowrank",
    "prune": "prune",
    "exit": "early_exit",
}


def get_family(name):
    """The builder module of family ``name``.

    Raises
    ------
    ValueError
        If ``name`` is not registered (the message lists the known families).
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown variant family {name!r}; choose one of: {', '.join(FAMILIES)}")
    return importlib.import_module(f"variants.builders.{FAMILIES[name]}")

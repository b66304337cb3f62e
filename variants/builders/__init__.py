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


def realised_speed_lines(timing, ideal_speedup):
    """Report lines: measured speed-up per timed batch size next to the cost model's ideal.

    ``timing`` is a variant's timing.json dict (or None); returns a list of Markdown lines.
    """
    lines = []
    for b, t in (timing or {}).get("batches", {}).items():
        s = t["speedup"]["speedup_median"]
        lines.append(f"- B={b} (L={t['seq_len']}): measured {s:.2f}× vs ideal "
                     f"{ideal_speedup:.2f}× → realised/ideal {s / ideal_speedup:.2f}")
    return lines

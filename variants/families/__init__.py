"""Registry of variant families: name -> the module (in this package) holding its ``FAMILY``.

A family is one :class:`variants.families.family.Family` value, defined without MLX in
``<name>/family.py`` next to its MLX build (``<name>/build.py``): adding a family = one folder +
one line in ``FAMILIES``. Reading the registry imports no MLX; only ``Family.build`` and
``Family.check_model`` import the builder.
"""

import importlib

from metrics._checks import short_repr

FAMILIES = {
    "quant": "quant.family",
    "lowrank": "lowrank.family",
    "prune": "prune.family",
    "exit": "exit.family",
    "student": "student.family",
    "exact": "exact.family",
    "w8a8": "w8a8.family",
    "composed": "composed.family",
    "onnx": "onnx.family",
}


def get_family(name):
    """The :class:`variants.families.family.Family` registered as ``name`` (imports no MLX).

    Raises
    ------
    ValueError
        If ``name`` is not registered (the message lists the known families).
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown variant family {short_repr(name)}; choose one of: "
                         f"{', '.join(FAMILIES)}")
    return importlib.import_module(f"variants.families.{FAMILIES[name]}").FAMILY


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


def name_number(x, spec):
    """``x`` formatted for a variant (folder) name: ``format(x, spec)`` when that reads back as
    exactly ``x`` (today's names: 0.5 -> ``0.50`` with ``.2f``, 0.99 -> ``0.99`` with ``.3g``),
    else Python's shortest round-trip ``repr`` (0.1231 -> ``0.1231``, never rounded). Either way
    ``float(name_number(x, spec)) == x``, so distinct values never share a name. The characters
    are digits, ``.``, ``-``, ``e``, ``+``, ``inf``/``nan``: safe in folder names."""
    x = float(x)
    s = format(x, spec)
    try:
        if float(s) == x:
            return s
    except ValueError:
        pass
    return repr(x)


def unique_by_name(cfgs, flags):
    """``cfgs`` with exact duplicates dropped (first kept, order kept).

    Two *different* configs with one name would share a result folder (one silently lost), so
    that raises. ``flags`` maps config fields to the CLI flags that set them (for the message).

    Raises
    ------
    ValueError
        Naming the parameter whose values the names do not tell apart.
    """
    by_name = {}
    for c in cfgs:
        old = by_name.setdefault(c.name, c)
        if old != c:
            diff = [f for f in old.__dataclass_fields__ if getattr(old, f) != getattr(c, f)]
            what = ", ".join(f"{flags.get(f, f)} ({getattr(old, f)!r} vs {getattr(c, f)!r})"
                             for f in diff)
            raise ValueError(f"two requested variants would share the name {c.name!r} and its "
                             f"result folder: they differ only in {what}; pass distinct values")
    return list(by_name.values())

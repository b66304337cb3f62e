"""Per-layer low-rank ratios for the lowrank family: ``--ratio-map PATTERN=RATIO,...``.

Each PATTERN is a Python regular expression searched (``re.search``) in a factorisable layer's
path (``encoder.layers.0.intermediate``); the first rule that matches a layer sets the share
(0, 1] of its break-even parameters kept (the ``params`` rank rule; 1 in a map keeps the layer dense, while ``--ratios 1``
factorises at the break-even rank rounded down), layers
no rule matches get the variant's ``--ratios`` value. The low-rank twin of
:mod:`variants.layer_maps.bits_map` (``llama-quantize --tensor-type REGEX=type`` style). Commas
inside ``()``, ``[]`` or ``{}`` belong to the pattern.

Plain Python, no MLX (the CLI reads it).
"""

import hashlib
import math
import re

from metrics._checks import short_repr
from variants.layer_maps.bits_map import _split

FLAG = "--ratio-map"
EXAMPLE = "e.g. --ratio-map 'intermediate=0.9,layers\\.5\\.=1'"


def _bad(what, fix):
    return ValueError(f"{FLAG} {what}; {fix}")


def parse(spec):
    """Tuple of ``(pattern, ratio)`` of a ``--ratio-map`` value (``()`` for an empty one).

    Raises ValueError (one line naming the flag and the fix) for a bad entry, a regex that does
    not compile, a ratio outside (0, 1], a pattern given twice."""
    spec = (spec or "").strip()
    if not spec:
        return ()
    rules, seen = [], set()
    for entry in _split(spec):
        entry = entry.strip()
        pattern, eq, value = entry.rpartition("=")
        pattern = pattern.strip()
        if not eq or not pattern or not value.strip():
            raise _bad(f"entry {short_repr(entry)} is not PATTERN=RATIO", EXAMPLE)
        try:
            re.compile(pattern)
        except re.error as e:
            raise _bad(f"pattern {short_repr(pattern)} is not a valid regular expression ({e})",
                       "escape dots and brackets, e.g. 'layers\\.0\\.'") from None
        try:
            ratio = float(value)
        except ValueError:
            raise _bad(f"entry {short_repr(entry)}: the ratio must be a number", EXAMPLE) from None
        if not (math.isfinite(ratio) and 0 < ratio <= 1):
            raise _bad(f"entry {short_repr(entry)}: ratio {ratio:g} is outside (0, 1]",
                       "1 keeps the layer dense, 0.5 keeps half its break-even parameters")
        if pattern in seen:
            raise _bad(f"pattern {short_repr(pattern)} is given twice", "keep one entry per pattern")
        seen.add(pattern)
        rules.append((pattern, ratio))
    return tuple(rules)


def canonical(spec):
    """The normalised spec (entries ``pattern=ratio`` joined by ','); raises as :func:`parse`."""
    return ",".join(f"{p}={r:g}" for p, r in parse(spec))


def tag(spec):
    """The variant-name part: ``rmap-<hash6>`` (SHA-1 of the normalised spec); "" for none."""
    c = canonical(spec)
    return f"rmap-{hashlib.sha1(c.encode()).hexdigest()[:6]}" if c else ""


def resolve(spec, paths, default_ratio):
    """``{path: ratio}`` for every path in ``paths`` (the factorisable layers).

    Raises ValueError naming ``--ratio-map`` when a pattern matches none of ``paths``, or sets
    none of them (each layer it matches is matched first by an earlier pattern)."""
    rules = parse(spec)
    for p, _ in rules:
        if not any(re.search(p, path) for path in paths):
            raise _bad(f"pattern {short_repr(p)} matches no factorisable layer",
                       f"layer paths look like {short_repr(paths[0] if paths else '')}; fix the "
                       "pattern or drop the entry")
    first = {path: next((p for p, _ in rules if re.search(p, path)), None) for path in paths}
    for p, _ in rules:  # matches, but every layer it matches is taken by an earlier pattern
        if p not in first.values():
            earlier = first[next(path for path in paths if re.search(p, path))]
            raise _bad(f"pattern {short_repr(p)} sets no layer: each layer it matches is "
                       f"matched first by an earlier pattern (e.g. {short_repr(earlier)})",
                       "put the narrower pattern first, or drop it")
    return {path: next((r for p, r in rules if re.search(p, path)), default_ratio)
            for path in paths}

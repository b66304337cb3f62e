"""Mixed precision for the quant family: per-layer bits and group size from a ``--bits-map``.

A map is ``PATTERN=BITS[:GROUP],...``: each PATTERN is a Python regular expression searched
(``re.search``) in a quantizable layer's path (``encoder.layers.0.attention.value``); the first
rule that matches a layer sets its bits (and group size; the variant's ``--group-size`` when
omitted), layers no rule matches get the variant's ``--bits``. As ``llama-quantize
--tensor-type REGEX=type`` and mlx-lm's quant predicates. Commas inside ``()``, ``[]`` or
``{}`` belong to the pattern.

Or one shipped recipe name, after mlx-lm's ``mixed_3_6`` etc. (``mlx_lm/convert.py``
``mixed_quant_predicate_builder``, after llama.cpp's Q4_K_M): the value projection
(``attention.value``) and the FFN down projection (``output``, 1536 -> 384) of layers i with
``i < max(1, n//8)`` (the first), ``i >= min(n-1, 7n//8)`` (the last) or ``(i - n//8) % 3 == 2``
get the HIGH width, the decision head too when it is quantized; every other layer the LOW
width; group size 64 unless ``--group-size``. On MiniLM (n = 6): layers 0, 2, 5, i.e. 6 of
36 Linears (2 of them 1536-wide), so ``mixed_4_8`` stores 5.83 bits per weight at g64 (uniform 4: 5.0, 8: 9.0).
mlx-lm's rule without the max/min gives layers 2 and 5 only for n = 6 (it is tuned for
deep LLMs); we keep the first layer too.

Plain Python, no MLX (the CLI reads it).
"""

import hashlib
import re
from dataclasses import dataclass

from metrics._checks import short_repr

#: recipe name -> (low bits, high bits)
RECIPES = {"mixed_2_6": (2, 6), "mixed_3_4": (3, 4), "mixed_3_6": (3, 6), "mixed_4_6": (4, 6),
           "mixed_4_8": (4, 8)}
#: layers a recipe may raise: value and FFN down projections (BERT/RoBERTa, LLaMA-style,
#: ModernBERT names) and the decision head
HIGH = r"(attention\.value|v_proj|output|down_proj|mlp\.Wo)$"
RECIPE_VERSION = 1  # bump when the recipes' rule changes (it changes the variant names)
FLAG = "--bits-map"
EXAMPLE = "e.g. --bits-map 'layers\\.0\\.=8,value=6:32' or --bits-map mixed_4_8"


@dataclass(frozen=True)
class Rule:
    """One map entry: ``pattern`` (regex, searched in the layer path), ``bits``,
    ``group_size`` (None: the variant's)."""

    pattern: str
    bits: int
    group_size: int | None = None

    def text(self):
        return f"{self.pattern}={self.bits}" + (f":{self.group_size}" if self.group_size else "")


def _split(spec):
    """Split on commas outside (), [] and {}."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth <= 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _bad(what, fix):
    return ValueError(f"{FLAG} {what}; {fix}")


def _show(pattern):
    """A pattern quoted as the user typed it (no doubled backslashes), cut when long."""
    return f"'{pattern}'" if len(pattern) <= 120 else short_repr(pattern)


def parse(spec, bits_choices=(2, 3, 4, 6, 8), group_choices=(32, 64, 128)):
    """``(recipe, rules)`` of a ``--bits-map`` value: ``(name, ())`` for a recipe, ``(None,
    tuple of Rule)`` for patterns, ``(None, ())`` for an empty spec. Raises ValueError (one line
    naming the flag and the fix) for an unknown recipe, a bad entry, a regex that does not
    compile, bits or a group size outside the choices, a pattern given twice."""
    spec = (spec or "").strip()
    if not spec:
        return None, ()
    if "=" not in spec:
        if spec in RECIPES:
            return spec, ()
        raise _bad(f"{short_repr(spec)} is neither a recipe nor PATTERN=BITS[:GROUP] entries",
                   f"use one of {', '.join(RECIPES)} or {EXAMPLE}")
    rules, seen = [], set()
    for entry in _split(spec):
        entry = entry.strip()
        pattern, eq, value = entry.rpartition("=")
        if not eq or not pattern.strip() or not value.strip():
            raise _bad(f"entry {short_repr(entry)} is not PATTERN=BITS[:GROUP]", EXAMPLE)
        pattern = pattern.strip()
        try:
            re.compile(pattern)
        except re.error as e:
            raise _bad(f"pattern {short_repr(pattern)} is not a valid regular expression ({e})",
                       "escape dots and brackets, e.g. 'layers\\.0\\.'") from None
        b, _, g = value.strip().partition(":")
        try:
            b, g = int(b), (int(g) if g else None)
        except ValueError:
            raise _bad(f"entry {short_repr(entry)}: bits and group size must be integers",
                       EXAMPLE) from None
        if b not in bits_choices:
            raise _bad(f"entry {short_repr(entry)}: bits={b} is not supported",
                       f"choose one of {tuple(bits_choices)}")
        if g is not None and g not in group_choices:
            raise _bad(f"entry {short_repr(entry)}: group size {g} is not supported",
                       f"choose one of {tuple(group_choices)}")
        if pattern in seen:
            raise _bad(f"pattern {short_repr(pattern)} is given twice", "keep one entry per "
                       "pattern")
        seen.add(pattern)
        rules.append(Rule(pattern, b, g))
    return None, tuple(rules)


def canonical(spec):
    """The normalised spec (recipe name, or entries joined by ','); raises as :func:`parse`."""
    recipe, rules = parse(spec)
    return recipe or ",".join(r.text() for r in rules)


def tag(spec):
    """The variant-name part of a map: ``mixed_4_8-<hash6>`` or ``map-<hash6>`` (SHA-1 of the
    normalised spec, and of the recipe rule's version for a recipe); "" for no map."""
    c = canonical(spec)
    if not c:
        return ""
    recipe = c if c in RECIPES else None
    text = f"{c}|{HIGH}|v{RECIPE_VERSION}" if recipe else c
    return f"{recipe or 'map'}-{hashlib.sha1(text.encode()).hexdigest()[:6]}"


def use_more_bits(i, n):
    """Whether a recipe raises layer ``i`` of ``n`` (module docstring)."""
    return i < max(1, n // 8) or i >= min(n - 1, 7 * n // 8) or (i - n // 8) % 3 == 2


_INDEX = re.compile(r"layers\.(\d+)\.")


def recipe_rules(name, paths, group_size=None):
    """The :class:`Rule` list of recipe ``name`` for a model whose quantizable layers are
    ``paths``: one rule per raised layer (exact path), then the head."""
    low, high = RECIPES[name]
    idx = [int(m.group(1)) for p in paths if (m := _INDEX.search(p))]
    n = max(idx) + 1 if idx else 0
    rules = []
    for p in paths:
        m = _INDEX.search(p)
        raise_it = (m and use_more_bits(int(m.group(1)), n) and re.search(HIGH, p)) or \
            p == "head"
        if raise_it:
            rules.append(Rule(f"^{re.escape(p)}$", high, group_size))
    return rules


def resolve(spec, paths, default_bits, default_group):
    """``{path: (bits, group_size)}`` for every path in ``paths`` (the quantizable layers).

    Raises ValueError naming ``--bits-map`` when a pattern matches none of ``paths``, or a
    recipe raises no layer."""
    recipe, rules = parse(spec)
    if recipe:
        rules = recipe_rules(recipe, paths)
        if not rules:
            raise _bad(f"recipe {recipe} raises no layer of this model (it raises value and "
                       f"down projections: {HIGH})", "write the map as PATTERN=BITS entries")
    out = {}
    for p in paths:
        hit = next((r for r in rules if re.search(r.pattern, p)), None)
        out[p] = (hit.bits, hit.group_size or default_group) if hit else \
            (default_bits, default_group)
    for r in rules:
        if not any(re.search(r.pattern, p) for p in paths):
            raise _bad(f"pattern {_show(r.pattern)} matches no quantizable layer",
                       f"layer paths look like {short_repr(paths[0] if paths else '')} (the "
                       "head and the embedding tables are layers with --quantize-head and "
                       "--quantize-embeddings); fix the pattern or drop the entry")
    first = {p: next((r.pattern for r in rules if re.search(r.pattern, p)), None) for p in paths}
    for r in rules:  # matches, but every layer it matches is taken by an earlier pattern
        if r.pattern not in first.values():
            earlier = first[next(p for p in paths if re.search(r.pattern, p))]
            raise _bad(f"pattern {_show(r.pattern)} sets no layer: each layer it matches "
                       f"is matched first by an earlier pattern (e.g. {_show(earlier)})",
                       "put the narrower pattern first, or drop it")
    return out

"""Mixed precision for the quant family: per-layer bits and group size from a ``--bits-map``.

A map is ``PATTERN=BITS[:GROUP][:SCALE],...``: each PATTERN is a Python regular expression
searched (``re.search``) in a quantizable layer's path (``encoder.layers.0.attention.value``);
the first rule that matches a layer sets its bits (and group size; the variant's
``--group-size`` when omitted; and the precision of its scales and biases, ``f32``, ``f16`` or
``bf16``, the variant's ``--scale-dtype`` when omitted), layers no rule matches get the
variant's ``--bits``. A value may instead name a microscaling mode (``mxfp4``, ``mxfp8``,
``nvfp4``: :mod:`variants.layer_maps.formats`; its width and group size are the mode's).
The word-embedding table's rows unseen in the fit texts are the layer ``<table path>@unseen``
(:mod:`variants.families.quant.row_use`): only a pattern containing ``@`` is tried on it, and
without one those rows follow the table's own entry. As ``llama-quantize
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
EXAMPLE = ("e.g. --bits-map 'layers\\.0\\.=8,value=6:32:f16,output=mxfp4' or --bits-map "
           "mixed_4_8")
#: the suffix naming a table's rows unseen in the fit texts (a pseudo layer path)
UNSEEN = "@unseen"
_SHORT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
_MODES = ("mxfp4", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class Rule:
    """One map entry: ``pattern`` (regex, searched in the layer path), ``bits``,
    ``group_size`` (None: the variant's), ``mode`` ("affine" or a microscaling mode, whose
    bits and group size are fixed), ``scale_dtype`` (None: the variant's)."""

    pattern: str
    bits: int
    group_size: int | None = None
    mode: str = "affine"
    scale_dtype: str | None = None

    def text(self):
        if self.mode != "affine":
            return f"{self.pattern}={self.mode}"
        short = {v: k for k, v in _SHORT.items()}
        return (f"{self.pattern}={self.bits}" + (f":{self.group_size}" if self.group_size else "")
                + (f":{short[self.scale_dtype]}" if self.scale_dtype else ""))


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
        raise _bad(f"{short_repr(spec)} is neither a recipe nor PATTERN=BITS[:GROUP][:SCALE] "
                   "entries",
                   f"use one of {', '.join(RECIPES)} or {EXAMPLE}")
    rules, seen = [], set()
    for entry in _split(spec):
        entry = entry.strip()
        pattern, eq, value = entry.rpartition("=")
        if not eq or not pattern.strip() or not value.strip():
            raise _bad(f"entry {short_repr(entry)} is not PATTERN=BITS[:GROUP][:SCALE]", EXAMPLE)
        pattern = pattern.strip()
        try:
            re.compile(pattern)
        except re.error as e:
            raise _bad(f"pattern {short_repr(pattern)} is not a valid regular expression ({e})",
                       "escape dots and brackets, e.g. 'layers\\.0\\.'") from None
        tokens = [t.strip() for t in value.strip().split(":")]
        mode, scale = "affine", None
        if tokens[0] in _MODES:
            if len(tokens) > 1:
                raise _bad(f"entry {short_repr(entry)}: {tokens[0]} has its own width, group "
                           "size and scales", f"write it as PATTERN={tokens[0]}")
            from variants.layer_maps.formats import MX_SHAPE

            mode, (b, g) = tokens[0], MX_SHAPE[tokens[0]]
            fixed = True
        else:
            fixed = False
            if tokens[-1] in _SHORT and len(tokens) > 1:
                scale = _SHORT[tokens.pop()]
            if len(tokens) > 2:
                raise _bad(f"entry {short_repr(entry)} is not PATTERN=BITS[:GROUP][:SCALE]",
                           EXAMPLE)
            try:
                b, g = int(tokens[0]), (int(tokens[1]) if len(tokens) > 1 else None)
            except ValueError:
                raise _bad(f"entry {short_repr(entry)}: bits and group size must be integers "
                           f"(or a mode: {', '.join(_MODES)}; scales: f32, f16, bf16)",
                           EXAMPLE) from None
        if b not in bits_choices and not fixed:
            raise _bad(f"entry {short_repr(entry)}: bits={b} is not supported",
                       f"choose one of {tuple(bits_choices)}")
        if g is not None and g not in group_choices and not fixed:
            raise _bad(f"entry {short_repr(entry)}: group size {g} is not supported",
                       f"choose one of {tuple(group_choices)}")
        if pattern in seen:
            raise _bad(f"pattern {short_repr(pattern)} is given twice", "keep one entry per "
                       "pattern")
        seen.add(pattern)
        rules.append(Rule(pattern, b, g, mode, scale))
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
    """``{path: (bits, group_size)}`` for every path in ``paths`` (the quantizable layers); as
    :func:`resolve_formats`, which also gives each layer's mode and scale dtype."""
    return {p: (f.bits, f.group_size)
            for p, f in resolve_formats(spec, paths, default_bits, default_group).items()}


def _match(rule, path):
    """Whether ``rule`` sets ``path``: a pseudo path (``...@unseen``) only by a pattern that
    names the ``@``."""
    return re.search(rule.pattern, path) and ("@" not in path or "@" in rule.pattern)


def resolve_formats(spec, paths, default_bits, default_group, default_scale="float32",
                    default_mode="affine"):
    """``{path: Format}`` (:class:`variants.layer_maps.formats.Format`) for every path in
    ``paths`` (the quantizable layers; ``<table>@unseen`` pseudo paths for a table's rows
    unseen in the fit texts: set by an ``@`` pattern, else the table's own format).

    Raises ValueError naming ``--bits-map`` when a pattern matches none of ``paths``, or a
    recipe raises no layer."""
    from variants.layer_maps.formats import Format

    recipe, rules = parse(spec)
    if recipe:
        rules = recipe_rules(recipe, [p for p in paths if "@" not in p])
        if not rules:
            raise _bad(f"recipe {recipe} raises no layer of this model (it raises value and "
                       f"down projections: {HIGH})", "write the map as PATTERN=BITS entries")

    def fmt(hit):
        if hit is None:
            return Format(default_bits, default_group, default_mode, default_scale)
        return Format(hit.bits, hit.group_size or default_group, hit.mode,
                      hit.scale_dtype or ("float32" if hit.mode != "affine" else default_scale))
    out = {}
    for p in sorted(paths, key=lambda p: "@" in p):
        hit = next((r for r in rules if _match(r, p)), None)
        table = p.split("@")[0]
        out[p] = fmt(hit) if hit or "@" not in p or table not in out else out[table]
    out = {p: out[p] for p in paths}
    for r in rules:
        if not any(_match(r, p) for p in paths):
            raise _bad(f"pattern {_show(r.pattern)} matches no quantizable layer",
                       f"layer paths look like {short_repr(paths[0] if paths else '')} (the "
                       "head and the embedding tables are layers with --quantize-head and "
                       "--quantize-embeddings; a word table's unseen rows "
                       f"'word_embeddings{UNSEEN}'); fix the pattern or drop the entry")
    first = {p: next((r.pattern for r in rules if _match(r, p)), None) for p in paths}
    for r in rules:  # matches, but every layer it matches is taken by an earlier pattern
        if r.pattern not in first.values():
            earlier = first[next(p for p in paths if _match(r, p))]
            raise _bad(f"pattern {_show(r.pattern)} sets no layer: each layer it matches "
                       f"is matched first by an earlier pattern (e.g. {_show(earlier)})",
                       "put the narrower pattern first, or drop it")
    return out

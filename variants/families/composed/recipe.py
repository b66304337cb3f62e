"""A composed variant's recipe: the pieces it combines, as text (``--compose``, the model
TOML's ``[variant] compose``) and as the plain dict the search stores. No MLX.

A recipe is pieces joined by ``+``, each ``NAME[:ARG[:ARG]]``, in any order (the build applies
them in the fixed order of :data:`ORDER`, :mod:`variants.families.composed.build`):

=====================  ==============================================  =============================
piece                  what                                            dict entry
=====================  ==============================================  =============================
``lowrank:R[:M]``      low rank, parameter ratio R, method M           ``{"ratio", "method"}``
                       (whitened | plain | scaled; default whitened)
``q:B``                weight-only quantization of the encoder         ``{"bits"}``
                       Linears, B bits, group ``--group-size``
``w8a8`` / ``w8a8:sq`` every encoder Linear W8A8 on integer GEMMs,     ``{"smooth"}``
                       with SmoothQuant (``sq``) or not
``emb:B[:G]``          the embedding tables quantized to B bits,       ``{"bits"[, "group_size"]}``
                       group G (default ``--group-size``)
``prune:A:R``          token pruning after encoder layer A at keep     ``{"after_layer",
                       ratio R                                         "keep_ratio"}``
``exit:RULE:TARGET``   early exit, rule entropy | margin, threshold    ``{"rule", "target"}``
                       fitted to calibration agreement TARGET
``exact:dedup`` /      the exact family's de-duplication of equal      ``{"kind"[, "cache_size"]}``
``exact:cache:N``      rows in a call, or that and a result cache of
                       N rows across calls, in front of the rest
=====================  ==============================================  =============================

E.g. ``w8a8+prune:2:0.5+exit:entropy:0.99``. Each piece at most once; ``q`` and ``w8a8`` are
two answers to one question (what each Linear runs as) and do not combine, nor ``lowrank`` and
``w8a8`` (the factors are not W8A8 layers yet). Errors are ValueError, one line naming
``--compose``, the bad piece and the fix.
"""

import hashlib
import json
import math

from variants.families import name_number

#: build order (module docstring of :mod:`variants.families.composed.build`)
ORDER = ("lowrank", "quant", "w8a8", "embeddings", "prune", "exit", "exact")
#: recipe words -> dict keys
WORDS = {"lowrank": "lowrank", "q": "quant", "w8a8": "w8a8", "emb": "embeddings",
         "prune": "prune", "exit": "exit", "exact": "exact"}
INCOMPATIBLE = (("quant", "w8a8"), ("lowrank", "w8a8"))
LOWRANK_METHODS = ("whitened", "plain", "scaled")
EXIT_RULES = ("entropy", "margin")
BITS = (2, 3, 4, 5, 6, 8)
EXAMPLE = "w8a8+prune:2:0.5"


def _bad(text, why):
    return ValueError(f"--compose {text!r}: {why}; e.g. --compose {EXAMPLE} "
                      "(pieces lowrank:R, q:B, w8a8[:sq], emb:B, prune:A:R, exit:RULE:TARGET, "
                      "exact:dedup|cache:N)")


def _number(text, piece, s, kind=float):
    try:
        v = kind(s)
    except ValueError:
        raise _bad(text, f"{piece!r} has {s!r} where a number goes") from None
    if not math.isfinite(v):
        raise _bad(text, f"{piece!r} has {s!r} where a finite number goes")
    return v


def parse(text):
    """The config dict of recipe ``text`` (module docstring); raises ValueError."""
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text), "the recipe is empty")
    config = {}
    for piece in text.replace(" ", "").split("+"):
        name, *args = piece.split(":")
        key = WORDS.get(name)
        if key is None:
            raise _bad(text, f"{name!r} is not a piece")
        if key in config:
            raise _bad(text, f"{name!r} is given twice")
        n = len(args)
        if key == "lowrank":
            if n not in (1, 2):
                raise _bad(text, f"{piece!r} is not lowrank:RATIO[:METHOD]")
            r = _number(text, piece, args[0])
            m = args[1] if n == 2 else "whitened"
            if not 0 < r < 1 or m not in LOWRANK_METHODS:
                raise _bad(text, f"{piece!r} needs a ratio in (0, 1) and a method of "
                                 f"{LOWRANK_METHODS}")
            config[key] = {"ratio": r, "method": m}
        elif key == "quant":
            b = _number(text, piece, args[0], int) if n == 1 else None
            if b not in BITS:
                raise _bad(text, f"{piece!r} is not q:BITS with BITS one of {BITS}")
            config[key] = {"bits": b}
        elif key == "embeddings":
            b = _number(text, piece, args[0], int) if n in (1, 2) else None
            g = _number(text, piece, args[1], int) if n == 2 else None
            if b not in BITS or g not in (None, 32, 64, 128):
                raise _bad(text, f"{piece!r} is not emb:BITS[:GROUP] with BITS one of {BITS} "
                                 "and GROUP 32, 64 or 128")
            config[key] = {"bits": b} if g is None else {"bits": b, "group_size": g}
        elif key == "w8a8":
            if args not in ([], ["sq"]):
                raise _bad(text, f"{piece!r} is not w8a8 or w8a8:sq")
            config[key] = {"smooth": args == ["sq"]}
        elif key == "prune":
            if n != 2:
                raise _bad(text, f"{piece!r} is not prune:AFTER_LAYER:KEEP_RATIO")
            a, r = _number(text, piece, args[0], int), _number(text, piece, args[1])
            if a < 1 or not 0 < r <= 1:
                raise _bad(text, f"{piece!r} needs a layer >= 1 and a keep ratio in (0, 1]")
            config[key] = {"after_layer": a, "keep_ratio": r}
        elif key == "exact":
            if args == ["dedup"]:
                config[key] = {"kind": "dedup"}
            elif n == 2 and args[0] == "cache":
                c = _number(text, piece, args[1], int)
                if c < 1:
                    raise _bad(text, f"{piece!r} needs a cache size >= 1 (rows)")
                config[key] = {"kind": "cache", "cache_size": c}
            else:
                raise _bad(text, f"{piece!r} is not exact:dedup or exact:cache:ROWS")
        elif key == "exit":
            if n != 2 or args[0] not in EXIT_RULES:
                raise _bad(text, f"{piece!r} is not exit:RULE:TARGET with RULE one of "
                                 f"{EXIT_RULES}")
            t = _number(text, piece, args[1])
            if not 0 < t <= 1:
                raise _bad(text, f"{piece!r} needs an agreement target in (0, 1]")
            config[key] = {"rule": args[0], "target": t}
    check(config, text)
    return {k: config[k] for k in ORDER if k in config}


def check(config, text=None):
    """Raise ValueError for an incompatible pair of pieces in ``config``."""
    for a, b in INCOMPATIBLE:
        if a in config and b in config:
            raise _bad(text or recipe_of(config),
                       f"{a} and {b} do not combine (both decide what a Linear runs as)")


def recipe_of(config):
    """The canonical recipe text of ``config`` (pieces in build order): ``parse`` inverts it."""
    parts = []
    for k in ORDER:
        if k not in config:
            continue
        v = config[k]
        if k == "lowrank":
            parts.append(f"lowrank:{_n(v['ratio'])}" + (
                "" if v.get("method", "whitened") == "whitened" else f":{v['method']}"))
        elif k == "quant":
            parts.append(f"q:{v['bits']}")
        elif k == "w8a8":
            parts.append("w8a8:sq" if v.get("smooth") else "w8a8")
        elif k == "embeddings":
            parts.append(f"emb:{v['bits']}" + (f":{v['group_size']}" if "group_size" in v
                                                else ""))
        elif k == "prune":
            parts.append(f"prune:{v['after_layer']}:{_n(v['keep_ratio'])}")
        elif k == "exit":
            parts.append(f"exit:{v.get('rule', 'entropy')}:{_n(v['target'])}")
        elif k == "exact":
            parts.append("exact:dedup" if v["kind"] == "dedup"
                         else f"exact:cache:{v['cache_size']}")
    return "+".join(parts)


def name_of(config):
    """The variant (folder) name: the pieces in build order, e.g. ``w8a8+prune-a2-r0.5``."""
    parts = []
    for k in ORDER:
        if k not in config:
            continue
        v = config[k]
        if k == "lowrank":
            parts.append(f"lr-{v.get('method', 'whitened')}-p{_n(v['ratio'])}")
        elif k == "quant":
            parts.append(f"q{v['bits']}")
        elif k == "w8a8":
            parts.append("w8a8-sq" if v.get("smooth") else "w8a8")
        elif k == "embeddings":
            parts.append(f"emb{v['bits']}" + (f"g{v['group_size']}" if "group_size" in v else ""))
        elif k == "prune":
            parts.append(f"prune-a{v['after_layer']}-r{_n(v['keep_ratio'])}")
        elif k == "exit":
            e = v
            parts.append(f"exit-{e.get('rule', 'entropy')}-" + (
                f"ag{_n(e['target'])}" if e.get("target") is not None
                else f"t{_n(e['threshold'])}"))
        elif k == "exact":
            parts.append("dedup" if v["kind"] == "dedup" else f"cache-{v['cache_size']}")
    return "+".join(parts) or "reference"


def _n(x):
    """``x`` as ``:g`` writes it when that reads back exactly, else its shortest exact form
    (0.9999999 stays 0.9999999: a recipe's or a name's number is never rounded)."""
    return name_number(x, "g")


def composed_id(config):
    """12 hex digits over the canonical JSON of ``config`` (the same config, the same id)."""
    text = json.dumps(config, sort_keys=True)
    return hashlib.sha1(("composed" + text).encode()).hexdigest()[:12]

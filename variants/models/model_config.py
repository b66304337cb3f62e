"""The model TOML: one file that says how a checkpoint makes a decision (``--model-config``).

Parsed with :mod:`tomllib` into a :class:`ModelConfig`; every problem is one
:class:`ModelConfigError` line naming the file, the key and the fix (an unknown key names the
closest known one). Commented examples, one per logits kind: ``examples/model-*.toml``.

Keys (all top level unless in a table)::

    name = "my-model"                 # required: run and cache names
    logits = "classifier"             # required: classifier | linear-head | cosine | marker
    checkpoint = "path/to/folder"     # relative to this file's folder; absent = bundled MiniLM
    max_length = 512                  # tokens per text (absent: the tokenizer files'; the
                                      # --max-length flag overrides it)
    prompt = "{text}"                 # what the model reads: {text}, {question}, {options}
    question = "..."                  # the {question} of every row
    options = ["neg", "neu", "pos"]   # fixed options (absent: per task, per row, or id2label)
    scores = [-1.0, 0.0, 1.0]         # one number per option (optional)
    actions = ["escalate", "review", "none"]   # option -> action, one per option
    action_names = ["escalate", "review", "none"]  # the actions (default: those in actions)
    factory = "package.module:callable"  # optional: your own DecisionModel(checkpoint, config)
    [temperature]  mode = "fit" | "fixed";  values = {"3" = 0.1}   # fixed: one T per option count
    [tasks.NAME]   options / scores / actions   # several questions (the bundled data's tasks)
    [cosine]       scale = 20.0
    [linear_head]  C = 10.0
    [marker]       token = "[unused0]"; scorer = "fit" | "<tensor name>"; C = 1.0
    [quant]        bits_map = "mixed_4_8" | "PATTERN=BITS[:GROUP],..."  # the quant family's
                   # default --bits-map (variants.layer_maps.bits_map; the flag overrides it)
                   method = ["gptq", "rtn"]   # its default --quant-method (the flag overrides)
                   scale_dtype = "float16"; mode = "affine" | "mxfp4" | "mxfp8" | "nvfp4"
                   # its default --scale-dtype / --quant-mode (the flags override)
    [lowrank]      ratio_map = "PATTERN=RATIO,..."   # the lowrank family's default --ratio-map
"""

import difflib
import math
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from metrics._checks import short_repr

KINDS = ("classifier", "linear-head", "cosine", "marker")
TEMPERATURE_MODES = ("fit", "fixed")
PLACEHOLDERS = ("text", "question", "options")
TOP_KEYS = ("name", "logits", "checkpoint", "max_length", "prompt", "question", "options",
            "scores", "actions", "action_names", "factory", "temperature", "tasks", "cosine",
            "linear_head", "marker", "quant", "lowrank")
TABLE_KEYS = {"temperature": ("mode", "values"), "cosine": ("scale",), "linear_head": ("C",),
              "marker": ("token", "scorer", "C"), "task": ("options", "scores", "actions"),
              "quant": ("bits_map", "method", "scale_dtype", "mode"), "lowrank": ("ratio_map",)}
DEFAULT_PROMPT = {"marker": "{question} {options}"}
#: fixed temperatures take the fit's own range (metrics.temperature_fit.BOUNDS)
T_BOUNDS = (1e-3, 1e3)


class ModelConfigError(ValueError):
    """A bad model TOML; the one-line message names the file, the key and the fix."""


@dataclass
class ModelConfig:
    """A parsed, validated model TOML (see the module docstring for the keys).

    ``checkpoint`` is resolved against the TOML's folder (None = the bundled MiniLM);
    ``temperature_values`` maps option count K (int) to a fixed T > 0; ``tasks`` maps a task name
    to ``{"options", "scores", "actions"}``.
    """

    path: Path
    name: str
    logits: str
    checkpoint: Path | None = None
    max_length: int | None = None  # tokens per text; None = the tokenizer files'
    prompt: str = "{text}"
    question: str = ""
    options: list | None = None
    scores: list | None = None
    actions: list | None = None
    action_names: list | None = None
    factory: str | None = None
    temperature_mode: str = "fit"
    temperature_values: dict = field(default_factory=dict)
    tasks: dict | None = None
    cosine_scale: float = 20.0
    linear_head_C: float = 10.0
    marker_token: str = "[unused0]"
    marker_scorer: str = "fit"
    marker_C: float = 1.0
    quant_bits_map: str = ""  # [quant] bits_map, normalised ("" = none)
    quant_method: tuple = ()  # [quant] method ((): none, the flag's default rtn)
    quant_scale_dtype: str = ""  # [quant] scale_dtype ("": the flag's default)
    quant_mode: str = ""  # [quant] mode ("": the flag's default)
    lowrank_ratio_map: str = ""  # [lowrank] ratio_map, normalised ("" = none)

    def to_dict(self):
        """JSON-able, as recorded in run.json (``model.config``) and the cache keys."""
        d = asdict(self)
        d["path"] = str(self.path)
        d["checkpoint"] = None if self.checkpoint is None else str(self.checkpoint)
        d["temperature_values"] = {str(k): v for k, v in self.temperature_values.items()}
        for key in ("quant_bits_map", "lowrank_ratio_map", "max_length", "quant_method",
                    "quant_scale_dtype", "quant_mode"):
            if not d[key]:  # absent: the keys of TOMLs without the table stay as they were
                del d[key]
        return d


def _fail(path, key, msg):
    raise ModelConfigError(f"{path}: {key}: {msg}")


def _check_keys(path, table, known, where=""):
    for k in table:
        if k not in known:
            near = [n for n in known if n.lower() == str(k).lower()] or \
                difflib.get_close_matches(str(k), known, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(known)}"
            _fail(path, f"{where}{short_repr(k)}", f"unknown key; {hint}")


def _str(path, key, v):
    if not isinstance(v, str) or not v.strip():
        _fail(path, key, f"must be a non-empty string, got {short_repr(v)}")
    return v


def _num(path, key, v, positive=True):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (positive and v <= 0):
        _fail(path, key, f"must be a finite number > 0, got {short_repr(v)}")
    return float(v)


def _strings(path, key, v):
    if not isinstance(v, list) or not v or not all(isinstance(s, str) and s for s in v):
        _fail(path, key, f"must be a non-empty list of non-empty strings, got {short_repr(v)}")
    return list(v)


def _numbers(path, key, v, n):
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                      or not math.isfinite(x) for x in v):
        _fail(path, key, f"must be a list of finite numbers, got {short_repr(v)}")
    if len(v) != n:
        _fail(path, key, f"has {len(v)} entries but there are {n} options; give one per option")
    return [float(x) for x in v]


def _option_block(path, where, options, scores, actions):
    """Validate one options / scores / actions triple; returns them (scores, actions may be None)."""
    options = _strings(path, f"{where}options", options)
    if len(options) < 2:
        _fail(path, f"{where}options", "has 1 option; give at least 2 (a decision between them)")
    if len(set(options)) != len(options):
        _fail(path, f"{where}options", "has duplicate option texts; make each one distinct")
    if scores is not None:
        scores = _numbers(path, f"{where}scores", scores, len(options))
    if actions is not None:
        actions = _strings(path, f"{where}actions", actions)
        if len(actions) != len(options):
            _fail(path, f"{where}actions", f"has {len(actions)} entries but there are "
                  f"{len(options)} options; give the action of each option")
    return options, scores, actions


def _check_prompt(path, prompt):
    import string

    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None]
    except ValueError as e:
        _fail(path, "prompt", f"is not a valid template ({e}); write {{text}}, {{question}}, "
              "{options}; double a literal brace as {{ or }}")
    bad = [f for f in fields if f not in PLACEHOLDERS]
    if bad:
        _fail(path, "prompt", f"unknown placeholder {{{bad[0]}}}; use {{text}}, {{question}} or "
              "{options}")


#: the fewest tokens per text: [CLS] + one token + [SEP] (a smaller limit cuts every text empty)
MIN_MAX_LENGTH = 3


def check_max_length(v, where):
    """``v`` as a max length (int >= :data:`MIN_MAX_LENGTH`); ModelConfigError naming ``where``
    (the TOML key or the flag) otherwise. The checkpoint's position table bounds it from above
    (:func:`variants.checkpoints.files.decide_tokenizer`)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < MIN_MAX_LENGTH:
        raise ModelConfigError(f"{where} must be a whole number of tokens >= {MIN_MAX_LENGTH} "
                               f"(special tokens included), got {short_repr(v)}; e.g. 512")
    return v


def parse_model_config(raw, path):
    """A :class:`ModelConfig` from the TOML table ``raw`` (a dict) read from ``path``.

    Raises
    ------
    ModelConfigError
        Naming the file, the key and the fix.
    """
    path = Path(path)
    _check_keys(path, raw, TOP_KEYS)
    for table, keys in TABLE_KEYS.items():
        if table in raw:
            if not isinstance(raw[table], dict):
                _fail(path, table, f"must be a table [{table}], got {short_repr(raw[table])}")
            _check_keys(path, raw[table], keys, f"[{table}] ")
    for key in ("name", "logits"):
        if key not in raw:
            _fail(path, key, f"is missing; add {key} = "
                  + ('"my-model"' if key == "name" else f"one of {', '.join(KINDS)}"))
    name = _str(path, "name", raw["name"])
    from runs.names import name_problem

    if name_problem(name, csv=True):  # it names run folders and cache files
        _fail(path, "name", f"{short_repr(name)} must be a plain name: it "
              f"{name_problem(name, csv=True)}; e.g. name = \"my-model\"")
    kind = raw["logits"]
    if kind not in KINDS:
        near = difflib.get_close_matches(str(kind), KINDS, n=1)
        _fail(path, "logits", f"{short_repr(kind)} is not a logits kind; choose one of "
              f"{', '.join(KINDS)}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    cfg = ModelConfig(path=path, name=name, logits=kind,
                      prompt=raw.get("prompt", DEFAULT_PROMPT.get(kind, "{text}")))
    if "checkpoint" in raw:
        cfg.checkpoint = (path.parent / _str(path, "checkpoint", raw["checkpoint"])).resolve()
    if "max_length" in raw:
        cfg.max_length = check_max_length(raw["max_length"], f"{path}: max_length")
    _check_prompt(path, _str(path, "prompt", cfg.prompt))
    if "question" in raw:
        cfg.question = _str(path, "question", raw["question"])
    if "factory" in raw:
        cfg.factory = _str(path, "factory", raw["factory"])
        if ":" not in cfg.factory:
            _fail(path, "factory", f"{short_repr(cfg.factory)} must be 'package.module:callable'")
    if "options" in raw:
        cfg.options, cfg.scores, cfg.actions = _option_block(
            path, "", raw["options"], raw.get("scores"), raw.get("actions"))
    else:
        for key in ("scores", "actions"):
            if key in raw:
                _fail(path, key, "needs fixed options; add options = [...] or move it into a "
                      "[tasks.NAME] table")
    if "tasks" in raw:
        if "options" in raw:
            _fail(path, "tasks", "and options are both given; keep one of them")
        if not isinstance(raw["tasks"], dict) or not raw["tasks"]:
            _fail(path, "tasks", "must hold at least one [tasks.NAME] table")
        cfg.tasks = {}
        for tname, t in raw["tasks"].items():
            if not isinstance(t, dict):
                _fail(path, f"tasks.{tname}", "must be a table with options, scores, actions")
            _check_keys(path, t, TABLE_KEYS["task"], f"[tasks.{tname}] ")
            if "options" not in t:
                _fail(path, f"[tasks.{tname}] options", "is missing; list the option texts")
            o, s, a = _option_block(path, f"[tasks.{tname}] ", t["options"], t.get("scores"),
                                    t.get("actions"))
            cfg.tasks[tname] = {"options": o, "scores": s, "actions": a}
    if "action_names" in raw:
        cfg.action_names = _strings(path, "action_names", raw["action_names"])
    used = [a for a in (cfg.actions or []) + [a for t in (cfg.tasks or {}).values()
                                              for a in (t["actions"] or [])]]
    if cfg.action_names is None:
        cfg.action_names = list(dict.fromkeys(used)) or None
    else:
        unknown = [a for a in used if a not in cfg.action_names]
        if unknown:
            _fail(path, "actions", f"{short_repr(unknown[0])} is not in action_names "
                  f"{cfg.action_names}; add it there or fix the spelling")
    temp = raw.get("temperature", {})
    cfg.temperature_mode = temp.get("mode", "fit")
    if cfg.temperature_mode not in TEMPERATURE_MODES:
        _fail(path, "[temperature] mode", f"{short_repr(cfg.temperature_mode)}; choose "
              f"{' or '.join(TEMPERATURE_MODES)}")
    values = temp.get("values")
    if cfg.temperature_mode == "fixed":
        if not isinstance(values, dict) or not values:
            _fail(path, "[temperature] values", 'is needed with mode = "fixed": one T per option '
                  'count, e.g. values = {"3" = 0.1}')
        for k, t in values.items():
            if not (k.isdigit() and int(k) >= 1):
                _fail(path, f"[temperature] values.{short_repr(k)}", "must be an option count "
                      '(a whole number >= 1 in quotes), e.g. "3" = 0.1')
            cfg.temperature_values[int(k)] = _num(path, f"[temperature] values.{k}", t)
            lo, hi = T_BOUNDS
            if not lo <= cfg.temperature_values[int(k)] <= hi:
                _fail(path, f"[temperature] values.{k}", f"must be between {lo:g} and {hi:g} "
                      f"(the range temperatures are fitted in), got {short_repr(t)}")
    elif values is not None:
        _fail(path, "[temperature] values", 'is only read with mode = "fixed"; add it or drop '
              "values")
    if "cosine" in raw and "scale" in raw["cosine"]:
        cfg.cosine_scale = _num(path, "[cosine] scale", raw["cosine"]["scale"])
    if "linear_head" in raw and "C" in raw["linear_head"]:
        cfg.linear_head_C = _num(path, "[linear_head] C", raw["linear_head"]["C"])
    m = raw.get("marker", {})
    if "token" in m:
        cfg.marker_token = _str(path, "[marker] token", m["token"])
    if "scorer" in m:
        cfg.marker_scorer = _str(path, "[marker] scorer", m["scorer"])
    if "C" in m:
        cfg.marker_C = _num(path, "[marker] C", m["C"])
    from variants.layer_maps import bits_map, ratio_map

    for table, key, mod, attr in (("quant", "bits_map", bits_map, "quant_bits_map"),
                                  ("lowrank", "ratio_map", ratio_map, "lowrank_ratio_map")):
        if key not in raw.get(table, {}):  # a family's per-layer map: its flag's default
            continue
        where = f"[{table}] {key}"
        try:
            setattr(cfg, attr, mod.canonical(_str(path, where, raw[table][key])))
        except ModelConfigError:
            raise
        except ValueError as e:
            _fail(path, where, str(e).replace(f"{mod.FLAG} ", "", 1))
    if "method" in raw.get("quant", {}):
        from variants.defaults import QUANT_METHODS as METHODS

        methods = raw["quant"]["method"]
        methods = [methods] if isinstance(methods, str) else methods
        if not (isinstance(methods, list) and methods
                and all(isinstance(m, str) and m in METHODS for m in methods)):
            _fail(path, "[quant] method", f"{short_repr(methods)} is not a list of quantizers "
                  f"from {' '.join(METHODS)}; e.g. method = [\"gptq\", \"rtn\"]")
        cfg.quant_method = tuple(dict.fromkeys(methods))
    from variants.layer_maps import formats

    for key, attr, check in (("scale_dtype", "quant_scale_dtype", formats.check_scale_dtype),
                             ("mode", "quant_mode", formats.check_mode)):
        if key in raw.get("quant", {}):
            value = _str(path, f"[quant] {key}", raw["quant"][key])
            try:
                check(value, flag=f"[quant] {key}")
            except ValueError as e:
                _fail(path, f"[quant] {key}", str(e).replace(f"[quant] {key} ", "", 1))
            setattr(cfg, attr, value)
    for table, k in (("cosine", "cosine"), ("linear_head", "linear-head"), ("marker", "marker")):
        if table in raw and kind != k:
            _fail(path, f"[{table}]", f"applies to logits = {k!r}, but logits = {kind!r}; "
                  "drop the table or change logits")
    if kind == "marker" and "{options}" not in cfg.prompt:
        _fail(path, "prompt", "a marker prompt must contain {options} (each option is introduced "
              "by the marker token there)")
    if kind == "linear-head" and cfg.options is None:
        _fail(path, "options", "is needed for logits = \"linear-head\" (the head's classes); add "
              'options = ["negative", "neutral", "positive"]')
    return cfg


def load_model_config(path):
    """Read and validate the model TOML at ``path``. Returns :class:`ModelConfig`.

    Raises
    ------
    ModelConfigError
        Missing/unreadable file, invalid TOML (with its line), or a bad key (see
        :func:`parse_model_config`).
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a BOM (Notepad) is dropped
    except FileNotFoundError:
        raise ModelConfigError(f"{path}: no such model TOML file; check the path given to "
                               "--model-config") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{path}: cannot be read as UTF-8 TOML ({e}); pass a text "
                               "file") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ModelConfigError(f"{path}: not valid TOML ({e}); fix the syntax there") from None
    return parse_model_config(raw, path)

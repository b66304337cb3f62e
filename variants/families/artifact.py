"""A built variant's weights folder: what ``variants export`` ships and what a sweep's cold start
loads (the same files, byte for byte in layout).

:func:`write_weights` writes ``model.safetensors`` (every tensor of the reference checkpoint
under its transformers name, :mod:`variants.checkpoints.hf_names`: each quantized module as
``weight`` packed uint32, ``scales`` and ``biases`` exactly as ``mlx.nn.quantize`` makes them,
what the variant does not change as the checkpoint has it), ``decision_head.safetensors`` (a
decision head fitted here, by module path; only when there is one), ``config.json`` (the
original checkpoint's config, plus mlx-lm's ``quantization`` block keyed by the same names and
an ``mlx_variants`` block: the decision model's kind, temperatures, low-rank factor shapes, head
skeleton, names map, and ``wrapper``: the settings of a token-pruning or early-exit rule around
the module, :mod:`variants.families.wrapper_place`, whose exit heads go to
``decision_head.safetensors`` as ``exit_heads.<i>.*``), the tokenizer files and
``model.toml``. :func:`load_variant` loads it back packed: the skeleton from the configs,
factored layers put in place, each stored tensor put at its module path, ``mlx.nn.quantize``
with mlx-lm's predicate, ``load_weights(strict=True)``, then the rule's wrapper put back around
it — nothing re-quantized, no fp32 checkpoint read, nothing built.
A folder of format 1 (module paths as names) still loads.

Only families whose variant is a set of weights MLX loads, or such a set wrapped by token
pruning or early exit, write one (:data:`EXPORTABLE`); the others say why in one line
(:data:`NOT_EXPORTABLE`).
"""

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

from metrics._checks import short_path
from runs.io import file_sha256

#: 2: model.safetensors under the original checkpoint's names (1: the decision model's module
#: paths, still read)
FORMAT_VERSION = 2
#: families whose variant is a set of weights (quantized and/or factored Linears; W8A8's int8
#: Linears, which only this package's loaders read: :mod:`variants.arch.int8_place`), or such a
#: set wrapped by token pruning or early exit (the rule's settings and exit heads beside them:
#: :mod:`variants.families.wrapper_place`; only this package's loader runs the rule)
EXPORTABLE = ("quant", "lowrank", "w8a8", "prune", "exit", "composed")
#: why the other families do not export (one line each)
NOT_EXPORTABLE = {
    "student": "a student is a new network trained here; export its folder with its own code",
    "exact": "the exact family is a compute path, not weights (its weights are the reference's)",
    "onnx": "its weights are the ONNX file it ran (build.json's graph); ship that file",
    "outputs": "logits judged from a file; there is no model to export",
}
#: the config.json block that marks a variant's weights folder
BLOCK = "mlx_variants"
#: tokenizer files copied when the checkpoint has them
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "merges.txt", "vocab.json", "sentencepiece.bpe.model")


def _entry(setting, default=None):
    """A quantization block's entry for ``setting`` ((group size, bits, mode) or False)."""
    if setting is False:
        return False
    gs, bits, mode = setting
    entry = {"group_size": int(gs), "bits": int(bits)}
    if mode != (default[2] if default else "affine"):
        entry["mode"] = mode
    return entry


def quantization_blocks(module, names):
    """``(block, head_block)``: mlx-lm's ``quantization`` config block of ``module`` keyed by
    transformers module paths (names map ``names``,
    :func:`variants.checkpoints.hf_names.name_of`): the most common (group size, bits, mode)
    as defaults, a ``{"group_size", "bits"}`` entry per quantized module that differs, and
    ``false`` for each module of a quantizable type left full precision; and the entries of
    the modules with no transformers name (a fitted decision head), keyed by module path and
    each explicit. ``(None, None)`` when nothing is quantized.

    Raises
    ------
    ValueError
        Modules sharing one stored tensor (ALBERT's layers) quantized differently.
    """
    import mlx.nn as nn

    from variants.checkpoints.hf_names import name_of

    settings = {}
    for p, m in module.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            settings[p] = (m.group_size, m.bits, getattr(m, "mode", "affine"))
        elif type(m) in (nn.Linear, nn.Embedding):
            settings[p] = False
    quant = [s for s in settings.values() if s is not False]
    if not quant:
        return None, None
    default, _ = max(Counter(quant).items(), key=lambda kv: (kv[1], -kv[0][1]))
    named, own, by = {}, {}, {}
    for p, s in sorted(settings.items()):
        name = name_of(p, names)
        if name is None:
            own[p] = _entry(s)
        elif name in named and named[name] != s:
            raise ValueError(f"{by[name]} and {p} share the checkpoint's {name} but are "
                             "quantized differently; export a variant that treats shared "
                             "layers alike")
        else:
            named[name], by[name] = s, p
    block = {"group_size": int(default[0]), "bits": int(default[1]), "mode": default[2]}
    block.update({n: _entry(s, default) for n, s in sorted(named.items()) if s != default})
    return block, own


def toml_text(source):
    """The model TOML's text without its ``checkpoint`` key (the folder is the checkpoint);
    None for a model with no TOML file."""
    if source.config is None or source.config.path is None:
        return None
    lines, top = [], True
    for line in Path(source.config.path).read_text().splitlines():
        top = top and not line.lstrip().startswith("[")
        if top and line.split("=", 1)[0].strip() == "checkpoint":
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_weights(model, checkpoint, source, out, *, family, variant, variant_config,
                  batch_size=None, near_tie_margin=None):
    """Write ``model``'s weights folder into the existing folder ``out``.

    Parameters
    ----------
    model : variants.models.decision.DecisionModel
        The variant as it runs (packed: built in the ``native`` mode), fitted head and
        temperatures included; its module plain or one token-pruning / early-exit wrapper
        around a plain module (:func:`variants.families.wrapper_place.wrapper_block`).
    checkpoint : variants.checkpoints.load.Checkpoint
        The reference checkpoint it was built from (its config.json, tokenizer files, head).
    source : variants.models.configured.ModelSource
        The decision model's kind (its TOML is written as ``model.toml``).
    out : Path
    family, variant : str
    variant_config : dict
        The variant's config (build.json ``config``).
    batch_size : int, optional
    near_tie_margin : float, optional

    The block records ``max_length`` ([tokens, where the run's choice came from]): the
    folder loads at the length it was judged at, a model TOML's or ``--max-length``'s
    included (:func:`variants.checkpoints.packed.skeleton`).

    Returns
    -------
    dict
        The config.json written (the ``quantization`` block is None-free: absent when nothing
        is quantized).

    Raises
    ------
    ValueError
        A module this format cannot store (another wrapper, nested wrappers; one line).
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from variants.arch.input_scaled import input_scaled_paths
    from variants.arch.int8_place import int8_layers
    from variants.arch.lowrank import factor_shapes
    from variants.checkpoints import hf_names
    from variants.checkpoints.packed import OWN_FILE
    from variants.runtime.row_embedding import row_embedding_block
    from variants.families.wrapper_place import wrapper_block

    out = Path(out)
    module, wrapper, wrapper_tensors = wrapper_block(model.module)  # the inner plain module
    with_head = (getattr(module, "classifier", None) is not None
                 and checkpoint.classifier is not None)
    names, stored, kept, head = hf_names.checkpoint_names(checkpoint, with_head)
    named, own = hf_names.split(dict(tree_flatten(module.parameters())), names)
    named.update({k: stored[k] for k in kept})  # as the checkpoint has them
    quant, own_quant = quantization_blocks(module, names)
    clash = sorted(set(own) & set(wrapper_tensors))
    if clash:
        raise ValueError(f"the decision module's {clash[0]} has the name of an exit head's "
                         "tensor; rename the module's attribute")
    own.update(wrapper_tensors)  # the wrapper's own (exit heads), by its module paths
    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(named.items())),
                        metadata={"format": "mlx"})
    sha = file_sha256(out / "model.safetensors")
    if own:
        mx.save_safetensors(str(out / OWN_FILE), dict(sorted(own.items())),
                            metadata={"format": "mlx"})
        blob = f"model.safetensors {sha}\n{OWN_FILE} {file_sha256(out / OWN_FILE)}"
        sha = hashlib.sha256(blob.encode()).hexdigest()
    config = json.loads((Path(checkpoint.path) / "config.json").read_text())
    config.pop(BLOCK, None)
    config.pop("quantization", None)
    if not config.get("model_type"):  # a folder named by architectures only: loaders read this
        from variants.checkpoints.files import model_type

        config["model_type"] = model_type(config, Path(checkpoint.path) / "config.json")
    if quant:
        config["quantization"] = quant
    config[BLOCK] = {
        "format_version": FORMAT_VERSION, "variant": variant, "family": family,
        "variant_config": variant_config, "model": source.name, "kind": source.kind,
        "factory": source.factory,
        "temperatures": {str(k): float(v) for k, v in model.temperatures.items()},
        "reference_checkpoint": str(checkpoint.path), "batch_size": batch_size,
        "near_tie_margin": near_tie_margin, "lowrank": factor_shapes(module),
        "input_scaled": input_scaled_paths(module), "w8a8": int8_layers(module) or None,
        "row_embedding": row_embedding_block(module),
        "wrapper": wrapper, "hf_head": head,
        "names": names, "kept": kept, "decision_head": OWN_FILE if own else None,
        "head_quantization": own_quant or None, "weights_sha256": sha,
        "max_length": [int(checkpoint.tokenizer.max_length), str(
            (checkpoint.tokenizer.decided or {}).get("max_length", "the judged tokenizer"))]}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (Path(checkpoint.path) / name).is_file():
            shutil.copyfile(Path(checkpoint.path) / name, out / name)
    toml = toml_text(source)
    if toml is not None:
        (out / "model.toml").write_text(toml)
    return config


def load_variant(path, max_length=None):
    """The decision model of weights folder ``path`` (:func:`write_weights`), packed.

    ``max_length``: (tokens, where set) as :func:`variants.checkpoints.load.load_checkpoint`
    takes it; None = what the folder's tokenizer files and model TOML say.

    Returns
    -------
    model : variants.models.decision.DecisionModel
        Its module holds ``nn.QuantizedLinear`` / ``nn.QuantizedEmbedding`` layers where the
        variant is quantized (the CPU path of :mod:`variants.runtime.qlinear` on a CPU),
        :class:`variants.arch.lowrank.LowRankLinear` where it is factored,
        :class:`variants.runtime.row_embedding.RowWidthEmbedding` where a word table
        is stored by use, :class:`variants.runtime.int8_linear.Int8Linear` where it runs W8A8
        (the stored int8 codes, scales and SmoothQuant factors;
        :mod:`variants.arch.int8_place`), its temperatures the judged ones; wrapped, as built,
        by the folder's token-pruning or early-exit rule (``PrunedNet`` / ``ExitNet`` with the
        stored exit heads: :func:`variants.families.wrapper_place.place_wrapper`).
    checkpoint : variants.checkpoints.load.Checkpoint
        Its encoder and classifier are the model's own (packed) modules (inside the wrapper).

    Raises
    ------
    variants.checkpoints.files.CheckpointError
        Not a weights folder, a file missing, weights that do not match the skeleton.
    """
    import mlx.core as mx
    import mlx.nn as nn

    from variants.arch.input_scaled import check_paths, place_input_scales
    from variants.arch.int8_place import check_layers, place_int8
    from variants.arch.lowrank import place_lowrank
    from variants.checkpoints.files import CheckpointError
    from variants.checkpoints.load import Checkpoint, TextTokenizer, _build
    from variants.checkpoints.packed import (OWN_FILE, is_export, module_weights, one_line,
                                             quant_predicate, skeleton)
    from variants.runtime.row_embedding import place_row_embeddings
    from variants.families.wrapper_place import check_block, place_wrapper, split_tensors
    from variants.models import resolve
    from variants.runtime import qlinear

    path = Path(path)
    if not is_export(path):
        raise CheckpointError(f"{short_path(path)} is not an exported variant (config.json has "
                              f"no {BLOCK} block); export one with variants export")
    config = json.loads((path / "config.json").read_text())
    block = config[BLOCK]
    ck = skeleton(path, config, (Checkpoint, TextTokenizer, _build), max_length)
    toml = path / "model.toml"
    source = resolve(model_config=toml) if toml.exists() else resolve(model=block["factory"])
    source.bind(ck)
    model = source.build(ck)
    module = model.module
    place_lowrank(module, block.get("lowrank", {}))
    try:
        place_input_scales(module, check_paths(block.get("input_scaled")))
        place_int8(module, check_layers(block.get("w8a8")))
        place_row_embeddings(module, block.get("row_embedding"))
        wrapper = check_block(block.get("wrapper"))
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{short_path(path / 'config.json')} does not match the model "
                              f"({e.args[0]}); export the variant again") from None
    wfile = path / "model.safetensors"
    weights, q = module_weights(path, config)
    weights, wrapper_tensors = split_tensors(weights)
    if "group_size" in q:
        nn.quantize(module, group_size=q["group_size"], bits=q["bits"],
                    mode=q.get("mode", "affine"), class_predicate=quant_predicate(q, weights))
    try:
        module.load_weights(list(weights.items()), strict=True)
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{short_path(wfile)} does not match its config.json "
                              f"({one_line(e)}); "
                              "export the variant again") from None
    mx.eval(module.parameters())
    module.eval()
    qlinear.use_cpu_path(module)
    try:
        wrapped = place_wrapper(module, wrapper, wrapper_tensors)
    except ValueError as e:
        raise CheckpointError(f"{short_path(path / OWN_FILE)} does not match config.json's "
                              f"{BLOCK}.wrapper ({one_line(e)}); export the variant "
                              "again") from None
    if wrapped is not module:  # the rule around the packed module, as the variant was built
        wrapped.eval()
        model = model.replace_module(wrapped)
    model.temperatures = {int(k): float(v) for k, v in block["temperatures"].items()}
    try:
        model = _exact_piece(model, block)
    except ValueError as e:
        raise CheckpointError(f"{short_path(path / 'config.json')}: {BLOCK}.variant_config does "
                              f"not match the folder ({one_line(e)}); export the variant "
                              "again") from None
    ck.encoder = module.encoder
    ck.classifier = getattr(module, "classifier", None) if block.get("hf_head") else None
    return model, ck


def _exact_piece(model, block):
    """A composed variant's ``exact`` piece (de-duplication, result cache) put back around the
    loaded model, as it was built (:mod:`variants.families.composed.build`); the model as is
    otherwise. It stores nothing: the recipe in ``variant_config`` says it."""
    if block.get("family") != "composed":
        return model
    from variants.families.composed.recipe import parse

    try:
        config = parse((block.get("variant_config") or {}).get("recipe", ""))
    except ValueError:
        raise ValueError("its recipe is not one --compose reads") from None
    w = block.get("wrapper") or {}
    kind = "exit" if "exit" in config else "prune" if "prune" in config else None
    if w.get("kind") != kind:
        raise ValueError(f"the recipe has {kind or 'no'} rule, the wrapper "
                         f"{w.get('kind') or 'none'}")
    if "prune" in config:
        p = w if kind == "prune" else (w.get("prune") or {})
        want = [[config["prune"]["after_layer"], config["prune"]["keep_ratio"]]]
        if p.get("points") != want:
            raise ValueError(f"the recipe prunes at {want}, the wrapper at {p.get('points')}")
    exact = config.get("exact")
    if exact is None:
        return model
    from variants.families.exact.build import exact_model

    return exact_model(model, exact.get("cache_size"))

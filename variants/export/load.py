"""Load an exported folder (:mod:`variants.export`) packed: the decision model's skeleton is built
from ``config.json`` and ``model.toml``, factored layers are put in place from the
``mlx_variants`` block, ``mlx.nn.quantize`` is applied with the ``quantization`` block's
predicate (mlx-lm's ``load_model`` rule: a module listed there takes its entry, ``false`` keeps
it full precision), and ``load_weights(strict=True)`` fills every array from
``model.safetensors``. Nothing is re-quantized: the packed integers, scales and biases are the
file's.
"""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from metrics._checks import short_path

#: the config.json block that marks an exported folder
BLOCK = "mlx_variants"


def is_export(path):
    """Whether folder ``path`` is an exported variant (its config.json has :data:`BLOCK`)."""
    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and BLOCK in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def quant_predicate(quantization, weights):
    """mlx-lm's class predicate (``mlx_lm.utils.load_model``) for ``nn.quantize`` from a
    ``quantization`` block and the file's array names ``weights``: a path listed takes its entry
    (``{"group_size", "bits"}`` or ``false``); any other module that can be quantized is when
    the file holds its ``scales``."""
    def predicate(path, module):
        if path in quantization:
            return quantization[path]
        if not hasattr(module, "to_quantized"):
            return False
        return f"{path}.scales" in weights
    return predicate


def place_lowrank(module, factored):
    """Replace each Linear at a path of ``factored`` ({path: {"out", "rank", "in", "bias"}})
    with a zero :class:`variants.builders.lowrank.LowRankLinear` of those shapes (in place)."""
    import numpy as np

    from variants.builders.lowrank import LowRankLinear

    for path, f in factored.items():
        parent_path, _, name = path.rpartition(".")
        parent = dict(module.named_modules())[parent_path] if parent_path else module
        layer = LowRankLinear(np.zeros((f["out"], f["rank"]), np.float32),
                              np.zeros((f["rank"], f["in"]), np.float32),
                              np.zeros(f["out"], np.float32) if f["bias"] else None)
        if name.isdigit():
            parent[int(name)] = layer
        else:
            setattr(parent, name, layer)


def _skeleton_checkpoint(path, config):
    """A Checkpoint of ``path`` whose encoder (and classifier head) are unfilled skeletons."""
    import numpy as np
    from tokenizers import Tokenizer

    from variants import checkpoint_files as files_
    from variants.checkpoint import Checkpoint, TextTokenizer, _build
    from variants.hf_heads import load_head

    config_file = path / "config.json"
    mt = files_.model_type(config, config_file)
    args, encoder, _ = _build(mt, config, config_file)
    head = config[BLOCK].get("hf_head") or {}
    classifier = load_head(mt, {k: mx.array(np.zeros(s, np.float32)) for k, s in head.items()},
                           args) if head else None
    tok_file = path / "tokenizer.json"
    raw_tok = Tokenizer.from_file(str(tok_file))
    max_length, pad_token, _, decided = files_.decide_tokenizer(path, raw_tok, mt, config)
    tokenizer = TextTokenizer(tok_file, max_length=max_length, pad_token=pad_token,
                              decided=decided)
    return Checkpoint(path, args, encoder, tokenizer, config[BLOCK]["weights_sha256"],
                      classifier, files_.id2label(config, config_file))


def load_variant(path):
    """The exported decision model of folder ``path``, packed.

    Returns
    -------
    model : variants.decision.DecisionModel
        Its module holds ``nn.QuantizedLinear`` / ``nn.QuantizedEmbedding`` layers where the
        variant is quantized (the CPU path of :mod:`variants.qlinear` on a CPU), its
        temperatures the judged ones.
    checkpoint : variants.checkpoint.Checkpoint
        Its encoder and classifier are the model's own (packed) modules.

    Raises
    ------
    variants.checkpoint_files.CheckpointError
        Not an exported folder, a file missing, weights that do not match the skeleton.
    """
    from variants import qlinear
    from variants.checkpoint_files import CheckpointError
    from variants.models import resolve

    path = Path(path)
    if not is_export(path):
        raise CheckpointError(f"{short_path(path)} is not an exported variant (config.json has "
                              f"no {BLOCK} block); export one with variants export")
    config = json.loads((path / "config.json").read_text())
    block = config[BLOCK]
    ck = _skeleton_checkpoint(path, config)
    toml = path / "model.toml"
    source = resolve(model_config=toml) if toml.exists() else resolve(model=block["factory"])
    source.bind(ck)
    model = source.build(ck)
    module = model.module
    place_lowrank(module, block.get("lowrank", {}))
    wfile = path / "model.safetensors"
    try:
        weights = mx.load(str(wfile))
    except (OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{short_path(wfile)} cannot be read ({e}); export the variant "
                              "again") from None
    if "quantization" in config:
        q = config["quantization"]
        nn.quantize(module, group_size=q["group_size"], bits=q["bits"],
                    class_predicate=quant_predicate(q, weights))
    try:
        module.load_weights(list(weights.items()), strict=True)
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{short_path(wfile)} does not match its config.json ({e}); "
                              "export the variant again") from None
    mx.eval(module.parameters())
    module.eval()
    qlinear.use_cpu_path(module)
    model.temperatures = {int(k): float(v) for k, v in block["temperatures"].items()}
    ck.encoder = module.encoder
    ck.classifier = getattr(module, "classifier", None) if block.get("hf_head") else None
    return model, ck


def load_packed_checkpoint(path, dtype=mx.float32):
    """:func:`variants.checkpoint.load_checkpoint` of an exported folder: the packed encoder
    (and classifier head) of :func:`load_variant`. ``dtype`` must be float32 (the exported
    arrays' own)."""
    from variants.checkpoint_files import CheckpointError

    if dtype != mx.float32:
        raise CheckpointError(f"{short_path(path)} is an exported variant stored as it was "
                              "judged; load it with dtype float32")
    return load_variant(path)[1]

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

from variants.checkpoints.packed import BLOCK, is_export, quant_predicate  # noqa: F401


def place_lowrank(module, factored):
    """Replace each Linear at a path of ``factored`` ({path: {"out", "rank", "in", "bias"}})
    with a zero :class:`variants.families.lowrank.build.LowRankLinear` of those shapes (in place)."""
    import numpy as np

    from variants.families.lowrank.build import LowRankLinear

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


def load_variant(path):
    """The exported decision model of folder ``path``, packed.

    Returns
    -------
    model : variants.models.decision.DecisionModel
        Its module holds ``nn.QuantizedLinear`` / ``nn.QuantizedEmbedding`` layers where the
        variant is quantized (the CPU path of :mod:`variants.runtime.qlinear` on a CPU), its
        temperatures the judged ones.
    checkpoint : variants.checkpoints.load.Checkpoint
        Its encoder and classifier are the model's own (packed) modules.

    Raises
    ------
    variants.checkpoints.files.CheckpointError
        Not an exported folder, a file missing, weights that do not match the skeleton.
    """
    from variants.runtime import qlinear
    from variants.checkpoints.files import CheckpointError
    from variants.models import resolve

    path = Path(path)
    if not is_export(path):
        raise CheckpointError(f"{short_path(path)} is not an exported variant (config.json has "
                              f"no {BLOCK} block); export one with variants export")
    config = json.loads((path / "config.json").read_text())
    block = config[BLOCK]
    from variants.checkpoints.load import Checkpoint, TextTokenizer, _build
    from variants.checkpoints.packed import skeleton

    ck = skeleton(path, config, (Checkpoint, TextTokenizer, _build))
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

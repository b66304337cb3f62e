"""``load_checkpoint`` of a folder written by ``variants export``: the encoder (and the checkpoint's
classification head) packed as exported, nothing re-quantized.

The folder's ``config.json`` is the original checkpoint's plus mlx-lm's ``quantization`` block
and an ``mlx_variants`` block (:mod:`variants.export`). The encoder's skeleton is built from the
config, factored layers the ``mlx_variants`` block lists are put in place first (two Linears
each), the stored tensors are put at their module paths (:func:`module_weights`: a folder of
format 2 names them as the original checkpoint does), ``mlx.nn.quantize`` is applied with
mlx-lm's predicate (a module the block lists takes its entry, ``false`` keeps it full
precision; any other is quantized when the file holds its ``scales``), and the ``encoder.*``
(and ``classifier.*``) arrays fill it strictly. The whole decision model (a fitted head,
temperatures) is :func:`variants.families.artifact.load_variant`'s.
"""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from metrics._checks import short_path, short_repr
from variants.checkpoints import files as files_
from variants.checkpoints.files import CheckpointError

#: the config.json block that marks an exported folder
BLOCK = "mlx_variants"
#: the file of the parameters with no transformers name (a decision head fitted here), by
#: module path; absent when there are none
OWN_FILE = "decision_head.safetensors"
#: a quantization block's defaults (every other key is a module's entry)
DEFAULTS = ("group_size", "bits", "mode")


def is_export(path):
    """Whether folder ``path`` is an exported variant (its config.json has :data:`BLOCK`)."""
    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and BLOCK in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def one_line(error, limit=240):
    """``error``'s text on one line, cut to ``limit`` characters (MLX's strict ``load_weights``
    lists every unmatched parameter on lines of its own)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def quant_predicate(quantization, weights, prefix=""):
    """mlx-lm's class predicate (``mlx_lm.utils.load_model``) for ``nn.quantize`` from a
    ``quantization`` block and the file's array names ``weights``; ``prefix`` is prepended to
    a module's path (``"encoder."`` for the encoder alone)."""
    def predicate(path, module):
        full = prefix + path
        if full in quantization and full not in DEFAULTS:
            return quantization[full]
        if not hasattr(module, "to_quantized"):
            return False
        return f"{full}.scales" in weights
    return predicate


def _read(wfile):
    try:
        return mx.load(str(wfile))
    except (OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{short_path(wfile)} cannot be read ({one_line(e)}); export the "
                              "variant again") from None


def module_weights(path, config):
    """``(weights, quantization)`` of exported folder ``path`` (its ``config.json`` dict
    ``config``), both keyed by the decision model's paths: the stored arrays (lazy) and
    mlx-lm's ``quantization`` block (plus the ``mlx_variants.head_quantization`` entries).

    A folder of format 2 stores them under the original checkpoint's names: each is put at the
    paths ``mlx_variants.names`` gives it (:func:`variants.checkpoints.hf_names.paths_of`;
    several for layers sharing one tensor), the checkpoint's tensors the model does not read
    (``mlx_variants.kept``) are left out, and :data:`OWN_FILE`'s parameters are added as they
    are. A folder written before (no ``names``) stores module paths already.

    Raises
    ------
    CheckpointError
        A file that does not read; a stored name the map places nowhere.
    """
    from variants.checkpoints.hf_names import invert, paths_of

    path = Path(path)
    block = config[BLOCK]
    wfile = path / "model.safetensors"
    weights = _read(wfile)
    quant = dict(config.get("quantization") or {})
    names = block.get("names")
    if names is None:  # format 1: module paths
        return weights, quant
    kept, head_q = block.get("kept") or [], block.get("head_quantization") or {}
    if not (isinstance(names, dict) and all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in names.items())
            and isinstance(kept, list) and all(isinstance(k, str) for k in kept)
            and isinstance(head_q, dict)):
        raise CheckpointError(f"{short_path(path / 'config.json')}: {BLOCK}.names, .kept or "
                              ".head_quantization is not what export writes (a {path: name} "
                              "map, a list of names, a {path: entry} map); export the variant "
                              "again")
    inverse, kept = invert(names), set(kept)
    out = {}
    for k, v in weights.items():
        if k in kept:
            continue
        paths = paths_of(k, inverse)
        if not paths:
            raise CheckpointError(f"{short_path(wfile)} holds {short_repr(k)}, which config.json's "
                                  f"{BLOCK}.names places nowhere; export the variant again")
        out.update((p, v) for p in paths)
    if block.get("decision_head"):
        out.update(_read(path / OWN_FILE))
    mine = {k: e for k, e in quant.items() if k in DEFAULTS}
    for k, e in quant.items():
        if k not in DEFAULTS:
            mine.update((p, e) for p in paths_of(k, inverse))
    mine.update(head_q)
    return out, mine


def skeleton(path, config, kinds, max_length=None):
    """A Checkpoint of ``path`` whose encoder (and classifier head) are unfilled skeletons;
    ``kinds`` = ``(Checkpoint, TextTokenizer, build)`` of :mod:`variants.checkpoints.load`
    (handed in: that module calls this one). ``max_length`` None: the length the variant was
    judged at (the block's ``max_length``; a folder exported before it was recorded: its
    tokenizer files decide)."""
    import numpy as np
    from tokenizers import Tokenizer

    from variants.checkpoints import architectures

    Checkpoint, TextTokenizer, _build = kinds  # noqa: N806  (classes)

    config_file = path / "config.json"
    mt = files_.model_type(config, config_file)
    args, encoder, _ = _build(mt, config, config_file)
    head = config[BLOCK].get("hf_head") or {}
    zeros = {k: mx.array(np.zeros(s, np.float32)) for k, s in head.items()}
    classifier = architectures.loader(mt).load_head(mt, zeros, args) if head else None
    tok_file = path / "tokenizer.json"
    try:
        raw_tok = Tokenizer.from_file(str(tok_file))
    except Exception as e:  # tokenizers raises its own Exception type
        raise CheckpointError(f"{short_path(tok_file)} cannot be read as a tokenizer "
                              f"({short_repr(str(e))}); export the variant again") from None
    judged_at = config[BLOCK].get("max_length")
    if max_length is None and judged_at:
        max_length = (int(judged_at[0]), f"the length it was judged at ({judged_at[1]})")
    max_length, pad_token, _, decided = files_.decide_tokenizer(path, raw_tok, mt, config,
                                                                max_length)
    tokenizer = TextTokenizer(tok_file, max_length=max_length, pad_token=pad_token,
                              decided=decided)
    return Checkpoint(path, args, encoder, tokenizer, config[BLOCK]["weights_sha256"],
                      classifier, files_.id2label(config, config_file))


def load_packed(path, kinds, dtype=mx.float32, max_length=None):
    """The Checkpoint of exported folder ``path``: its encoder and classifier head as exported
    (``kinds``: as :func:`skeleton`): quantized modules packed (their scales in the stored
    dtype, read through the float32 round trip of
    :func:`variants.layer_maps.formats.dequantize`:
    :func:`variants.runtime.qlinear.use_cpu_path`), word-embedding tables stored by use as
    :class:`variants.runtime.row_embedding.RowWidthEmbedding`, factored (low-rank)
    layers as :class:`variants.arch.lowrank.LowRankLinear` (two Linears, each packed when
    quantized), W8A8 Linears as :class:`variants.runtime.int8_linear.Int8Linear` (the stored
    int8 codes, scales and SmoothQuant factors, :mod:`variants.arch.int8_place`), nothing
    re-quantized or re-factored.

    Raises
    ------
    CheckpointError
        A dtype other than float32, weights that do not match the config.
    """
    from variants.arch.input_scaled import check_paths, place_input_scales
    from variants.arch.int8_place import check_layers, place_int8
    from variants.arch.lowrank import place_lowrank
    from variants.runtime.row_embedding import place_row_embeddings
    from variants.runtime import qlinear

    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    if dtype != mx.float32:
        raise CheckpointError(f"{short_path(path)} is an exported variant stored as it was "
                              "judged; load it with dtype float32")
    ck = skeleton(path, config, kinds, max_length)
    wfile = path / "model.safetensors"
    weights, q = module_weights(path, config)
    try:
        scaled = check_paths(config[BLOCK].get("input_scaled"))
        int8 = check_layers(config[BLOCK].get("w8a8"))
    except ValueError as e:
        raise CheckpointError(f"{short_path(path / 'config.json')} does not match the model "
                              f"({e}); export the variant again") from None
    factored = config[BLOCK].get("lowrank") or {}
    parts = {"encoder": ck.encoder, "classifier": ck.classifier}
    try:
        for name, module in parts.items():
            if module is None:
                continue
            place_lowrank(module, factored, f"{name}.")
            place_input_scales(module, scaled, f"{name}.")
            place_int8(module, int8, f"{name}.")
            place_row_embeddings(module, config[BLOCK].get("row_embedding"), f"{name}.")
            if "group_size" in q:
                nn.quantize(module, group_size=q["group_size"], bits=q["bits"],
                            mode=q.get("mode", "affine"),
                            class_predicate=quant_predicate(q, weights, f"{name}."))
            mine = [(k[len(name) + 1:], v) for k, v in weights.items()
                    if k.startswith(name + ".")]
            module.load_weights(mine, strict=True)
            mx.eval(module.parameters())
            qlinear.use_cpu_path(module)
    except (ValueError, KeyError) as e:
        why = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise CheckpointError(f"{short_path(wfile)} does not match its config.json "
                              f"({one_line(why)}); "
                              "export the variant again") from None
    ck.encoder.eval()
    return ck

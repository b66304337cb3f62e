"""Group-wise affine weight quantization (MLX ``mx.quantize``), native or simulated.

Each group of ``group_size`` consecutive input weights of a row is stored as ``bits``-bit
integers q with one scale s and one bias b (w ~= s q + b); see MLX's ``mx.quantize`` docs and
mlx-lm's ``convert.py``. Two execution modes:

- ``native``: the weights stay packed (``nn.QuantizedLinear`` parameters, so the model bytes are
  the quantized ones): :class:`variants.runtime.qlinear.CpuQuantizedLinear`, which on the CPU dequantizes
  each weight per call into a temporary fp32 buffer and runs the BLAS GEMM, and elsewhere
  (Metal, CUDA) is ``mx.quantized_matmul``: what a deployment runs.
- ``simulated``: the same quantized weights dequantized once into dense fp32 ``nn.Linear``
  layers (fp32 model bytes); same outputs to float round-off, so quality is evaluated this way
  by default.
"""

import copy
import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from variants.arch import activations

from variants.models import heads as heads_mod
from variants.runtime import qembedding, qlinear
from variants.layer_maps import bits_map
from variants.layer_maps import formats
from variants.families.quant.config import BITS, GROUP_SIZES, MODES, QuantConfig, check_bits


#: How a skip for an input size that the group size does not divide begins (build.json).
INDIVISIBLE = "input size"


def make_predicate(cfg, skipped, settings=None, heads=("head",), head_reason=heads_mod.DEFAULT):
    """``(path, module) -> bool or {"bits", "group_size"}`` choosing the layers to quantize;
    appends skips (with the reason) to ``skipped``. Input sizes not divisible by the group size
    are skipped, as are the embeddings and the decision head unless ``cfg`` asks for them.
    ``settings`` ({path: Format}, :func:`layer_settings`) gives per-layer formats;
    ``heads`` are the decision head's module paths (:func:`variants.models.heads.head_paths`), kept
    (with ``head_reason``) unless ``cfg.quantize_head``."""

    def predicate(path, module):
        if isinstance(module, (nn.Embedding, nn.Linear)) and heads_mod.in_head(path, heads):
            if not cfg.quantize_head:
                skipped.append((path, head_reason))
                return False
        if isinstance(module, nn.Embedding):
            if not cfg.quantize_embeddings and not heads_mod.in_head(path, heads) and \
                    path not in (settings or {}):
                skipped.append((path, "embeddings kept full precision"))
                return False
            in_dims = module.weight.shape[1]
        elif isinstance(module, nn.Linear):
            in_dims = module.weight.shape[1]
        else:
            return False
        fmt = (settings or {}).get(path) or default_format(cfg)
        if in_dims % fmt.group_size:
            skipped.append((path, f"{INDIVISIBLE} {in_dims} not divisible by group size "
                                  f"{fmt.group_size}"))
            return False
        return {"bits": fmt.bits, "group_size": fmt.group_size, "mode": fmt.mode}

    return predicate


def default_format(cfg):
    """The :class:`~variants.layer_maps.formats.Format` of a layer no map entry names."""
    return formats.Format(cfg.bits, cfg.group_size, cfg.quant_mode,
                          cfg.scale_dtype if cfg.quant_mode == "affine" else "float32")


def layer_settings(module, cfg, heads=("head",)):
    """``{path: Format}`` of every layer ``cfg`` may quantize (Linears; the head
    only when asked; the embedding tables when asked or when a map entry names them; a
    ``<word table>@unseen`` pseudo path for the word table's rows unseen in the fit texts),
    from ``cfg.bits_map`` (:func:`bits_map.resolve_formats`); None
    without a map. Raises ValueError (naming ``--bits-map``) for a pattern that matches no
    such layer."""
    if not cfg.bits_map:
        return None
    _, rules = bits_map.parse(cfg.bits_map)
    paths = [p for p, m in module.named_modules()  # (group-size divisibility is checked per
             if isinstance(m, (nn.Linear, nn.Embedding))  # layer, with the map's size)
             and (cfg.quantize_embeddings or not isinstance(m, nn.Embedding)
                  or heads_mod.in_head(p, heads)
                  # an embedding table a map entry names is quantized at that entry's width
                  or any(re.search(r.pattern, p) for r in rules))
             and (cfg.quantize_head or not heads_mod.in_head(p, heads))]
    paths = sorted(paths)
    paths += [p + bits_map.UNSEEN for p in paths if p in word_tables(module)]
    d = default_format(cfg)
    return bits_map.resolve_formats(cfg.bits_map, paths, d.bits, d.group_size,
                                    default_scale=d.scale_dtype, default_mode=d.mode)


def word_tables(module):
    """Paths of the word-embedding tables (:data:`variants.families.quant.row_use.WORD_TABLES`):
    the tables whose rows are tokens, stored by use with a ``@unseen`` map entry."""
    from variants.families.quant.row_use import WORD_TABLES

    return [p for p, m in module.named_modules() if isinstance(m, nn.Embedding)
            and p.rpartition(".")[2] in WORD_TABLES]


def check_model(module, cfgs, model=None):
    """Raise ValueError, before anything is written, for a layer already quantized (a
    checkpoint folder written by ``variants export``: its packed weights cannot be quantized
    again) or a map pattern no layer matches."""
    qlinear.refuse_packed(module, "quant")
    heads, _ = heads_mod.head_paths(module, model)
    for cfg in cfgs:
        layer_settings(module, cfg, heads)


def quantize_module(module, cfg, mode="simulated", model=None, row_use=None):
    """A quantized copy of ``module`` (the input is not modified).

    Parameters
    ----------
    module : mlx.nn.Module
    cfg : QuantConfig
    mode : {'native', 'simulated'}, default='simulated'
    model : variants.models.decision.DecisionModel, optional
        Whose ``head_modules`` declares the head (:func:`variants.models.heads.head_paths`).
    row_use : np.ndarray (vocab,) bool, optional
        The word-table rows the fit texts use (:mod:`variants.families.quant.row_use`);
        needed only when the map stores a table's ``@unseen`` rows apart (a
        :class:`~variants.runtime.row_embedding.RowWidthEmbedding`).

    Returns
    -------
    qmodule : mlx.nn.Module
    info : dict
        ``quantized_layers``, ``skipped`` (path, reason), ``skipped_weights`` ({path: weight
        elements of each skipped layer}), ``indivisible_params`` / ``indivisible_param_share``
        (weight elements of the layers left unquantized because the group size does not divide
        their input size, and their share of all the module's parameters), ``bits_per_weight`` (stored bits per
        quantized weight, scales and biases included), ``model_bytes`` (all parameters as stored
        by the native form), ``quantized_params``, ``total_params``, ``head`` (the head's
        paths and why they are the head, ``quantized``: whether it was); with a ``bits_map``
        also ``layer_bits`` ({path: [bits, group_size]}) and ``layer_formats`` ({path: [bits,
        group_size, mode, scale_dtype]}); ``quant_mode`` / ``scale_dtype`` when not affine /
        float32; ``row_map`` ({table: rows and bytes per format}) for a table stored by use.
        Both sums run over each layer's stored arrays (packed weight, scales, biases, a
        table's row index), so a mixed map counts each layer's own format.

    Raises
    ------
    ValueError
        Unknown mode, no layer could be quantized, a ``bits_map`` pattern matches no layer.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; choose one of {MODES}")
    skipped = []
    heads, head_reason = heads_mod.head_paths(module, model)
    settings = layer_settings(module, cfg, heads)
    predicate = make_predicate(cfg, skipped, settings, heads, head_reason)
    native = copy.deepcopy(module)
    nn.quantize(native, group_size=cfg.group_size, bits=cfg.bits, mode=cfg.quant_mode,
                class_predicate=predicate)
    chosen = {p: (settings or {}).get(p) or default_format(cfg)
              for p, m in native.named_modules()
              if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    if not chosen:
        raise ValueError(f"no layer can be quantized with group_size={cfg.group_size}")
    mods = dict(native.named_modules())
    for p, fmt in chosen.items():  # the scales as stored (mx.quantize computed them in fp32)
        m = mods[p]
        if fmt.mode == "affine" and fmt.scale_dtype != "float32":
            m.scales = m.scales.astype(getattr(mx, fmt.scale_dtype))
            m.biases = m.biases.astype(getattr(mx, fmt.scale_dtype))
        if isinstance(m, nn.QuantizedEmbedding) and fmt[2:] != ("affine", "float32"):
            m.__class__ = qembedding.Fp32QuantizedEmbedding
    rows = row_map(module, settings, chosen, row_use)
    src = dict(module.named_modules())
    if rows:
        from variants.runtime.row_embedding import RowWidthEmbedding
    for p, (row_format, fmts) in rows.items():
        activations.set_module(native, p, RowWidthEmbedding.from_embedding(
            src[p], row_format, fmts))
    q_bytes = q_params = 0
    for p, m in native.named_modules():
        if p in rows:  # a table stored by use: all its arrays (the row index too)
            q_params += int(src[p].weight.size)
            q_bytes += sum(v.nbytes for _, v in tree_flatten(m.parameters()))
        elif p in chosen:
            q_params += m.weight.shape[0] * m.weight.shape[1] * 32 // m.bits
            q_bytes += sum(v.nbytes for _, v in tree_flatten(m.parameters()) if v is not None)
            q_bytes -= m["bias"].nbytes if "bias" in m else 0
    params = tree_flatten(native.parameters())
    total_bytes = sum(v.nbytes for _, v in params)
    dense_params = sum(v.size for _, v in tree_flatten(module.parameters()))
    skipped = sorted(set(skipped))
    sizes = {p: int(m.weight.size) for p, m in module.named_modules()
             if p in {path for path, _ in skipped}}
    indivisible = sum(sizes[p] for p, why in skipped if why.startswith(INDIVISIBLE))
    info = {
        "quantized_layers": len(chosen),
        "skipped": skipped,
        "skipped_weights": sizes,
        "indivisible_params": int(indivisible),
        "indivisible_param_share": indivisible / dense_params,
        "quantized_params": int(q_params),
        "total_params": int(dense_params),
        "bits_per_weight": 8.0 * q_bytes / q_params,
        "model_bytes": int(total_bytes),
        "mode": mode,
        "head": {"paths": list(heads), "why": head_reason.split(" kept")[0],
                 "quantized": bool(cfg.quantize_head)},
    }
    if cfg.quant_mode != "affine" or cfg.scale_dtype != "float32":
        info.update(quant_mode=cfg.quant_mode, scale_dtype=cfg.scale_dtype)
    if settings:
        info["layer_bits"] = {p: [f.bits, f.group_size] for p, f in chosen.items()}
        info["layer_formats"] = {p: list(f) for p, f in chosen.items()}
    if rows:
        info["row_map"] = {p: row_facts(rf, fm, src[p].weight.shape)
                           for p, (rf, fm) in rows.items()}
    if mode == "native":
        return qlinear.use_cpu_path(native), info
    # the simulated weights: the native layers' own stored arrays read back in float32
    # (formats.dequantize), so both forms hold one quantization, computed once
    sim = copy.deepcopy(module)
    packed = dict(native.named_modules())
    for path, m in sim.named_modules():
        if path in rows:
            m.weight = packed[path].dequantized().astype(m.weight.dtype)
        elif path in chosen:
            q = packed[path]
            m.weight = formats.dequantize(q["weight"], q["scales"], q.get("biases"),
                                          chosen[path]).astype(m.weight.dtype)
    mx.eval(sim.parameters())
    return sim, info


def row_map(module, settings, chosen, row_use):
    """``{table path: (row_format (vocab,) int, [Format, ...])}`` of the word tables whose
    ``@unseen`` rows are stored apart (a format other than the table's), from ``row_use``
    ((vocab,) bool: the rows the fit texts use). {} when no map entry sets them. Raises
    ValueError when the rows' use is unknown (no fit texts given to the build)."""
    out = {}
    for p in word_tables(module):
        unseen = (settings or {}).get(p + bits_map.UNSEEN)
        if p not in chosen or unseen is None or unseen == chosen[p]:
            continue
        if row_use is None:
            raise ValueError(f"--bits-map sets {p}{bits_map.UNSEEN} but the build has no fit "
                             "texts to tell the used rows; build it through variants sweep or "
                             "search (they pass the fit split), or drop the @unseen entry")
        w = dict(module.named_modules())[p].weight
        if w.shape[1] % unseen.group_size:
            raise ValueError(f"--bits-map: {p}{bits_map.UNSEEN}'s group size "
                             f"{unseen.group_size} does not divide the table's width "
                             f"{w.shape[1]}; use 32 or 64")
        used = np.asarray(row_use, bool)
        out[p] = (np.where(used, 0, 1).astype(np.int32), [chosen[p], unseen])
    return out


def row_facts(row_format, fmts, shape):
    """build.json's facts of one table stored by use: rows per format and stored bytes."""
    counts = np.bincount(row_format, minlength=len(fmts))
    return {"formats": [list(f) for f in fmts], "rows": [int(c) for c in counts],
            "bytes": [int(formats.stored_bytes((int(c), shape[1]), f)) if c else 0
                      for c, f in zip(counts, fmts)]}


def build(reference, cfg, mode="simulated", calibration=None, fit=None):
    """Registry entry: the reference DecisionModel with its module quantized.

    ``calibration`` is unused (round-to-nearest needs no data); kept for the builder signature.
    ``fit`` (a TaskSet) tells the word-table rows in use when the map stores the ``@unseen``
    rows apart (:func:`used_rows`).
    """
    from variants.families.quant.row_use import row_use_of

    row_use = row_use_of(reference, fit, cfg)
    qmodule, info = quantize_module(reference.module, cfg, mode, model=reference,
                                    row_use=row_use)
    return reference.replace_module(qmodule), info

"""The model card's "Load it" section (:func:`section`): the architecture the folder stores, how
its tensors are named, which loaders read it, and a runnable plain-MLX recipe.

mlx-embeddings reads an exported folder exactly when it reads the original checkpoint (the
names, the packed layout and the ``quantization`` block are the ones it loads);
:data:`MLX_EMBEDDINGS` lists the architectures that was checked for (mlx-embeddings 0.1.0,
MLX 0.32: an exported all-MiniLM-L6-v2 at 4 and 8 bits gives its last hidden states within
4.5e-6 of the judged encoder's; a ModernBERT classifier's class probabilities agree with the
judged logits' softmax within 6.6e-5, as for the original checkpoint, its own implementation's
difference). It refuses ``BertForSequenceClassification`` checkpoints (it has no such class;
their ``bert.`` names are "parameters not in model"), as it refuses the original.
"""

#: ``architectures[0]`` values whose exported folders mlx-embeddings 0.1.0 was seen to load
MLX_EMBEDDINGS = ("BertModel", "ModernBertForSequenceClassification")
#: ... and those it was seen to refuse, as it refuses the original checkpoint
MLX_EMBEDDINGS_REFUSES = ("BertForSequenceClassification",)
#: the encoder model types mlx-embeddings 0.1.0 has a module for
MLX_EMBEDDINGS_TYPES = ("bert", "modernbert", "xlm-roberta")

RECIPE = '''```python
import json

import mlx.core as mx
import mlx.nn as nn

config = json.load(open("THIS_FOLDER/config.json"))
weights = {{k: v for k, v in mx.load("THIS_FOLDER/model.safetensors").items()
           if not k.endswith("position_ids")}}  # a buffer, not a parameter
model = {port}(config)  # your MLX port: transformers' parameter paths
{quantize}model.load_weights(list(weights.items()), strict=True)
{cast}```'''

QUANTIZE = '''q = config["quantization"]  # mlx-lm's rule: a listed module takes its entry
nn.quantize(model, q["group_size"], q["bits"], mode=q.get("mode", "affine"),
            class_predicate=lambda p, m: q[p] if p in q else
            hasattr(m, "to_quantized") and f"{p}.scales" in weights)
'''


#: the recipe's lines after loading when scales are stored in half precision
CAST = '''# the judged numbers: float32(scale) * q + float32(bias), as variants computes them
for _, m in model.named_modules():
    if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) and m.mode == "affine":
        m.scales, m.biases = m.scales.astype(mx.float32), m.biases.astype(mx.float32)
'''


def _codes(items, n=4):
    items = list(items)
    return ", ".join(f"`{x}`" for x in items[:n]) + (", …" if len(items) > n else "")


def _rule(w):
    """One sentence naming the run-time rule of a ``mlx_variants.wrapper`` block ``w``."""
    def pruning(p):
        return ("token pruning (" + ", ".join(f"after layer {a} keep {r:.0%}"
                                               for a, r in p["points"])
                + f" of each text's tokens, ranked by `{p['score']}` attention)")
    if w["kind"] == "prune":
        return (f"The variant runs {pruning(w)} (`config.json`'s `mlx_variants.wrapper`).")
    inside = f", with {pruning(w['prune'])} inside the exit loop" if w.get("prune") else ""
    return (f"The variant runs early exit: {len(w['heads'])} fp32 exit heads after layers "
            f"{', '.join(map(str, w['layers']))} (`exit_heads.<i>.weight` / `.bias` in "
            f"`decision_head.safetensors`), rule `{w['rule']}` at threshold "
            f"{w['threshold']:.4g}{inside} (`config.json`'s `mlx_variants.wrapper`).")


def _row_tables(facts):
    """The lines (one paragraph) on the tables stored by use
    (:mod:`variants.runtime.row_embedding`): their names and how plain MLX reads them."""
    from variants.checkpoints.hf_names import name_of
    from variants.runtime.row_embedding import CARD

    names = facts.get("names") or {}
    stored = [name_of(p, names) or p for p in facts["row_embedding"]]
    return (f"Stored by use: {_codes(stored)}. " + " ".join(CARD)).replace("<name>",
                                                                            "<table>")


def section(facts):
    """The "Load it" lines (Markdown) of ``facts``: ``architecture`` (config.json's
    ``architectures[0]``, None when absent), ``model_type``, ``names`` (the names map,
    :mod:`variants.checkpoints.hf_names`), ``kept`` (the checkpoint's tensors copied unread),
    ``decision_head`` (its file or None), ``quantization``, ``lowrank``, ``input_scaled``,
    ``w8a8`` (the W8A8 Linears, :mod:`variants.arch.int8_place`), ``row_embedding`` (the
    tables stored by use, :mod:`variants.runtime.row_embedding`), ``half_scales``
    (the half-precision dtypes of the stored ``scales``, [] when none), ``wrapper`` (the
    token-pruning or early-exit rule around the module,
    :mod:`variants.families.wrapper_place`; None when there is none: then plain MLX can run
    the folder's model, else only this package's ``load_variant`` runs the judged rule)."""
    arch = facts.get("architecture") or f"the {facts.get('model_type')} checkpoint"
    names = facts.get("names") or {}
    own_names = all(k == v for k, v in names.items())
    only_ours = (own_names or facts.get("lowrank") or facts.get("input_scaled")
                 or facts.get("w8a8"))
    wrapper = facts.get("wrapper")
    rule = " (the judged model, its rule included)" if wrapper else ""
    lines = ["## Load it", ""]
    if own_names:
        lines += [f"Architecture: `{arch}` (`model_type` {facts.get('model_type')}). "
                  "`model.safetensors` holds the parameters under this package's module paths "
                  "(the reference was a folder exported before transformers' names were kept).",
                  ""]
    else:
        kept = facts.get("kept") or []
        lines += [f"Architecture: `{arch}` (`model_type` {facts.get('model_type')}). "
                  "`model.safetensors` holds every tensor of the original checkpoint under its "
                  "transformers name, those the variant does not change as the checkpoint has "
                  "them"
                  + (f" ({len(kept)} the decision model does not read: {_codes(kept)})"
                     if kept else "")
                  + (". Each quantized Linear / Embedding is stored as MLX packs it "
                     "(`<name>.weight` uint32, `<name>.scales`, `<name>.biases`), and "
                     "`config.json`'s `quantization` block is keyed by the same names "
                     "(mlx-lm's layout: `group_size`, `bits`, `mode`; an entry per module at "
                     "another width; `false` for one left full precision)"
                     if facts.get("quantization") else "") + ".", ""]
    if facts.get("lowrank") or facts.get("input_scaled"):
        lines += ["Factored Linears are stored as `<name>.down.weight`, `<name>.up.weight` "
                  "(`<name>.up.bias`) and input-scaled ones as `<name>.input_scale` beside "
                  "`<name>.linear.*` (`config.json`'s `mlx_variants.lowrank` / `input_scaled` "
                  "list them): no transformers layout has them, so only this package's loaders "
                  "read this folder.", ""]
    if facts.get("row_embedding"):
        lines += [_row_tables(facts), ""]
    if facts.get("w8a8"):
        lines += [f"The {len(facts['w8a8'])} W8A8 Linears (int8 weights, per-token int8 "
                  "activations on integer GEMMs) are stored as `<name>.wq` (int8 weight codes, "
                  "out x in), `<name>.w_scale` (float32 per-output-channel scales), "
                  "`<name>.colsum` (int32 row sums of the codes), `<name>.bias` and, with "
                  "SmoothQuant, `<name>.inv_smooth` (float32 1/s per input channel) "
                  "(`config.json`'s `mlx_variants.w8a8` lists them): no transformers layout has "
                  "them and they need this package's int8 Linear, so only this package's "
                  "loaders read this folder.", ""]
    if facts.get("decision_head") and (wrapper or {}).get("kind") == "exit":
        lines += [f"The tensors with no transformers name, the exit heads and a decision head "
                  f"fitted here if the model has one, are in `{facts['decision_head']}` by "
                  "module path; the `model.toml` kind says how the model reads the encoder's "
                  "output.", ""]
    elif facts.get("decision_head"):
        lines += [f"The decision head fitted here has no transformers name: it is in "
                  f"`{facts['decision_head']}` by module path (`mlx_variants.head_quantization` "
                  "says how each of its layers is stored); the `model.toml` kind says how it "
                  "reads the encoder's output.", ""]
    if wrapper:
        lines += [_rule(wrapper) + " It is code, not weights: only this package's "
                  "`load_variant` runs it (the judged model); every other loader, "
                  "`load_checkpoint` included, reads the weights alone and runs every token "
                  "through every layer, which is not the judged model.", ""]
    lines += ["Loaders that read this folder:", "",
              "- this package: `load_variant(\"THIS_FOLDER\")` "
              "(`from variants.export.load import load_variant`: the decision model"
              f"{rule}, packed, nothing re-quantized; `model.outputs(taskset)`), "
              "`load_checkpoint(THIS_FOLDER)` (the encoder and the checkpoint's own head, for "
              "`variants sweep --checkpoint THIS_FOLDER`), `variants verify THIS_FOLDER` "
              "(recomputes the judged outputs and checks every file);"]
    if only_ours:
        lines += ["- no other loader: the names above are this package's.", ""]
        return lines
    rows = facts.get("row_embedding")
    lines += [f"- plain MLX, with the recipe below, into an MLX port of `{arch}` whose "
              "parameter paths are transformers'"
              + (" and whose word-embedding module reads the tables stored by use as above"
                 if rows else "")
              + (" (the weights without the rule)" if facts.get("wrapper") else "") + ";"]
    mine = "; it gives the encoder's outputs, not the decision head" if \
        facts.get("decision_head") else ""
    mine += "; the weights without the rule" if wrapper else ""
    if rows:
        lines += ["- not mlx-embeddings 0.1.0: it reads one `weight` per embedding table, not "
                  "tables stored by use."]
    elif facts.get("architecture") in MLX_EMBEDDINGS:
        lines += ["- mlx-embeddings: `mlx_embeddings.load(\"THIS_FOLDER\")`, as it reads the "
                  f"original checkpoint (checked with mlx-embeddings 0.1.0){mine}."]
    elif facts.get("model_type") not in MLX_EMBEDDINGS_TYPES:
        lines += [f"- not mlx-embeddings 0.1.0: it has no `{facts.get('model_type')}` model "
                  "type."]
    elif facts.get("architecture") in MLX_EMBEDDINGS_REFUSES:
        lines += [f"- not mlx-embeddings 0.1.0: it has no `{arch}` class and refuses the "
                  "original checkpoint alike."]
    else:
        lines += ["- mlx-embeddings: `mlx_embeddings.load(\"THIS_FOLDER\")` should read it as "
                  f"it reads the original checkpoint (not checked for `{arch}`){mine}."]
    port = "".join(c for c in str(facts.get("architecture") or "Model") if c.isalnum())
    half = facts.get("quantization") and facts.get("half_scales")
    if half:
        lines += ["", f"The `scales` and `biases` are stored in {' and '.join(half)} (mlx-lm's "
                  "layout); MLX computes such layers in half precision, so the recipe casts "
                  "them to float32 after loading, to reproduce the judged numbers."]
    lines += ["", RECIPE.format(port=f"My{port}",
                                quantize=QUANTIZE if facts.get("quantization") else "",
                                cast=CAST if half else ""), ""]
    return lines

"""The suite's own ONNX graphs of a decision model: its encoder alone, or its whole decision
module (the encoder, then the model's pooling and head as ONNX nodes), built from the MLX
module's arrays (:mod:`variants.onnx.graph_bert`, :mod:`variants.onnx.graph_modernbert`).

The whole-module graph ends where the MLX module ends:

- ``linear-head`` (:class:`variants.models.sentiment.SentimentNet`): mean pooling over real
  tokens, L2 normalisation (sentence-transformers' Pooling(mean) + Normalize, as
  :func:`variants.arch.encoder.mean_pool`), the fitted Linear head -> ``logits`` (B, K);
- ``classifier`` (:class:`variants.models.classifier.ClassifierNet`): the checkpoint's head —
  BERT's pooler tanh(dense(h[:, 0])) then classifier, RoBERTa's out_proj(tanh(dense(h[:, 0]))),
  ModernBERT's cls / mean pooling, dense, activation, norm, classifier -> ``logits`` (B, K);
- ``cosine`` (:class:`variants.models.choice.EmbeddingNet`): mean pooling and L2 normalisation
  -> ``sentence_embedding`` (B, D); the options' cosines stay with the caller (the option
  texts run through the same graph).

Other modules (a marker model reads token positions the graph has no input for) raise
ValueError naming the module and the fix: export the encoder alone.
"""

import hashlib
import os
from pathlib import Path

import numpy as np

from variants.onnx.builder import FLOAT, Graph
from variants.onnx.linear_nodes import linear

#: output names of the whole-module graph: logits (B, K), or a choice model's embedding (B, D)
LOGITS, EMBEDDING = "logits", "sentence_embedding"


def _builder(encoder):
    """The graph module for ``encoder``'s class (BERT family or ModernBERT); ValueError else."""
    from variants.arch.encoder import BertEncoder
    from variants.arch.modernbert import ModernBertEncoder

    if isinstance(encoder, BertEncoder):
        from variants.onnx import graph_bert

        return graph_bert
    if isinstance(encoder, ModernBertEncoder):
        from variants.onnx import graph_modernbert

        return graph_modernbert
    raise ValueError(f"no ONNX graph for a {type(encoder).__name__} encoder: the suite exports "
                     "BERT, RoBERTa, XLM-R and ModernBERT encoders; export this model with its "
                     "own tools and pass it with --onnx FILE")


def encoder_graph(encoder, int8="u8u8"):
    """``onnx.ModelProto`` of ``encoder`` alone: output ``last_hidden_state`` (B, L, D)."""
    return _builder(encoder).encoder_graph(encoder, int8=int8)


def _mean_pool(g, x, mask, normalize=True):
    m = g.op("Unsqueeze", [g.op("Cast", [mask], "head/mask", to=FLOAT), g.ints([-1])],
             "head/mask3")
    total = g.op("ReduceSum", [g.op("Mul", [x, m], "head/masked"), g.ints([1])], "head/sum",
                 keepdims=0)
    count = g.op("Max", [g.op("ReduceSum", [m, g.ints([1])], "head/count", keepdims=0),
                         g.scalar(1e-9)], "head/count_min")
    pooled = g.op("Div", [total, count], "head/mean")
    if not normalize:
        return pooled
    sq = g.op("ReduceSum", [g.op("Mul", [pooled, pooled], "head/sq"), g.ints([-1])],
              "head/sumsq", keepdims=1)
    norm = g.op("Max", [g.op("Sqrt", [sq], "head/norm"), g.scalar(1e-12)], "head/norm_min")
    return g.op("Div", [pooled, norm], "head/normalized")


def _first_token(g, x):
    return g.op("Gather", [x, g.scalar(0, np.int64)], "head/cls", axis=1)


def _classifier(g, x, mask, head):
    """The checkpoint's classification head (``variants.checkpoints.hf_heads`` classes)."""
    kind = type(head).__name__
    if kind == "BertClassifier":
        pooled = g.op("Tanh", [linear(g, _first_token(g, x), head.pooler, "pooler")], "pooler/tanh")
        return linear(g, pooled, head.classifier, "classifier")
    if kind == "RobertaClassifier":
        h = g.op("Tanh", [linear(g, _first_token(g, x), head.dense, "head.dense")], "head/tanh")
        return linear(g, h, head.out_proj, "head.out_proj")
    if kind == "ModernBertClassifier":
        from variants.onnx.graph_modernbert import activation, layer_norm

        pooled = (_first_token(g, x) if head.pooling == "cls"
                  else _mean_pool(g, x, mask, normalize=False))
        h = activation(g, linear(g, pooled, head.dense, "head.dense"), head.activation,
                       "head.act")
        return linear(g, layer_norm(g, h, head.norm, "head.norm"), head.classifier,
                      "classifier")
    raise ValueError(f"no ONNX form for the classification head {kind}; export the encoder "
                     "alone (the head then runs in MLX)")


def decision_graph(module, int8="u8u8"):
    """``onnx.ModelProto`` of a whole decision ``module`` (module docstring): inputs
    ``input_ids`` / ``attention_mask`` / ``token_type_ids`` int64 (batch, sequence), output
    :data:`LOGITS` or :data:`EMBEDDING`. Raises ValueError for a module kind it cannot end."""
    kind = type(module).__name__
    if kind not in ("SentimentNet", "ClassifierNet", "EmbeddingNet"):
        raise ValueError(f"no whole-module ONNX graph for {kind} (its readout needs inputs the "
                         "graph has no place for); export the encoder alone")
    enc = module.encoder
    g = Graph(f"{kind}")
    x, mask = _builder(enc).body(g, enc, int8=int8)
    if kind == "EmbeddingNet":
        out, name = _mean_pool(g, x, mask), EMBEDDING
        width = int(enc.args.hidden_size)
    elif kind == "SentimentNet":
        out, name = linear(g, _mean_pool(g, x, mask), module.head, "head"), LOGITS
        width = int(module.head.weight.shape[0])
    else:
        out, name = _classifier(g, x, mask, module.classifier), LOGITS
        width = None
    g.output(out, name, FLOAT, ["batch", width if width is not None else "options"])
    return g.model(doc=f"{kind} exported by mlx-variants (issue #43)",
                   metadata={"mlx_variants.graph": kind,
                             "model_type": getattr(enc.args, "model_type", "")})


def _weights_digest(module):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    h = hashlib.sha256()
    for k, v in sorted(tree_flatten(module.parameters()), key=lambda kv: kv[0]):
        h.update(f"{k}:{v.dtype}:{v.shape}".encode())
        h.update(np.array(v.astype(mx.float32) if v.dtype == mx.bfloat16 else v).tobytes())
    return h.hexdigest()[:20]


def reference_graph(reference, cache_dir=None):
    """Path of the suite's fp32 ONNX graph of ``reference`` (a DecisionModel): its whole module
    when :func:`decision_graph` can end it, else its encoder; written once under
    ``cache_dir/onnx`` keyed by the module's weights (a temporary folder without a cache)."""
    from variants.onnx.graph_bert import save

    name = f"ref-{type(reference.module).__name__}-{_weights_digest(reference.module)}.onnx"

    def write(tmp):
        try:
            model = decision_graph(reference.module)
        except ValueError:
            model = encoder_graph(reference.module.encoder)
        save(model, tmp)

    return cached_graph(cache_dir, name, write)


def cached_graph(cache_dir, name, write):
    """Path of the ONNX file ``name`` under ``cache_dir/onnx`` (a fresh temporary folder when
    ``cache_dir`` is None), made by ``write(tmp_path)`` when it is not there yet and renamed into
    place (a killed writer leaves no half file under ``name``; its temporary file is removed)."""
    base = Path(cache_dir) / "onnx" if cache_dir is not None else Path(
        __import__("tempfile").mkdtemp(prefix="variants-onnx-"))
    base.mkdir(parents=True, exist_ok=True)
    out = base / name
    if out.exists():
        return out
    tmp = out.with_suffix(f".tmp{os.getpid()}.onnx")
    try:
        write(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out

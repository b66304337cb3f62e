"""A plain-MLX BERT whose parameter paths are transformers' (``BertModel``,
``BertForSequenceClassification``), written with ``mlx.nn`` layers only and nothing of this
package: what a user following an exported folder's model card writes to load it without
``variants``. Post-LN layers, exact GELU (``hidden_act`` gelu), absolute positions, padded keys
masked, dropout off (as transformers' ``eval()``)."""

import math

import mlx.core as mx
import mlx.nn as nn


class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], h)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], h)
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], h)
        self.LayerNorm = nn.LayerNorm(h, eps=c["layer_norm_eps"])

    def __call__(self, ids, types):
        x = (self.word_embeddings(ids) + self.position_embeddings(mx.arange(ids.shape[1]))
             + self.token_type_embeddings(types))
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)

    def __call__(self, x, bias):
        B, L, H = x.shape
        d = H // self.heads

        def split(t):
            return t.reshape(B, L, self.heads, d).transpose(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        p = mx.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias, axis=-1)
        return (p @ v).transpose(0, 2, 1, 3).reshape(B, L, H)


class DenseNorm(nn.Module):
    """``dense`` then ``LayerNorm`` of the sum with the residual (BertSelfOutput, BertOutput)."""

    def __init__(self, n_in, c):
        super().__init__()
        self.dense = nn.Linear(n_in, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def __call__(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseNorm(c["hidden_size"], c)

    def __call__(self, x, bias):
        return self.output(self.self(x, bias), x)


class Intermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])

    def __call__(self, x):
        return nn.gelu(self.dense(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseNorm(c["intermediate_size"], c)

    def __call__(self, x, bias):
        a = self.attention(x, bias)
        return self.output(self.intermediate(a), a)


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = [Layer(c) for _ in range(c["num_hidden_layers"])]

    def __call__(self, x, bias):
        for layer in self.layer:
            x = layer(x, bias)
        return x


class Pooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])

    def __call__(self, last_hidden):
        return mx.tanh(self.dense(last_hidden[:, 0]))


class BertModel(nn.Module):
    """transformers' ``BertModel``: ``(last_hidden (B, L, H), pooled (B, H))``."""

    def __init__(self, c):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.pooler = Pooler(c)

    def __call__(self, ids, mask, types):
        bias = mx.where(mask[:, None, None, :].astype(mx.bool_), 0.0, -1e9)
        hidden = self.encoder(self.embeddings(ids, types), bias)
        return hidden, self.pooler(hidden)


class BertForSequenceClassification(nn.Module):
    """transformers' ``BertForSequenceClassification``: logits (B, num_labels)."""

    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.classifier = nn.Linear(c["hidden_size"], len(c["id2label"]))

    def __call__(self, ids, mask, types):
        return self.classifier(self.bert(ids, mask, types)[1])


def load_as_the_card_says(folder, model):
    """The model card's recipe: ``nn.quantize`` by config.json's ``quantization`` block
    (mlx-lm's rule), then ``load_weights(strict=True)`` of model.safetensors without its
    ``position_ids`` buffer. Returns ``model``."""
    import json
    from pathlib import Path

    config = json.loads((Path(folder) / "config.json").read_text())
    weights = {k: v for k, v in mx.load(str(Path(folder) / "model.safetensors")).items()
               if not k.endswith("position_ids")}
    q = config.get("quantization")
    if q:
        nn.quantize(model, q["group_size"], q["bits"], mode=q.get("mode", "affine"),
                    class_predicate=lambda p, m: q[p] if p in q else
                    hasattr(m, "to_quantized") and f"{p}.scales" in weights)
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    return model

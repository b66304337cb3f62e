"""ModernBERT's building blocks in MLX (Warner et al. 2024, "Smarter, Better, Faster, Longer";
layout and weight names as Hugging Face ``transformers``' ``modeling_modernbert.py``): config,
rotary embeddings, attention with a fused ``Wqkv``, GeGLU MLP, pre-norm layer.

Every constant comes from ``config.json`` (:class:`ModernBertArgs`); nothing is hard-coded.
"""

import inspect
from dataclasses import dataclass, fields

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.arch.encoder import ACTIVATIONS, LayerNorm
from variants.arch.modernbert_window import windowed_attention


@dataclass
class ModernBertArgs:
    """ModernBERT configuration, read from a Hugging Face ``config.json``. Every field is
    required, in either layout ``transformers`` writes: ``global_rope_theta`` /
    ``local_rope_theta`` / ``global_attn_every_n_layers`` (4.x), or ``rope_parameters``
    (``full_attention`` / ``sliding_attention`` ``rope_theta``) / ``layer_types`` (5.x)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    classifier_bias: bool
    hidden_activation: str
    classifier_activation: str
    classifier_pooling: str
    global_rope_theta: float
    local_rope_theta: float
    local_attention: int
    pad_token_id: int
    global_attn_every_n_layers: int = None
    layer_types: list = None
    model_type: str = "modernbert"

    @classmethod
    def from_dict(cls, params):
        """Build from a config dict. Raises KeyError naming the missing keys, ValueError for
        an unsupported activation or head size."""
        params = dict(params)
        rope = params.get("rope_parameters")
        if isinstance(rope, dict):  # transformers >= 5: per layer type
            full, sliding = rope.get("full_attention", {}), rope.get("sliding_attention", {})
            params.setdefault("global_rope_theta", full.get("rope_theta"))
            params.setdefault("local_rope_theta", sliding.get("rope_theta"))
        if params.get("local_rope_theta") is None and "global_rope_theta" in params:
            params["local_rope_theta"] = params["global_rope_theta"]  # as HF: local falls back
        names = inspect.signature(cls).parameters
        optional = ("model_type", "global_attn_every_n_layers", "layer_types")
        missing = [f.name for f in fields(cls) if f.name not in optional
                   and params.get(f.name) is None]
        if params.get("layer_types") is None and params.get("global_attn_every_n_layers") is None:
            missing.append("global_attn_every_n_layers (or layer_types)")
        if missing:
            raise KeyError(", ".join(missing))
        return cls(**{k: v for k, v in params.items() if k in names})

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(f"head_dim (hidden_size / num_attention_heads = "
                             f"{self.hidden_size // self.num_attention_heads}) must be even: "
                             "rotary embeddings rotate pairs of dimensions (as HF ModernBERT)")
        if self.layer_types is not None and (
                len(self.layer_types) != self.num_hidden_layers
                or not set(self.layer_types) <= {"full_attention", "sliding_attention"}):
            raise ValueError(f"layer_types must list full_attention / sliding_attention for each "
                             f"of the {self.num_hidden_layers} layers")
        for key in ("hidden_activation", "classifier_activation"):
            if getattr(self, key) not in ACTIVATIONS:
                raise ValueError(f"{key} {getattr(self, key)!r} is not supported; "
                                 f"use one of {sorted(ACTIVATIONS)}")

    def is_global(self, layer_id):
        """Whether layer ``layer_id`` attends globally: ``layer_types[layer_id] ==
        "full_attention"`` when given, else ``layer_id % global_attn_every_n_layers == 0`` (as
        HF); the others attend within ``local_attention // 2`` positions."""
        if self.layer_types is not None:
            return self.layer_types[layer_id] == "full_attention"
        return layer_id % self.global_attn_every_n_layers == 0


def inv_freq(theta, head_dim):
    """Rotary inverse frequencies (head_dim // 2,) float32: 1 / θ^(2i / head_dim), computed in
    float32 as HF's default rope init (Su et al. 2021, RoFormer)."""
    exponents = np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)
    return mx.array((np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32))


def rope_tables(positions, theta, head_dim):
    """(cos, sin), each (B, 1, L, head_dim) float32, for ``positions`` (B, L) int."""
    freqs = positions.astype(mx.float32)[..., None] * inv_freq(theta, head_dim)
    emb = mx.concatenate([freqs, freqs], axis=-1)[:, None]
    return mx.cos(emb), mx.sin(emb)


def apply_rope(x, cos, sin):
    """x · cos + rotate_half(x) · sin on (B, heads, L, head_dim) (HF ``apply_rotary_pos_emb``)."""
    h = x.shape[-1] // 2
    return x * cos + mx.concatenate([-x[..., h:], x[..., :h]], axis=-1) * sin


class Embeddings(nn.Module):
    """``tok_embeddings`` then ``norm`` (no position table: positions enter by rotary)."""

    def __init__(self, args):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.norm = LayerNorm(args.hidden_size, eps=args.norm_eps, bias=args.norm_bias)

    def __call__(self, input_ids):
        return self.norm(self.tok_embeddings(input_ids))


class Attention(nn.Module):
    """Self-attention with a fused ``Wqkv`` (D -> 3D, q|k|v each heads × head_dim), rotary q and
    k, softmax(q kᵀ / sqrt(head_dim) + bias) v, output ``Wo``."""

    def __init__(self, args):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.head_dim = args.hidden_size // args.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.Wqkv = nn.Linear(args.hidden_size, 3 * args.hidden_size, bias=args.attention_bias)
        self.Wo = nn.Linear(args.hidden_size, args.hidden_size, bias=args.attention_bias)

    def __call__(self, x, bias, cos, sin, return_attention=False, window=None):
        """``x`` (B, L, D); ``bias`` additive, broadcasting against (B, heads, L, L); ``cos``,
        ``sin`` (B, 1, L, head_dim); ``window`` a :class:`variants.arch.modernbert_window.WindowPlan`
        (then ``bias`` is unused and only the keys inside each window are computed; not with
        ``return_attention``). Returns (out (B, L, D), probs (B, heads, L, L) or None)."""
        B, L, D = x.shape
        qkv = self.Wqkv(x).reshape(B, L, 3, self.n_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = apply_rope(qkv[0], cos, sin), apply_rope(qkv[1], cos, sin), qkv[2]
        if window is not None and not return_attention:
            out = windowed_attention(q, k, v, self.scale, window)
            return self.Wo(out.transpose(0, 2, 1, 3).reshape(B, L, D)), None
        scores = (q * self.scale) @ k.transpose(0, 1, 3, 2)
        probs = mx.softmax(scores if bias is None else scores + bias, axis=-1, precise=True)
        out = (probs @ v).transpose(0, 2, 1, 3).reshape(B, L, D)
        return self.Wo(out), probs if return_attention else None


class MLP(nn.Module):
    """GeGLU: ``Wi`` (D -> 2F) split into input | gate; ``Wo``(act(input) · gate)."""

    def __init__(self, args):
        super().__init__()
        self.Wi = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=args.mlp_bias)
        self.Wo = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)
        self.hidden_activation = args.hidden_activation

    def __call__(self, x):
        h = self.Wi(x)
        inp, gate = mx.split(h, 2, axis=-1)
        return self.Wo(ACTIVATIONS[self.hidden_activation](inp) * gate)


class ModernBertLayer(nn.Module):
    """Pre-norm layer: x += Attn(attn_norm(x)); x += MLP(mlp_norm(x)); layer 0's ``attn_norm``
    is the identity. ``is_global`` says which mask and θ it takes from the context."""

    def __init__(self, args, layer_id):
        super().__init__()
        self.attn_norm = (nn.Identity() if layer_id == 0 else
                          LayerNorm(args.hidden_size, eps=args.norm_eps, bias=args.norm_bias))
        self.attn = Attention(args)
        self.mlp_norm = LayerNorm(args.hidden_size, eps=args.norm_eps, bias=args.norm_bias)
        self.mlp = MLP(args)
        self.is_global = args.is_global(layer_id)

    def __call__(self, x, ctx, return_attention=False):
        """``x`` (B, L, D), ``ctx`` a :class:`variants.arch.modernbert.ModernBertContext` ->
        (x (B, L, D), probs or None)."""
        cos, sin = ctx.rope(self.is_global)
        plan = None if self.is_global or return_attention else ctx.window()
        bias = None if plan is not None else ctx.bias(self.is_global)
        a, probs = self.attn(self.attn_norm(x), bias, cos, sin, return_attention, plan)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), probs

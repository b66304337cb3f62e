"""Suffix forwards for per-layer sensitivity: the hidden states entering every encoder layer,
recorded once with the reference weights, and a forward that starts at layer ``i`` from them.

When only one Linear of ``encoder.layers.i`` changes, the layers before ``i`` compute exactly
what the reference did, so the sensitivity of that unit needs only layers ``i..N-1`` and the
model's readout (pooling, head, option scores: whatever the model does with
``encoder(...).last_hidden``). :class:`SuffixCache` records, per distinct batch (keyed by the
bytes of its ``input_ids``, ``attention_mask`` and ``token_type_ids``), the input of every
layer; inside :meth:`SuffixCache.start_at` the encoder's call on a recorded batch runs from
layer ``i``; a batch it has not recorded runs the whole stack as before.

Applies to a plain :class:`variants.arch.encoder.BertEncoder` (or a subclass with other
embeddings: DistilBERT, ELECTRA, ALBERT) whose layers are all
:class:`variants.arch.encoder.TransformerLayer`, to a
:class:`variants.arch.modernbert.ModernBertEncoder` whose layers are all
:class:`variants.arch.modernbert_layers.ModernBertLayer`, and to MPNet / DeBERTa-v2 stacks
(:class:`variants.arch.mpnet.MPNetEncoder`, :class:`variants.arch.deberta.DebertaEncoder`: run
from layer ``i`` as BERT's, through ``apply_layer``) (:func:`applies`); embedding tables
and any other unit keep the full forward. On BERT the suffix runs each layer as
:meth:`BertEncoder.apply_layer` does, so logits equal the full forward's to float round-off
(measured on MiniLM, 60 rows, 36 Linears x 5 widths: mean KL within 2.7e-8 nats, max
|dlogit| within 2.7e-6, flip rates equal). On ModernBERT it runs
:meth:`ModernBertEncoder.layers_from` (the pre-norm layers from ``i`` with their own rotary
θ and global / sliding-window masks, on the fast path where the full call takes it), then
``final_norm``; the recorded layer inputs come from the layer-by-layer path, so logits equal
the full forward's to float32 round-off.
"""

import hashlib
import re
from contextlib import contextmanager

import mlx.core as mx
import numpy as np

from variants.arch.deberta import DebertaEncoder
from variants.arch.deberta_attention import DebertaLayer
from variants.arch.encoder import BertEncoder, EncoderOutput, TransformerLayer
from variants.arch.modernbert import ModernBertEncoder
from variants.arch.modernbert_layers import ModernBertLayer
from variants.arch.mpnet import MPNetEncoder, MPNetLayer

_UNIT = re.compile(r"^encoder\.layers\.(\d+)\.")


#: encoder class -> the class of its layers that the suffix forward knows
_STACKS = {BertEncoder: TransformerLayer, ModernBertEncoder: ModernBertLayer,
           MPNetEncoder: MPNetLayer, DebertaEncoder: DebertaLayer}


def _stack_of(cls):
    """The :data:`_STACKS` class ``cls`` is (or subclasses: DistilBERT, ELECTRA and ALBERT are
    BERT stacks with their own embeddings), or None."""
    return next((base for base in cls.__mro__ if base in _STACKS), None)


def applies(module):
    """True when ``module.encoder`` is a plain BERT stack (:class:`BertEncoder` or a subclass,
    every layer a :class:`TransformerLayer`), a ModernBERT stack (:class:`ModernBertEncoder`,
    every layer a :class:`ModernBertLayer`) or an MPNet / DeBERTa-v2 one (:data:`_STACKS`)."""
    enc = getattr(module, "encoder", None)
    stack = _stack_of(type(enc))
    return stack is not None and all(type(layer) is _STACKS[stack] for layer in enc.layers)


def layer_of(path):
    """The encoder layer index of unit ``path`` (``encoder.layers.3.attention.value`` -> 3), or
    None for a unit outside the layers (an embedding table)."""
    m = _UNIT.match(path)
    return int(m.group(1)) if m else None


def _key(input_ids, attention_mask, token_type_ids):
    h = hashlib.blake2b(digest_size=16)
    for a in (input_ids, attention_mask, token_type_ids):
        a = None if a is None else np.asarray(a)
        h.update(b"-" if a is None else repr((a.shape, a.dtype.str)).encode() + a.tobytes())
    return h.hexdigest()


def _suffixed_call(self, input_ids, attention_mask, token_type_ids=None, **kw):
    cache = self.__dict__["_suffix_cache"]
    return cache._call(self, input_ids, attention_mask, token_type_ids, **kw)


#: encoder class -> a subclass whose call reads its :class:`SuffixCache` (set while the
#: cache's context is open; the instance's class is swapped back on exit); made on first use
_SUFFIXED = {}


def _suffixed(cls):
    if cls not in _SUFFIXED:
        _SUFFIXED[cls] = type(f"_Suffixed{cls.__name__}", (cls,), {"__call__": _suffixed_call})
    return _SUFFIXED[cls]


class SuffixCache:
    """Layer inputs of ``module.encoder`` per batch, and forwards that start part-way.

    Parameters
    ----------
    module : mlx.nn.Module
        A decision model's module with a plain BERT, ModernBERT, MPNet or DeBERTa-v2
        ``.encoder`` (:func:`applies` must be True, else ValueError).
    """

    def __init__(self, module):
        if not applies(module):
            raise ValueError("suffix forwards need a plain BertEncoder, ModernBertEncoder, "
                             "MPNetEncoder or DebertaEncoder (module.encoder)")
        self.encoder = module.encoder
        self.cls = type(module.encoder)
        self.states = {}  # key -> [input of layer 0, ..., input of layer N-1]
        self.mode = None  # "record" or an int start layer
        self.hits = 0

    def _call(self, enc, input_ids, attention_mask, token_type_ids=None, **kw):
        full = self.cls.__call__
        if kw.get("output_hidden_states") or kw.get("output_attentions"):
            return full(enc, input_ids, attention_mask, token_type_ids, **kw)
        key = _key(input_ids, attention_mask, token_type_ids)
        if self.mode == "record":
            out = full(enc, input_ids, attention_mask, token_type_ids, output_hidden_states=True)
            mx.eval(out.hidden_states)
            self.states[key] = out.hidden_states[:-1]
            return EncoderOutput(out.last_hidden)
        xs = self.states.get(key)
        if xs is None or self.mode is None:
            return full(enc, input_ids, attention_mask, token_type_ids, **kw)
        self.hits += 1
        i = int(self.mode)
        if issubclass(self.cls, ModernBertEncoder):
            return EncoderOutput(enc.finish(enc.layers_from(i, xs[i], attention_mask)))
        x, ctx = xs[i], enc.context(attention_mask)
        for j in range(i, len(enc.layers)):
            x = enc.apply_layer(j, x, ctx)[0]
        return EncoderOutput(enc.finish(x))

    @contextmanager
    def _swapped(self, mode):
        enc = self.encoder
        cls = type(enc)
        self.mode = mode
        enc.__dict__["_suffix_cache"] = self
        enc.__class__ = _suffixed(cls)
        try:
            yield self
        finally:
            enc.__class__ = cls
            enc.__dict__.pop("_suffix_cache", None)
            self.mode = None

    def record(self):
        """Context: every encoder call runs in full and leaves its layer inputs here (call it
        with the reference weights)."""
        return self._swapped("record")

    def start_at(self, i):
        """Context: an encoder call on a recorded batch runs layers ``i``.. only, from the
        recorded input of layer ``i``; any other call runs in full."""
        if not 0 <= int(i) < len(self.encoder.layers):
            raise ValueError(f"layer {i} is outside 0..{len(self.encoder.layers) - 1}")
        return self._swapped(int(i))

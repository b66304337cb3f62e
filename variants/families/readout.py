"""What pruning and early exit need from a decision module besides its encoder: ``readout``.

A decision module that these families can rebuild layer by layer has

- ``encoder`` with the per-layer interface (``embed``, ``layers``, ``context``, ``apply_layer``,
  ``finish``; :class:`variants.arch.encoder.BertEncoder`, :class:`variants.arch.modernbert.ModernBertEncoder`);
- ``readout(last_hidden, attention_mask)``: ``last_hidden`` (B, L, D) float32 after
  ``encoder.finish``, ``attention_mask`` (B, L) 0/1 -> what the module returns, logits (B, K) or
  an embedding (B, D): its own pooling and head. ``module(ids, mask, types)`` must equal
  ``readout(encoder(ids, mask, types).last_hidden, mask)``.

A readout that needs more than those two arguments (token positions, e.g. a marker model reading
the hidden state at each option's marker token) cannot follow the tokens pruning drops or the
rows early exit removes, so both families refuse such a module (:func:`check_readout`).
"""

import inspect


def _required(fn):
    """Names of ``fn``'s required positional parameters (``self`` excluded for bound methods)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_readout(module, family):
    """Raise ValueError (one line naming the module, ``family`` and why) unless ``module`` has an
    ``encoder`` with per-layer access and a ``readout(last_hidden, attention_mask)``.

    Returns the bound ``readout``.
    """
    name = type(module).__name__
    enc = getattr(module, "encoder", None)
    if enc is None or not all(hasattr(enc, a) for a in ("layers", "embed", "context",
                                                        "apply_layer", "finish")):
        raise ValueError(f"{name} has no per-layer access (module.encoder with embed/layers/"
                         f"context/apply_layer/finish); --family {family} needs it: choose "
                         "--family quant or lowrank for it")
    readout = getattr(module, "readout", None)
    if not callable(readout):
        raise ValueError(f"{name} has no readout(last_hidden, attention_mask) (its pooling and "
                         f"head after the encoder); --family {family} needs one: give the module "
                         "that method, or choose --family quant or lowrank")
    req = _required(readout)
    if req is not None and len(req) > 2:
        raise ValueError(f"{name}.readout needs {', '.join(req[2:])} besides the hidden states "
                         f"and mask (token positions): --family {family} moves tokens or rows "
                         "and cannot pass them; choose --family quant or lowrank for it")
    return readout

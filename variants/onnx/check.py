"""Check an ONNX graph against the decision model it stands in for, before any work.

A graph is usable when its inputs are ones the suite feeds (:data:`variants.onnx.session.
FED_INPUTS`, integer typed, ``input_ids`` among them) and the output read is either

- a token output (B, L, D) with D the model's hidden size: it replaces the encoder and goes
  through the model's own readout (pooling and head), or
- what the model's whole decision module returns (B, K) — its decision logits, or a choice
  model's text embedding (B, D) — with the same shape: it replaces the whole module (a graph
  exported with the model's head, :func:`variants.onnx.graph.decision_graph`).

Every mismatch is one ValueError line naming the input or output and the fix. The shapes are
checked on a probe batch (two rows of the model's own tokens), since exported graphs mostly
declare symbolic batch and sequence axes.
"""

import numpy as np

from variants.onnx.session import FED_INPUTS, _INT_TYPES

#: the output names read by default, first found wins (transformers' and the suite's exports)
DEFAULT_OUTPUTS = ("last_hidden_state", "logits")


def check_inputs(session):
    """Raise ValueError unless every graph input is one the suite feeds, integer typed, with
    ``input_ids`` among them."""
    names = [i.name for i in session.get_inputs()]
    for i in session.get_inputs():
        if i.name not in FED_INPUTS:
            raise ValueError(f"the ONNX graph's input {i.name!r} is not one the suite feeds "
                             f"({', '.join(FED_INPUTS)}); re-export the model with those input "
                             "names (a graph whose extra inputs have constants folded in works)")
        if i.type not in _INT_TYPES:
            raise ValueError(f"the ONNX graph's input {i.name!r} is {i.type}, not int64 or int32; "
                             "re-export it with integer token inputs")
    if "input_ids" not in names:
        raise ValueError(f"the ONNX graph has no input_ids input (it has {', '.join(names)}); "
                         "re-export it with the token ids as an input named input_ids")


def pick_output(session, output=None):
    """The output name to read: ``output`` when given (ValueError listing the graph's outputs
    when it has none of that name), else the first of :data:`DEFAULT_OUTPUTS` the graph has,
    else its only output (ValueError naming them when it has several)."""
    names = [o.name for o in session.get_outputs()]
    if output is not None:
        if output not in names:
            raise ValueError(f"--onnx-output {output!r} is not an output of the ONNX graph (it "
                             f"has {', '.join(names)}); pass one of those")
        return output
    for n in DEFAULT_OUTPUTS:
        if n in names:
            return n
    if len(names) == 1:
        return names[0]
    raise ValueError(f"the ONNX graph has outputs {', '.join(names)} and none is named "
                     f"{' or '.join(DEFAULT_OUTPUTS)}; pass --onnx-output NAME (a token output "
                     "(batch, tokens, hidden) or the decision logits (batch, options))")


#: the probe's texts: three rows (two padded) the model's own tokenizer makes
PROBE_TEXTS = ("a probe", "a longer probe sentence for the graph check", "a third one")


def probe_batch(tokenizer, n=len(PROBE_TEXTS)):
    """The first ``n`` probe rows the model's own tokenizer makes: ``(ids, mask, types)``
    int64 (n, L) NumPy arrays."""
    encs, _ = tokenizer.encode(list(PROBE_TEXTS[:n]))
    ids, mask, types = tokenizer.batch(encs)
    return (np.asarray(ids, np.int64), np.asarray(mask, np.int64), np.asarray(types, np.int64))


def check_graph(session, reference, output=None):
    """What ``session``'s graph stands in for in ``reference`` (a DecisionModel): ``("encoder",
    name)`` for a token output (B, L, hidden) or ``("module", name)`` for an output shaped as the
    decision module's (logits (B, K), or a choice model's embedding (B, D)). Raises ValueError (one line, naming the input or output and the
    fix) otherwise."""
    from variants.onnx.session import feeds

    check_inputs(session)
    name = pick_output(session, output)
    otype = next(o.type for o in session.get_outputs() if o.name == name)
    if otype != "tensor(float)":
        raise ValueError(f"the ONNX graph's output {name!r} is {otype}, not float32; pass a "
                         "graph whose output is the float logits or token states (--onnx-output "
                         "NAME)")
    module = reference.module
    enc = getattr(module, "encoder", None)
    hidden = getattr(getattr(enc, "args", None), "hidden_size", None)
    ids, mask, types = probe_batch(reference.tokenizer)
    try:
        y = session.run([name], feeds(session, ids, mask, types))[0]
        one = session.run([name], feeds(session, *probe_batch(reference.tokenizer, 1)))[0]
    except Exception as e:
        raise ValueError(f"ONNX Runtime failed on a probe batch of the model's own tokens "
                         f"(input_ids {ids.shape}): {' '.join(str(e).split())[:200]}; check that "
                         "the graph was exported from this model with dynamic batch and sequence "
                         "axes") from None
    y = np.asarray(y)
    B, L = ids.shape
    if np.ndim(one) < 1 or np.shape(one)[0] != 1 or y.ndim < 1 or y.shape[0] != B:
        raise ValueError(f"the ONNX graph's output {name!r} does not follow the batch: "
                         f"{tuple(np.shape(one))} for one row, {tuple(y.shape)} for {B}; "
                         "re-export it with a dynamic batch axis")
    if y.ndim == 3 and y.shape[:2] == (B, L):
        if enc is None:
            raise ValueError(f"{type(module).__name__} has no encoder for the ONNX graph's token "
                             f"output {name!r} to replace; pass a graph of the decision logits")
        if hidden is not None and y.shape[2] != hidden:
            raise ValueError(f"the ONNX graph's output {name!r} has width {y.shape[2]}, the "
                             f"model's encoder {hidden}; export the graph from the model this "
                             "run judges (its model TOML's checkpoint)")
        return "encoder", name
    if y.ndim == 2 and y.shape[0] == B:
        import mlx.core as mx

        want = tuple(module(mx.array(ids), mx.array(mask), mx.array(types)).shape)
        if y.shape != want:
            raise ValueError(f"the ONNX graph's output {name!r} is {tuple(y.shape)} on a probe "
                             f"batch where the model's module returns {want} (its decision "
                             "logits, or a choice model's text embedding); export the model this "
                             "run judges, or pass a token output (--onnx-output "
                             "last_hidden_state)")
        return "module", name
    raise ValueError(f"the ONNX graph's output {name!r} has shape {tuple(y.shape)} on a ({B}, {L}) "
                     f"batch: neither tokens ({B}, {L}, hidden) nor the decision module's output ({B}, K); pass "
                     "--onnx-output naming one of those")

"""An ONNX Runtime session standing in for a decision model's encoder (or its whole head).

:class:`OrtEncoder` is called like :class:`variants.arch.encoder.BertEncoder` — ``(input_ids,
attention_mask, token_type_ids)`` -> :class:`~variants.arch.encoder.EncoderOutput` — so a
decision module whose ``encoder`` it replaces keeps its own pooling and head in MLX: the ONNX
graph's token output (B, L, D) goes through the model's readout, exactly as the MLX encoder's
would. :class:`OrtModule` replaces the whole decision module when the graph's output is the
decision module's own output (its logits, or a choice model's text embedding: a graph
exported with the model's head).

The session is ONNX Runtime's ``InferenceSession`` on the CPU execution provider, its
intra-op threads set to the cores this process may use (the cores the reference's MLX forward
uses: two streams plus OpenBLAS on a 2-core machine), inter-op 1, sequential execution, graph
optimisation level ``ORT_ENABLE_ALL`` unless told otherwise (ONNX Runtime documentation,
"Graph optimizations" and "Thread management"). :func:`session_record` is what build.json,
run.json and the report say of it.
"""

import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from variants.arch.encoder import EncoderOutput

#: the inputs the suite feeds a graph, by name: what the tokenizer makes
FED_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: --ort-opt-level -> onnxruntime.GraphOptimizationLevel member
OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def ort():
    """The ``onnxruntime`` module; ValueError naming the extra to install when it is missing."""
    try:
        import onnxruntime
    except ImportError:
        raise ValueError("ONNX Runtime is not installed; pip install 'mlx-variants[onnx]' "
                         "(onnx, onnxruntime), or rerun scripts/setup.sh") from None
    return onnxruntime


def cores():
    """The CPU cores this process may run on (its affinity; ``os.cpu_count()`` without one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def make_session(model, threads=None, opt_level="all"):
    """An ``onnxruntime.InferenceSession`` on the CPU for ``model`` (a path, or the serialized
    bytes of an ONNX ModelProto). ``threads``: intra-op threads (default :func:`cores`);
    ``opt_level``: a key of :data:`OPT_LEVELS`.

    Raises ValueError (one line) when ONNX Runtime is missing or cannot load the graph."""
    rt = ort()
    if opt_level not in OPT_LEVELS:
        raise ValueError(f"graph optimisation level {opt_level!r} is not one of "
                         f"{', '.join(OPT_LEVELS)}; pass e.g. --ort-opt-level all")
    so = rt.SessionOptions()
    so.intra_op_num_threads = int(threads or cores())
    so.inter_op_num_threads = 1
    so.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(rt.GraphOptimizationLevel, OPT_LEVELS[opt_level])
    so.log_severity_level = 3  # errors only: its warnings are not one line
    src = os.fspath(model) if isinstance(model, (str, os.PathLike)) else model
    try:
        return rt.InferenceSession(src, sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own Fail / InvalidGraph / NoSuchFile types
        what = src if isinstance(src, str) else "the ONNX graph"
        first = " ".join(str(e).split())[:300]
        raise ValueError(f"ONNX Runtime cannot load {what}: {first}; check that the file is an "
                         "ONNX model this onnxruntime version runs") from None


def session_record(session, opt_level="all"):
    """{"onnxruntime", "providers", "graph_optimization_level", "intra_op_num_threads"}: what a
    run records of ``session`` (versions and settings, JSON-able)."""
    rt = ort()
    opts = session.get_session_options()
    return {"onnxruntime": rt.__version__, "providers": list(session.get_providers()),
            "graph_optimization_level": OPT_LEVELS[opt_level],
            "intra_op_num_threads": int(opts.intra_op_num_threads)}


#: ONNX (and ONNX Runtime contrib) ops whose quantization range spans the whole input tensor,
#: so each row's output depends on the rows batched with it
BATCH_DEPENDENT_OPS = ("DynamicQuantizeLinear", "DynamicQuantizeMatMul")


def batch_dependent(path):
    """The ops of :data:`BATCH_DEPENDENT_OPS` in the ONNX file at ``path`` (sorted; [] when
    none): ONNX Runtime's dynamic quantization picks one activation scale per tensor at run
    time, over every row and padded position of the batch, so a row's logits change with its
    batch-mates and a verdict on batched rows would not hold for the same row served alone."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = {n.op_type for n in model.graph.node}
    for f in model.functions:
        ops |= {n.op_type for n in f.node}
    return sorted(ops & set(BATCH_DEPENDENT_OPS))


def feeds(session, input_ids, attention_mask, token_type_ids=None):
    """{graph input name: NumPy array} for one batch, each in the integer type the graph
    declares. ``input_ids``, ``attention_mask``, ``token_type_ids``: (B, L) mx or NumPy arrays
    (``token_type_ids`` None = zeros)."""
    arrays = {"input_ids": input_ids, "attention_mask": attention_mask,
              "token_type_ids": (token_type_ids if token_type_ids is not None
                                 else np.zeros(np.shape(input_ids), np.int64))}
    return {i.name: np.asarray(arrays[i.name]).astype(_INT_TYPES[i.type])
            for i in session.get_inputs()}


class OrtEncoder(nn.Module):
    """An encoder computed by ONNX Runtime: ``(input_ids (B, L) int, attention_mask (B, L) 0/1,
    token_type_ids (B, L) int or None)`` -> EncoderOutput whose ``last_hidden`` is the graph's
    ``output`` (B, L, D) float32, as an mx.array. No MLX parameters: the weights live in the
    graph; ``external_bytes`` is the graph file's size (what :func:`variants.runtime.memory.
    model_bytes` counts for it).

    Parameters
    ----------
    session : onnxruntime.InferenceSession
    output : str
        The graph output read (checked by :func:`variants.onnx.check.check_graph`).
    external_bytes : int
        Bytes of the ONNX file (weights as stored).
    record : dict
        :func:`session_record` (for timing records).
    """

    def __init__(self, session, output, external_bytes, record=None, per_row=False):
        super().__init__()
        self.__dict__.update(_session=session, _output=output, external_bytes=int(external_bytes),
                             record=dict(record or {}), per_row=bool(per_row))

    @property
    def kernel(self):
        """The name timing records give its calls: ``onnxruntime-<version>-cpu``."""
        return f"onnxruntime-{self.record.get('onnxruntime', '?')}-cpu"

    def run(self, input_ids, attention_mask, token_type_ids=None):
        """The graph's ``output`` for one batch, a NumPy float32 array. With ``per_row`` each row
        runs alone, its padding cut off (a token output is padded back with zeros): for graphs
        whose rows depend on their batch-mates (:func:`batch_dependent`)."""
        if not self.per_row:
            f = feeds(self._session, input_ids, attention_mask, token_type_ids)
            return np.asarray(self._session.run([self._output], f)[0], np.float32)
        ids, mask = np.asarray(input_ids), np.asarray(attention_mask)
        types = None if token_type_ids is None else np.asarray(token_type_ids)
        outs = []
        for i in range(len(ids)):
            n = max(int(mask[i].sum()), 1)  # right padding, as the suite's tokenizer pads
            f = feeds(self._session, ids[i:i + 1, :n], mask[i:i + 1, :n],
                      None if types is None else types[i:i + 1, :n])
            y = np.asarray(self._session.run([self._output], f)[0], np.float32)
            if y.ndim == 3:  # tokens: back to the batch's length
                y = np.pad(y, ((0, 0), (0, ids.shape[1] - n), (0, 0)))
            outs.append(y)
        return np.concatenate(outs)

    def __call__(self, input_ids, attention_mask, token_type_ids=None, **_):
        return EncoderOutput(mx.array(self.run(input_ids, attention_mask, token_type_ids)))


class OrtModule(OrtEncoder):
    """A whole decision module computed by ONNX Runtime: ``(input_ids, attention_mask,
    token_type_ids)`` -> the graph's ``output`` (B, K) float32, for a graph that ends in the
    model's own head (its logits, or a choice model's text embedding (B, D))."""

    def __call__(self, input_ids, attention_mask, token_type_ids=None, **_):
        return mx.array(self.run(input_ids, attention_mask, token_type_ids))

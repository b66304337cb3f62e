"""A small ONNX graph builder: nodes, initializers and unique names, made into a
``onnx.ModelProto`` with the ``onnx`` package alone (``onnx.helper`` / ``onnx.numpy_helper``).

Every node and tensor name is unique in the graph: :meth:`Graph.fresh` adds ``_1``, ``_2``,
... to a hint already taken, so builders name things after the module path they come from
(``encoder.layers.0.attention.query/MatMul``) without keeping count. Small constants
(scalars, shape vectors) are shared: :meth:`Graph.const` with ``share=True`` returns the name
of an equal initializer made before.

The model targets ONNX opset :data:`OPSET` with IR version :data:`IR_VERSION` (ONNX Runtime
1.32 loads it), plus the ``com.microsoft`` domain (version 1) when a node uses it
(``MatMulNBits``).
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: the default ONNX opset of the graphs (Gelu needs 20, LayerNormalization 17)
OPSET = 21
#: the IR version written in the model (the one opset 21 came with; ONNX Runtime 1.32 loads
#: IR 10 to 13, checked)
IR_VERSION = 10
#: ONNX Runtime's contrib-op domain (MatMulNBits)
MS_DOMAIN = "com.microsoft"

FLOAT, INT64, INT32, UINT8, INT8 = (TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32,
                                    TensorProto.UINT8, TensorProto.INT8)


class Graph:
    """An ONNX graph being built.

    ``op`` appends a node and returns its output name(s); ``const`` adds an initializer from a
    NumPy array; ``input`` / ``output`` declare the graph's interface; ``model`` returns the
    checked ``onnx.ModelProto``. Nodes must be added in topological order (each after the
    nodes that make its inputs), as builders naturally do.
    """

    def __init__(self, name="graph"):
        self.name = name
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self.domains = set()
        self._taken = set()
        self._shared = {}
        #: tensors builders share by a key of their own (e.g. one input's W8A8 codes, read by
        #: the query, key and value Linears alike)
        self.memo = {}

    def fresh(self, hint):
        """A name not used yet in the graph: ``hint``, else ``hint_1``, ``hint_2``, ..."""
        name, k = hint, 0
        while name in self._taken:
            k += 1
            name = f"{hint}_{k}"
        self._taken.add(name)
        return name

    def const(self, array, hint="const", share=False):
        """Add ``array`` (a NumPy array or scalar, its dtype kept) as an initializer; return
        its name. ``share=True``: reuse an equal initializer added with ``share=True`` before
        (for scalars and shape vectors)."""
        a = np.asarray(array)
        key = (a.dtype.str, a.shape, a.tobytes()) if share else None
        if key is not None and key in self._shared:
            return self._shared[key]
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(a), name))
        if key is not None:
            self._shared[key] = name
        return name

    def scalar(self, value, dtype=np.float32):
        """A shared 0-d constant of ``dtype`` (a NumPy dtype)."""
        a = np.asarray(value, dtype)
        return self.const(a, f"c_{a.dtype.name}_{a.item()}".replace("-", "m"), share=True)

    def ints(self, values):
        """A shared 1-d int64 constant (shapes, axes, slice bounds)."""
        a = np.asarray(values, np.int64).reshape(-1)
        return self.const(a, "i64_" + "_".join(str(v).replace("-", "m") for v in a), share=True)

    def op(self, op_type, inputs, hint=None, *, outputs=1, domain="", **attrs):
        """Append a node ``op_type`` on ``inputs`` (names; "" for an omitted optional input)
        with attributes ``attrs``; return its output name (a list of ``outputs`` names when
        ``outputs > 1``). ``hint`` (default ``op_type``) names the outputs."""
        hint = hint or op_type
        outs = [self.fresh(hint if outputs == 1 else f"{hint}:{i}") for i in range(outputs)]
        if domain:
            self.domains.add(domain)
        self.nodes.append(helper.make_node(op_type, list(inputs), outs,
                                           name=self.fresh(f"{hint}/{op_type}"),
                                           domain=domain or None, **attrs))
        return outs[0] if outputs == 1 else outs

    def input(self, name, elem_type, shape):
        """Declare graph input ``name`` of ``elem_type`` (a ``TensorProto`` type) and ``shape``
        (ints or strings for symbolic axes); returns ``name``."""
        self._taken.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, value, name, elem_type, shape):
        """Declare graph output ``name`` holding tensor ``value`` (an Identity node when the
        names differ); returns ``name``."""
        if value != name:
            self._taken.add(name)
            self.nodes.append(helper.make_node("Identity", [value], [name],
                                               name=self.fresh(f"{name}/Identity")))
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def model(self, doc="", producer="mlx-variants", metadata=None):
        """The ``onnx.ModelProto`` of the graph (opset :data:`OPSET`, IR :data:`IR_VERSION`,
        ``com.microsoft`` version 1 when used), checked by ``onnx.checker`` (which raises
        ``onnx.checker.ValidationError`` on a malformed graph). ``metadata``: {key: value}
        strings written as the model's metadata_props."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs,
                                  self.initializers, doc_string=doc or None)
        opsets = [helper.make_opsetid("", OPSET)]
        opsets += [helper.make_opsetid(d, 1) for d in sorted(self.domains)]
        m = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION,
                              producer_name=producer)
        for k, v in (metadata or {}).items():
            m.metadata_props.append(onnx.StringStringEntryProto(key=str(k), value=str(v)))
        onnx.checker.check_model(m)
        return m

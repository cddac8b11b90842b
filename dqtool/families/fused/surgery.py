"""Graph surgery the fused rewrites share: lazily computed constants (initializers, or
Constant nodes inside functions), and replacing one node by a chain that takes over its
output (name, type, shape, consumers, graph outputs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from dqtool import types


class Builder:
    """Builds the nodes that replace ``node``; ``fresh`` names values uniquely."""

    def __init__(self, node: ir.Node, fresh: Callable[[str], str],
                 in_function: bool = False) -> None:
        self.node = node
        self.graph = node.graph
        self.fresh = fresh
        # Functions have no initializers: constants are Constant nodes there.
        self.in_function = in_function
        self.nodes: list[ir.Node] = []
        self.created: set[str] = set()  # initializers made here
        self.base = node.name or node.outputs[0].name or node.op_type

    def constant(self, role: str, dtype: ir.DataType, shape: Sequence[int],
                 make: Callable[[], ir.TensorProtocol | np.ndarray]) -> ir.Value:
        """A constant computed only when the model is saved (``LazyTensor``)."""
        name = self.fresh(f"{self.base}/{role}")
        shape = tuple(int(d) for d in shape)

        def tensor() -> ir.TensorProtocol:
            t = make()
            if isinstance(t, np.ndarray):
                t = ir.Tensor(np.ascontiguousarray(t), dtype=dtype, name=name)
            assert tuple(t.shape) == shape, (name, tuple(t.shape), shape)
            return t

        lazy = ir.LazyTensor(tensor, dtype=dtype, shape=ir.Shape(shape), name=name)
        return self.value_of(lazy, name, dtype, shape)

    def existing(self, tensor: ir.TensorProtocol, role: str) -> ir.Value:
        """A constant holding an already made tensor (e.g. another view of stored bytes)."""
        name = self.fresh(f"{self.base}/{role}")
        tensor.name = name
        return self.value_of(tensor, name, tensor.dtype, tuple(int(d) for d in tensor.shape))

    def value_of(self, tensor: ir.TensorProtocol, name: str, dtype: ir.DataType,
                 shape: tuple[int, ...]) -> ir.Value:
        if self.in_function:
            cnode = ir.node("Constant", [], {"value": tensor}, name=f"{self.base}/{name}")
            self.nodes.append(cnode)
            out = cnode.outputs[0]
            out.name, out.dtype, out.shape = name, dtype, ir.Shape(shape)
            return out
        value = ir.Value(name=name, const_value=tensor, type=ir.TensorType(dtype),
                         shape=ir.Shape(shape))
        self.graph.register_initializer(value)
        self.created.add(name)
        return value

    def small(self, role: str, arr: np.ndarray) -> ir.Value:
        arr = np.asarray(arr)
        return self.constant(role, types.from_dtype(arr.dtype).ir_type, arr.shape, lambda: arr)

    def op(self, op_type: str, inputs: Sequence[ir.Value | None], role: str,
           attributes: dict | None = None, dtype: ir.DataType | None = None,
           shape: Sequence[int | str | None] | None = None) -> ir.Value:
        n = ir.node(op_type, list(inputs), attributes or {}, name=f"{self.base}/{role}")
        out = n.outputs[0]
        out.name = self.fresh(f"{self.base}/{role}")
        if dtype is not None:
            out.dtype = dtype
        if shape is not None:
            out.shape = ir.Shape(list(shape))
        self.nodes.append(n)
        return out

    def finish(self, result: ir.Value) -> None:
        """Put the new nodes where ``node`` was; ``result`` takes over its output."""
        old = self.node.outputs[0]
        name, dtype, shape, doc = old.name, old.dtype, old.shape, old.doc_string
        meta = dict(old.metadata_props)
        old.name = self.fresh(f"{name}/replaced")
        ir.convenience.replace_nodes_and_values(
            self.graph, self.node, [self.node], self.nodes, [old], [result])
        result.name = name
        if dtype is not None:
            result.dtype = dtype
        if shape is not None:
            result.shape = shape
        result.doc_string = doc
        result.metadata_props.update(meta)

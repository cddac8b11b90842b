"""Small helpers over onnx_ir: where nodes live, which values are constant, their shapes.

Nothing here reads tensor data unless asked for a value (``constant_array``,
``tensor_values``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import types
from dqtool.errors import InputError
from dqtool.messages import one_line

DEFAULT_DOMAINS = ("", "ai.onnx")


def domain_name(domain: str) -> str:
    """The domain as reports spell it: ``ai.onnx`` for the default domain."""
    return "ai.onnx" if domain in DEFAULT_DOMAINS else domain


def opset_of(opsets: dict[str, int], domain: str) -> int | None:
    if domain in DEFAULT_DOMAINS:
        return opsets.get("", opsets.get("ai.onnx"))
    return opsets.get(domain)


@dataclass(frozen=True)
class Site:
    """A node and where it lives: its graph's path and the opset imports in force."""

    node: ir.Node
    graph: str  # "main", "main/If_0/then_branch", "function:pkg.Local"
    opsets: dict[str, int]
    function: ir.Function | None = None


def _walk_graph(
    graph: ir.Graph | ir.Function, path: str, opsets: dict[str, int], fn: ir.Function | None
) -> Iterator[Site]:
    for node in graph:
        yield Site(node, path, opsets, fn)
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                subs = [attr.value]
            elif attr.type == ir.AttributeType.GRAPHS:
                subs = list(attr.value)
            else:
                continue
            for i, sub in enumerate(subs):
                label = attr.name if len(subs) == 1 else f"{attr.name}[{i}]"
                node_label = node.name or node.op_type
                yield from _walk_graph(sub, f"{path}/{node_label}/{label}", opsets, fn)


CALL_SITE = "dqtool.call_site"  # value.meta key: (type, shape) all call sites agree on


def bind_function_inputs(model: ir.Model) -> None:
    """Give each model-local function input the type (and shape) that all of its call sites
    agree on, in ``value.meta`` — FunctionProto declares no input types, so a DQ inside a
    function is otherwise untyped. Nothing is written to the model."""
    functions = model.functions
    if not functions:
        return
    calls: dict[ir.OperatorIdentifier, list[ir.Node]] = {key: [] for key in functions}
    graphs = [model.graph, *functions.values()]
    for g in graphs:
        for node in ir.traversal.RecursiveGraphIterator(g):
            key = (node.domain, node.op_type, node.overload)
            if key in calls:
                calls[key].append(node)
    # Functions may call functions: repeat until nothing new is learned.
    for _ in range(len(functions)):
        changed = False
        for key, fn in functions.items():
            for i, param in enumerate(fn.inputs):
                seen = {(elem_type(input_value(n, i)), shape_of(input_value(n, i)))
                        for n in calls[key]}
                kinds = {t for t, _ in seen}
                if len(kinds) != 1 or None in kinds:
                    continue
                shapes = {s for _, s in seen}
                bound = (kinds.pop(), shapes.pop() if len(shapes) == 1 else None)
                if param.meta.get(CALL_SITE) != bound:
                    param.meta[CALL_SITE] = bound
                    changed = True
        if not changed:
            break


def walk(model: ir.Model) -> Iterator[Site]:
    """Every node of the model: main graph, subgraphs, model-local functions."""
    bind_function_inputs(model)
    yield from _walk_graph(model.graph, "main", dict(model.opset_imports), None)
    for fn in model.functions.values():
        label = f"function:{fn.domain}.{fn.name}" if fn.domain else f"function:{fn.name}"
        if fn.overload:
            label += f":{fn.overload}"
        yield from _walk_graph(fn, label, dict(fn.opset_imports), fn)


def input_value(node: ir.Node, index: int) -> ir.Value | None:
    """The node's index-th input, or None when absent or given as the empty name."""
    if index >= len(node.inputs):
        return None
    return node.inputs[index]


def constant_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The tensor a value always holds (initializer or Constant node), else None.

    An initializer that is also a graph input can be overridden at run time, so it is
    not constant.
    """
    if value is None:
        return None
    if value.const_value is not None and not value.is_graph_input():
        # while a save writes the model: the tensor its data-file reference stands for
        # (``data_writer.PlacedTensor``), whose bytes may not be in that file yet
        return getattr(value.const_value, "placed_source", value.const_value)
    producer = value.producer()
    if (producer is not None and producer.op_type == "Constant"
            and producer.domain in DEFAULT_DOMAINS):
        attr = producer.attributes.get("value")
        if attr is not None and attr.type == ir.AttributeType.TENSOR:
            return attr.value
    return None


def constant_node(value: ir.Value) -> ir.Node | None:
    """The Constant node (no inputs) ``value`` is the output of, or None."""
    p = value.producer()
    return p if p is not None and p.op_type == "Constant" and p.domain in DEFAULT_DOMAINS \
        and not p.inputs else None


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The values of the tensor ``value`` always holds (``tensor_values``), else None."""
    tensor = constant_tensor(value)
    return None if tensor is None else tensor_values(tensor)


def tensor_values(tensor: ir.TensorProtocol) -> np.ndarray:
    """A tensor's values in its own shape (2/4-bit codes one a byte, in their ml_dtypes
    type): the one reader of constants. A tensor of a file reads itself without keeping
    the file mapped (``dqtool.storage``'s tensors, see ``storage.tensor_reads``)."""
    # Reshaped: onnx_ir gives a packed sub-byte scalar the shape (1,).
    return tensor.numpy().reshape(tuple(int(d) for d in tensor.shape))


# How far back through QuantizeLinear/DequantizeLinear (and data movement, for types) a
# type or shape is looked for: real models pair them (two steps); a longer walk per node
# would make a deep chain quadratic.
SHAPE_HOPS = 16


def elem_type(value: ir.Value | None) -> str | None:
    """The ONNX name of a value's element type, from its declaration or its constant."""
    # A bounded loop, not recursion: a QuantizeLinear's type is its zero point's, which
    # another QuantizeLinear may make, and so on as deep as the graph; a Gather's is its
    # table's.
    for _ in range(SHAPE_HOPS):
        if value is None:
            return None
        dtype = value.dtype
        if dtype is None:
            tensor = constant_tensor(value)
            dtype = tensor.dtype if tensor is not None else None
        if dtype is not None:
            return types.name_of(dtype)
        bound = value.meta.get(CALL_SITE)
        if bound:
            return bound[0]
        producer = value.producer()
        if producer is None:
            return None
        if producer.op_type == "QuantizeLinear" and value.index() == 0:
            # For models without value_info (quantizers rarely write it): the zero point's
            # type, else output_dtype, else uint8.
            zp = input_value(producer, 2)
            if zp is None:
                return _output_dtype(producer)
            value = zp
        elif (producer.op_type in _TYPE_KEEPING and producer.domain in DEFAULT_DOMAINS
              and producer.inputs):
            value = producer.inputs[0]
        else:
            return None
    return None


# Operators whose first output has their first input's element type (data movement only):
# enough of onnx's type inference to type a DequantizeLinear fed by a Gather of a table.
_TYPE_KEEPING = frozenset({"Gather", "GatherElements", "GatherND", "Reshape", "Transpose",
                           "Squeeze", "Unsqueeze", "Flatten", "Slice", "Identity", "Expand",
                           "Tile", "Concat", "Split", "Pad"})


def _output_dtype(quantize: ir.Node) -> str | None:
    attr = quantize.attributes.get("output_dtype")
    if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.INT and attr.value:
        t = types.from_onnx_int(attr.value)
        return t.name if t else None
    return "uint8"


def shape_of(value: ir.Value | None) -> tuple[int | str | None, ...] | None:
    # A bounded loop over the Q/DQ chain, not recursion: its depth is the graph's.
    shape = None
    for _ in range(SHAPE_HOPS):
        if value is None:
            return None
        shape = value.shape
        if shape is None:
            tensor = constant_tensor(value)
            shape = tensor.shape if tensor is not None else None
        if shape is None and value.meta.get(CALL_SITE):
            return value.meta[CALL_SITE][1]
        if shape is not None:
            break
        producer = value.producer()
        # Q/DQ keep their input's shape.
        if producer is None or producer.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            return None
        value = input_value(producer, 0)
    if shape is None:
        return None
    dims: list[int | str | None] = []
    for d in shape:
        if isinstance(d, int):
            dims.append(d)
        else:
            dims.append(d.value if d.value is not None else None)
    return tuple(dims)


def num_elements(shape: tuple[int | str | None, ...] | None) -> int | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return math.prod(shape)  # Python integers: a hostile 2^40 x 2^40 does not wrap


def stored_bytes(type_name: str | None, shape: tuple[int | str | None, ...] | None) -> int | None:
    """Bytes a tensor of this type and shape takes in a model (packed types packed)."""
    n = num_elements(shape)
    if n is None or type_name is None or type_name not in types.TYPES:
        return None
    return (n * types.TYPES[type_name].bits + 7) // 8


def first_out_of_order(g: ir.Graph | ir.Function,
                       outer: frozenset[ir.Value] = frozenset()) -> tuple[ir.Node, ir.Value] | None:
    """The first node of ``g`` that reads (itself or in a subgraph) a value made by a node
    after it, and that value; None when the graph is topologically sorted as onnx requires.
    A subgraph may read what its parent graph made before the node that holds it."""
    available = set(outer)
    for node in g:
        for v in node.inputs:
            if v is not None and v.producer() is not None and v not in available:
                return node, v
        for attr in node.attributes.values():
            if attr.is_ref():  # a function's attribute reference: no graph of its own here
                continue
            subs = [attr.value] if attr.type == ir.AttributeType.GRAPH else (
                list(attr.value) if attr.type == ir.AttributeType.GRAPHS else [])
            for sub in subs:
                found = first_out_of_order(sub, frozenset(available))
                if found is not None:
                    return node, found[1]  # the node of `g` that holds the subgraph
        available.update(node.outputs)
    return None


def sort_if_needed(model: ir.Model) -> list[str]:
    """Put the main graph and each function in topological order when they are not (onnx
    requires it; onnxruntime's quantizer writes an If before the node that makes a value
    its branches read). Sorted graphs are left exactly as they are. Returns what was done."""
    done = []
    for g, label in [(model.graph, "main graph"),
                     *((f, f"function {f.name}") for f in model.functions.values())]:
        found = first_out_of_order(g)
        if found is None:
            continue
        node, value = found
        try:
            g.sort()
        except ValueError as e:  # onnx_ir: "Graph contains a cycle"
            raise InputError(f"{label}: the nodes form a cycle, which no ONNX graph may "
                             f"({one_line(e)})") from None
        done.append(f"{label}: nodes put in topological order ({node.op_type} "
                    f"'{node.name}' read '{value.name}' before the node that makes it)")
    return done

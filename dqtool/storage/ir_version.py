"""The lowest IR version a model needs: its opsets, element types and fields."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_ir as ir

from dqtool import types

_TYPE_IR = {"float8e4m3fn": 9, "float8e4m3fnuz": 9, "float8e5m2": 9, "float8e5m2fnuz": 9,
            "int4": 10, "uint4": 10, "float4e2m1": 11, "float8e8m0": 12, "int2": 13,
            "uint2": 13, "float6e2m3": 14, "float6e3m2": 14}


def lowest_ir_version(model: ir.Model) -> int:
    """The lowest IR version that the model's opsets (every domain onnx knows: ai.onnx,
    ai.onnx.ml, training, preview) and element types need."""
    opsets: dict[str, int] = {}
    for imports in [model.opset_imports, *(f.opset_imports for f in model.functions.values())]:
        for domain, version in imports.items():
            domain = "" if domain == "ai.onnx" else domain
            opsets[domain] = max(opsets.get(domain, 0), version)
    table = onnx.helper.OP_SET_ID_VERSION_MAP
    known = {d or "ai.onnx" for d, _ in table}
    if any((d or "ai.onnx") in known and (d or "ai.onnx", v) not in table
           for d, v in opsets.items()):
        ir_version = onnx.IR_VERSION  # an opset newer than the installed onnx's table
    else:
        ir_version = onnx.helper.find_min_ir_version_for(
            [onnx.helper.make_opsetid(d, v) for d, v in opsets.items()], ignore_unknown=True)
    for dtype in _dtypes(model):
        ir_version = max(ir_version, _TYPE_IR.get(types.name_of(dtype) or "", 0))
    # Fields newer than the opsets may need: function overloads and node metadata came with
    # IR 10, model-local functions with IR 7; before IR 4 every initializer had to be a
    # graph input.
    if any(f.overload for f in model.functions.values()) or _any_node_metadata(model):
        ir_version = max(ir_version, 10)
    if model.functions:
        ir_version = max(ir_version, 7)
    if any(not set(g.initializers.values()) <= set(g.inputs) for g in model.graphs()):
        ir_version = max(ir_version, 4)
    return ir_version


def _any_node_metadata(model: ir.Model) -> bool:
    return any(node.metadata_props for root in [model.graph, *model.functions.values()]
               for node in ir.traversal.RecursiveGraphIterator(root))


def _dtypes(model: ir.Model) -> Iterator[ir.DataType]:
    """The element type of every typed value and constant of every graph and function."""
    for g in model.graphs():  # the main graph and its subgraphs
        for v in [*g.inputs, *g.outputs, *g.initializers.values()]:
            if v.dtype is not None:
                yield v.dtype
    for root in [model.graph, *model.functions.values()]:
        for node in ir.traversal.RecursiveGraphIterator(root):
            for v in node.outputs:
                if v.dtype is not None:
                    yield v.dtype
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR and not attr.is_ref():
                    yield attr.value.dtype

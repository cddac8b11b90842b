"""A DequantizeLinear of rows gathered from a constant table, moved before the Gather.

onnxruntime's dynamic quantizer (and others) store an embedding as a quantized table read
by ``Gather`` and dequantize the gathered rows: ``table → Gather → DequantizeLinear``. That
DequantizeLinear's x is computed (by the Gather), so it is not a constant to fold; yet its
dequantization is the table's. With a per-tensor scale and zero point, dequantizing the
gathered rows and gathering the dequantized table give the same values, element for
element (and the same error for an index out of range), so the fold moves the node before
the Gather and folds the table: ``float table → Gather``.
"""

from __future__ import annotations

import onnx_ir as ir

from dqtool import graph, types
from dqtool.spec import QuantSpec

_GATHER = ("", "ai.onnx")


def gathered_table(node: ir.Node, spec: QuantSpec) -> ir.Node | None:
    """The Gather whose rows ``node`` dequantizes, where the node can move before it
    exactly: per-tensor constant scale and zero point, the Gather's table a constant, and
    the gathered rows read by this node alone (and not a graph output)."""
    # (x as stored: codes packed across rows, as opmx packs int4 along dim 0, gather
    # other rows than the table's logical ones)
    if spec.granularity != "per-tensor" or spec.x_from_quantize or spec.packing != "none" \
            or node.domain not in ("", "ai.onnx", "com.microsoft"):
        return None
    x = graph.input_value(node, 0)
    gather = x.producer() if x is not None else None
    if gather is None or gather.op_type != "Gather" or gather.domain not in _GATHER:
        return None
    table = graph.input_value(gather, 0)
    if table is None or graph.constant_tensor(table) is None or table.is_graph_input():
        return None
    if len(x.uses()) != 1 or x.is_graph_output() or _is_function_output(x, node):
        return None
    for i in (1, 2):
        v = graph.input_value(node, i)
        if v is not None and graph.constant_tensor(v) is None:
            return None
    return gather


def _is_function_output(v: ir.Value, node: ir.Node) -> bool:
    g = node.graph
    return g is not None and any(o is v for o in g.outputs)


def move_before(node: ir.Node, gather: ir.Node, spec: QuantSpec, fresh) -> None:
    """``node`` dequantizes ``gather``'s table, and ``gather`` gathers from that; the
    gathered values take over ``node``'s output (name, type, readers). ``fresh(base)``
    names the dequantized table."""
    y, rows = node.outputs[0], gather.outputs[0]
    table = graph.input_value(gather, 0)
    owner = node.graph
    assert owner is not None and table is not None
    readers = [(u.node, u.idx) for u in y.uses()]
    outputs = [i for i, o in enumerate(owner.outputs) if o is y]
    node.replace_input_with(0, table)
    gather.replace_input_with(0, y)
    for reader, idx in readers:
        reader.replace_input_with(idx, rows)
    for i in outputs:
        owner.outputs[i] = rows
    name, shape = y.name, y.shape
    dtype = y.dtype or (types.by_name(spec.float_type).ir_type if spec.float_type else None)
    y.name = fresh(f"{name}/table")
    rows.name, rows.shape = name, shape
    if dtype is not None:
        rows.dtype = y.dtype = dtype
    y.shape = table.shape
    owner.remove(node)
    owner.insert_before(gather, node)

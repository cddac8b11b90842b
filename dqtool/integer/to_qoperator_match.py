"""What the fusion into integer operators reads of the QDQ side: a DequantizeLinear input
(``Dq``) an integer operator can take, the QuantizeLinear after a float op, and where an
activation's codes and scale come from (DynamicQuantizeLinear, a Gather of a quantized table).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer.describe import value_shape, value_type

MS = "com.microsoft"


@dataclass
class Dq:
    """A DequantizeLinear input: its quantized value, scale, zero point and axis."""

    node: ir.Node
    x: ir.Value
    scale: ir.Value
    zp: ir.Value | None
    axis: int | None  # None when per-tensor

    @property
    def const(self) -> bool:
        """Value, scale and zero point all constant (a weight, not an activation)."""
        return graph.constant_tensor(self.x) is not None and \
            graph.constant_tensor(self.scale) is not None and \
            (self.zp is None or graph.constant_tensor(self.zp) is not None)


# The Q/DQ domains whose nodes fuse (onnxruntime's selectors take both), and the types the
# integer operators take (8-bit; an int32 bias is checked on its own).
QDQ_DOMAINS = frozenset({*graph.DEFAULT_DOMAINS, MS})
EIGHT_BIT = frozenset({"int8", "uint8"})


def dq(value: ir.Value | None, types: frozenset[str] = EIGHT_BIT) -> Dq | None:
    """``value`` as a DequantizeLinear input of one of ``types``, per-tensor or per-axis
    (not blocked); None when it is not one or its scale's shape is unknown."""
    p = value.producer() if value is not None else None
    if p is None or p.op_type != "DequantizeLinear" or p.domain not in QDQ_DOMAINS:
        return None
    known = value_type(p.inputs[0]) or value_type(graph.input_value(p, 2))
    if known is not None and known not in types:  # unknown: the zero point would say
        return None
    if len(p.inputs) < 2 or p.inputs[1] is None or "block_size" in p.attributes:
        return None
    shape = value_shape(p.inputs[1])
    if shape is None:
        return None
    axis = None
    if graph.num_elements(shape) != 1:
        if len(shape) != 1:
            return None
        rank = graph.shape_of(p.inputs[0])
        a = p.attributes.get("axis")
        axis = a.value if a is not None else 1
        if axis < 0 and rank is not None:
            axis += len(rank)
    zp = graph.input_value(p, 2)
    return Dq(p, p.inputs[0], p.inputs[1], zp, axis)


def q_after(node: ir.Node) -> ir.Node | None:
    """The per-tensor 8-bit QuantizeLinear that alone reads ``node``'s output; None when
    there is none."""
    out = node.outputs[0]
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    q = uses[0].node
    if q.op_type != "QuantizeLinear" or q.domain not in QDQ_DOMAINS:
        return None
    if value_type(graph.input_value(q, 2)) not in (None, *EIGHT_BIT):
        return None
    if len(q.inputs) < 2 or graph.num_elements(graph.shape_of(q.inputs[1])) != 1:
        return None
    if "output_dtype" in q.attributes or "block_size" in q.attributes:
        return None
    return q


def dynamic_source(d: Dq, codes_only: bool = False) -> bool:
    """Codes, scale and zero point from one DynamicQuantizeLinear (``codes_only``: the
    codes and zero point, the scale being the exact form's 1)."""
    p = d.x.producer()
    return (p is not None and p.op_type == "DynamicQuantizeLinear" and d.axis is None
            and (codes_only or d.scale is p.outputs[1])
            and (d.zp is None or d.zp is p.outputs[2]))


def gathered(d: Dq) -> bool:
    """A per-tensor activation gathered from a constant quantized table (onnxruntime's
    dynamic quantizer quantizes an embedding statically and feeds the Gather's codes
    straight into MatMulInteger): its constant scale plays the run-time one's part."""
    p = d.x.producer()
    return (p is not None and p.op_type == "Gather" and d.axis is None and bool(p.inputs)
            and graph.constant_tensor(p.inputs[0]) is not None
            and graph.constant_tensor(d.scale) is not None)


def unit(d: Dq) -> bool:
    """A constant scale of 1 everywhere (``qdq --exact-dynamic``'s DequantizeLinear)."""
    scale = graph.constant_array(d.scale)
    return scale is not None and bool(np.all(np.asarray(scale) == 1))

"""onnxruntime's dynamic quantization pattern around a MatMulInteger / ConvInteger: its
int32 output (→ Add of an int32 bias) → Cast to float → Mul by ``a_scale·w_scale``, and which
of the two scales is the activation's. The rewrite to QDQ takes its scales from here, and
``local_error`` the float value the integer operator stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer.rewrite import Refused


@dataclass
class Scaled:
    """The nodes and values of one match of the pattern."""

    cast: ir.Node
    mul: ir.Node
    scale: ir.Value  # the Mul's scale input: a_scale·w_scale
    a_scale: ir.Value
    w_scale: ir.Value
    add: ir.Node | None = None  # an int32 bias Add between the integer op and the Cast
    bias: ir.Value | None = None


def _is_int32(value: ir.Value, depth: int = 0) -> bool:
    """int32 by its declaration, or by the Cast that makes it through shape-only ops
    (quantizers write no value_info for their run-time bias)."""
    t = graph.elem_type(value)
    if t is not None or depth > 4:
        return t == "int32"
    p = value.producer()
    if p is None:
        return False
    if p.op_type == "Cast":
        to = p.attributes.get("to")
        return to is not None and to.value == ir.DataType.INT32
    if p.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Identity", "Expand") and p.inputs:
        return p.inputs[0] is not None and _is_int32(p.inputs[0], depth + 1)
    return False


def _only_use(value: ir.Value) -> ir.Node | None:
    """The one node that reads ``value``; None when it has more or fewer readers or is a
    graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def scaled_output(node: ir.Node) -> ir.Value:
    """The float value a MatMulInteger / ConvInteger stands for in onnxruntime's dynamic
    pattern (the output of its ``Mul`` by the scale product); ``Refused`` outside it."""
    return scaled_pattern(node).mul.outputs[0]


def scaled_pattern(node: ir.Node) -> Scaled:
    """The pattern around ``node`` with its activation and weight scales told apart;
    ``Refused`` (saying why there are no scales to dequantize with) outside it."""
    why = ("its int32 output is not Cast to float and multiplied by a_scale·w_scale (as "
           "onnxruntime's dynamic quantization writes it): no scales to dequantize with")
    nxt = _only_use(node.outputs[0])
    add = bias = None
    if nxt is not None and nxt.op_type == "Add" and len(nxt.inputs) == 2:
        other = [v for v in nxt.inputs if v is not node.outputs[0]]
        if len(other) == 1 and other[0] is not None and _is_int32(other[0]):
            add, bias = nxt, other[0]
            nxt = _only_use(nxt.outputs[0])
    cast = nxt
    to = cast.attributes.get("to") if cast is not None else None
    if cast is None or cast.op_type != "Cast" or to is None or to.value != ir.DataType.FLOAT:
        raise Refused(why)
    mul = _only_use(cast.outputs[0])
    if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2:
        raise Refused(why)
    scale = [v for v in mul.inputs if v is not cast.outputs[0]]
    prod = scale[0].producer() if scale and scale[0] is not None else None
    if prod is None or prod.op_type != "Mul" or len(prod.inputs) != 2:
        raise Refused(why)
    a_src = node.inputs[0].producer() if node.inputs[0] is not None else None
    s0, s1 = prod.inputs
    a_scale = a_src.outputs[1] if a_src is not None and \
        a_src.op_type == "DynamicQuantizeLinear" else None
    if a_scale is None:
        a_scale = _static_activation_scale(node, s0, s1)
    if a_scale is s0:
        return Scaled(cast, mul, scale[0], s0, s1, add, bias)
    if a_scale is s1:
        return Scaled(cast, mul, scale[0], s1, s0, add, bias)
    if graph.constant_tensor(s1) is not None and graph.constant_tensor(s0) is not None:
        raise Refused(why + " (both scales are constants: which is the activation's is "
                      "not known)")
    raise Refused(why)


def _static_activation_scale(node: ir.Node, s0: ir.Value | None, s1: ir.Value | None
                             ) -> ir.Value | None:
    """Which of two constant scales belongs to the activation when it was quantized
    statically (onnxruntime's dynamic quantizer feeds a quantized Gather of a quantized
    embedding straight into MatMulInteger): the scale a DequantizeLinear of the same
    activation (or of the same weight, for the other one) uses; else the per-channel one is
    the weight's. None when the graph does not tell."""
    pair = {id(s0): s0, id(s1): s1}
    for operand, own in ((node.inputs[0], True), (node.inputs[1], False)):
        if operand is None:
            continue
        for use in operand.uses():
            dq = use.node
            if dq.op_type != "DequantizeLinear" or use.idx != 0 or len(dq.inputs) < 2:
                continue
            hit = pair.get(id(dq.inputs[1]))
            if hit is not None:
                return hit if own else (s1 if hit is s0 else s0)
    sizes = [graph.num_elements(graph.shape_of(s)) for s in (s0, s1)]
    if sizes[0] == 1 and sizes[1] not in (None, 1):
        return s0
    if sizes[1] == 1 and sizes[0] not in (None, 1):
        return s1
    return None

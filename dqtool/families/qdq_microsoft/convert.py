"""com.microsoft DequantizeLinear / QuantizeLinear → ai.onnx.

The contrib ops take the same inputs and ``axis`` attribute (missing axis = 1 in both), so
the node only changes domain — when the target opset's ai.onnx op expresses its types and
granularity (int16/uint16/int4/uint4 need 21). Otherwise the node is kept in its domain
(it stays valid) and the report says why.
"""

from __future__ import annotations

import onnx_ir as ir

from dqtool import codecs, versions
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome, Registry


def register(reg: Registry) -> None:
    for op in ("DequantizeLinear", "QuantizeLinear"):
        reg.register("com.microsoft", op, 1, "onnx")(to_onnx)


def to_onnx(node: ir.Node, step: Step) -> Outcome:
    spec = codecs.read_node(node, {"com.microsoft": 1})
    if spec.errors:
        return Outcome("kept", "left as com.microsoft",
                       "invalid: " + "; ".join(p.message for p in spec.errors))
    reasons = versions.why_not(spec, step.dst)
    if reasons:
        lowest = versions.lowest_version(spec)
        hint = f" (needs ai.onnx {lowest}+)" if lowest else ""
        return Outcome("kept", "left as com.microsoft", "; ".join(reasons) + hint)
    node.domain = ""
    after = codecs.read_node(node, {"": step.dst})
    if after.errors:  # e.g. an attribute the ai.onnx version lacks; undo
        node.domain = "com.microsoft"
        return Outcome("kept", "left as com.microsoft",
                       "; ".join(p.message for p in after.errors))
    return Outcome("changed", f"com.microsoft → ai.onnx {node.op_type}-{step.dst}",
                   "same inputs and axis; ai.onnx expresses its types at this opset")


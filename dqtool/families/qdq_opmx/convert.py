"""OpenPPL opmx (and legacy pmx) DequantizeLinear → ai.onnx DequantizeLinear.

The node is rewritten in place (it keeps its name and output):
- int4 packed four nibbles per int16 along dim 0 is unpacked offline; with no zero point it
  becomes int4 ``nibble ^ 8`` (= nibble - 8, the implicit zero point), with an integer
  zero point uint4 ``nibble`` and that zero point as uint4; int8 stays int8;
- ``group_size`` → blocked (axis = quant_axis, block_size = group_size); a scale of shape
  (N, 1) → per-axis on the other axis;
- a float zero point → DequantizeLinear (no zero point) followed by Add. The kernel
  computes ``round_out(scale*q + zp)`` exactly-then-once; with a float16 scale the product
  is exact in float32 and the float32 Add then Cast to float16 rounds the same (24 ≥
  2·11+2 bits: double rounding is innocuous), so it is exact. With a float32 scale the
  product itself rounds, so that case is refused.
The ai.onnx form may need opset 21 (int4, blocked); the pipeline then lowers it step by step.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from dqtool import codecs, graph, types
from dqtool.convert import params
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome, Registry
from dqtool.kernel.opmx import unpack_opmx_int4
from dqtool.spec import QuantSpec


def register(reg: Registry) -> None:
    for domain in ("opmx", "pmx"):
        reg.register(domain, "DequantizeLinear", 1, "onnx")(to_onnx)


def to_onnx(node: ir.Node, step: Step) -> Outcome:
    spec = codecs.read_node(node, {node.domain: 1})
    if spec.errors:
        return Outcome.refused("invalid: " + "; ".join(p.message for p in spec.errors))
    x, scale, zp = (graph.input_value(node, i) for i in range(3))
    if graph.constant_tensor(x) is None:
        return Outcome("kept", f"left as {spec.domain}",
                       "x is computed at run time; its packed int4 cannot be unpacked offline")
    if spec.zero_point == "float" and spec.scale_type != "float16":
        return Outcome.refused(
            "a float zero point with a float32 scale: scale*q rounds in float32 before the "
            "Add, but opmx rounds scale*q + zero_point once, so no DequantizeLinear + Add is "
            "exact")
    if any(v is not None and graph.constant_tensor(v) is None for v in (scale, zp)):
        return Outcome("kept", f"left as {spec.domain}", "scale or zero point is not constant")
    x_shape = params.static_shape(spec.x_shape)
    if x_shape is None:
        return Outcome.refused("x has no static shape")
    how = _rewrite(node, step, spec, x, scale, zp, x_shape)
    return Outcome("changed", how, "opmx has an exact ai.onnx form")


def _rewrite(node: ir.Node, step: Step, spec: QuantSpec, x, scale, zp, x_shape) -> str:
    int4 = spec.packing != "none"
    integer_zp = spec.zero_point == "integer"
    if int4:
        qt = "uint4" if integer_zp else "int4"
        dtype = ml_dtypes.uint4 if integer_zp else ml_dtypes.int4

        def q_values() -> np.ndarray:
            nib = unpack_opmx_int4(graph.constant_array(x))
            return nib.astype(np.int8 if not integer_zp else np.uint8) - (
                0 if integer_zp else 8)

        q = step.constant(f"{x.name}_{qt}", types.by_name(qt).ir_type, x_shape,
                          lambda: q_values().astype(dtype))
    else:
        qt, q = "int8", x
    s_shape = params.static_shape(spec.scale_shape) or ()
    new_shape = s_shape
    if spec.granularity == "per-axis":
        new_shape = (s_shape[spec.axis],)
    elif spec.granularity == "per-tensor":
        new_shape = ()
    float_scale = spec.zero_point == "float"
    s_type = ir.DataType.FLOAT if float_scale else scale.dtype

    def reshaped(v, dtype, shape, base):
        return step.constant(f"{v.name}_{base}", dtype, shape,
                             lambda: graph.constant_array(v).astype(types.from_ir(dtype).dtype)
                             .reshape(shape))

    new_scale = scale if new_shape == s_shape and not float_scale else \
        reshaped(scale, s_type, new_shape, "onnx")
    inputs = [q, new_scale]
    if integer_zp:
        inputs.append(reshaped(zp, types.by_name(qt).ir_type, new_shape, qt))
    for v in node.inputs:
        if v is not None:
            step.ctx.replaced.append(v)
    node.resize_inputs(0)
    node.resize_inputs(len(inputs))
    for i, v in enumerate(inputs):
        node.replace_input_with(i, v)
    node.attributes.clear()
    if spec.granularity == "per-axis":
        node.attributes["axis"] = ir.AttrInt64("axis", spec.axis)
    elif spec.granularity == "blocked":
        node.attributes["axis"] = ir.AttrInt64("axis", spec.axis)
        node.attributes["block_size"] = ir.AttrInt64("block_size", spec.block_size)
    node.domain = ""
    how = f"{spec.domain} → ai.onnx DequantizeLinear ({qt}, {spec.granularity})"
    if float_scale:
        z = step.constant(f"{zp.name}_bias", ir.DataType.FLOAT, x_shape, lambda: np.broadcast_to(
            params.broadcastable(graph.constant_array(zp).astype(np.float32), spec, x_shape),
            x_shape))
        step.append([("Add", [z], {}, "add_zero_point"),
                     ("Cast", [], {"to": ir.DataType.FLOAT16}, "cast")], ir.DataType.FLOAT)
        how += "; float zero point → float32 Add then Cast to float16 (exact)"
    return how

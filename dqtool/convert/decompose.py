"""``--allow-decompose``: a DequantizeLinear no DequantizeLinear at N can express becomes
Cast/Sub/Cast/Mul(/Cast).

Exact: ``x - zp`` in int32 (wrapping like the kernel and onnxruntime for int32 x), one
conversion to float32 (round to nearest even, as the kernel does), one float32 multiply,
one rounding to the output type. Runtimes can no longer fuse it as QDQ, so it is a
warning.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.convert import params
from dqtool.convert.context import Step
from dqtool.convert.outputs import cast_allowed
from dqtool.convert.registry import Outcome
from dqtool.spec import QuantSpec


def decompose(step: Step, spec: QuantSpec, reasons: list[str]) -> Outcome:
    node = step.node
    x, scale, zp = (graph.input_value(node, i) for i in range(3))
    qt = spec.quant_type or "?"
    if qt not in types.TYPES or not _cast_from(qt, step.target):
        return Outcome.refused("; ".join(reasons) + f" (and Cast from {qt} does not exist at "
                               f"opset {step.target}, so it cannot be decomposed either)")
    out = spec.float_type
    if out is None or (out != "float" and not cast_allowed(out, step.target)):
        return Outcome.refused("; ".join(reasons) + f" (output {out} cannot be cast to)")
    x_shape = params.static_shape(spec.x_shape)
    params_const = all(v is None or graph.constant_tensor(v) is not None for v in (scale, zp))
    if spec.granularity != "per-tensor" and (x_shape is None or not params_const):
        return Outcome.refused("; ".join(reasons) + " (decomposing per-axis or blocked needs "
                               "a static x shape and a constant scale and zero point)")

    def laid(v: ir.Value, dtype: np.dtype, base: str) -> ir.Value:
        if spec.granularity == "per-tensor" and graph.constant_tensor(v) is None:
            return v
        shape = params.broadcastable(np.zeros(params.static_shape(spec.scale_shape) or (),
                                              np.int8), spec, x_shape or ()).shape
        return step.constant(f"{v.name}_{base}", types.from_dtype(dtype).ir_type, shape,
                             lambda: params.broadcastable(graph.constant_array(v), spec,
                                                          x_shape or ()).astype(dtype))

    integer = types.TYPES[qt].is_integer
    nodes: list[ir.Node] = []

    def add(op: str, inputs: list, attrs: dict, role: str) -> ir.Value:
        n = ir.node(op, inputs, attrs, name=step.ctx.fresh.node(f"{node.name}/{role}"))
        n.outputs[0].name = step.ctx.fresh(f"{node.outputs[0].name}/{role}")
        nodes.append(n)
        return n.outputs[0]

    v = x
    if integer:
        v = add("Cast", [v], {"to": ir.DataType.INT32}, "x_int32")
        if zp is not None:
            v = add("Sub", [v, laid(zp, np.dtype(np.int32), "int32")], {}, "sub_zero_point")
    v = add("Cast", [v], {"to": ir.DataType.FLOAT}, "to_float")
    s = laid(scale, np.dtype(np.float32), "float")
    if spec.scale_type != "float" and s is scale:
        s = add("Cast", [scale], {"to": ir.DataType.FLOAT}, "scale_float")
    y = add("Mul", [v, s], {}, "mul")
    if out != "float":
        y = add("Cast", [y], {"to": types.by_name(out).ir_type}, "cast")
    nodes[-1].name = node.name  # the last node carries the DequantizeLinear's name
    old = node.outputs[0]
    name, keep_dtype, keep_shape, doc = old.name, old.dtype, old.shape, old.doc_string
    node.graph.insert_after(node, nodes)
    ir.convenience.replace_all_uses_with(old, y, replace_graph_outputs=True)
    for i in range(3):
        if graph.input_value(node, i) is not None:
            step.ctx.replaced.append(node.inputs[i])
    node.graph.remove(node, safe=True)
    old.name = step.ctx.fresh(f"{name}/removed")
    y.name, y.shape, y.doc_string = name, keep_shape, doc
    if keep_dtype is not None:
        y.dtype = keep_dtype
    step.ctx.warnings.append(f"{node.name}: decomposed into Cast/Sub/Mul; runtimes can no "
                             "longer fuse it as a QDQ pair")
    return Outcome("changed", "decomposed into " + "/".join(n.op_type for n in nodes)
                   + " (int32 subtraction, one float32 multiply)", "; ".join(reasons))


def _cast_from(qt: str, opset: int) -> bool:
    return cast_allowed(qt, opset, side="T1")

"""DequantizeLinear output/scale rewrites: the float32 detour.

``output_dtype`` (23+), a float16/bfloat16 scale below 19 and a float8e8m0 scale below 24
all become: a float32 scale (every such scale converts to float32 exactly), a
DequantizeLinear producing float32, and a Cast to the original output type. The kernel and
onnxruntime compute ``float32(x - zp) * float32(scale)`` and round once to the output type;
the detour computes the same float32 product and the Cast is that one rounding.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph, types
from dqtool.convert import params
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome
from dqtool.spec import QuantSpec


def cast_allowed(to: str, opset: int, side: str = "T2") -> bool:
    """Cast at ``opset`` can produce ``to`` (``side="T1"``: can take it as input)."""
    try:
        s = onnx.defs.get_schema("Cast", opset, "")
    except onnx.defs.SchemaError:
        return False
    allowed = {t for c in s.type_constraints if c.type_param_str == side
               for t in c.allowed_type_strs}
    return f"tensor({to})" in allowed


def float32_detour(step: Step, spec: QuantSpec, why: str) -> Outcome:
    node = step.node
    out = spec.float_type
    if out is None:
        return Outcome.refused("the output type is unknown")
    if out != "float" and not cast_allowed(out, step.target):
        return Outcome.refused(f"the output is {out}, and Cast to {out} needs a newer opset "
                               f"than {step.target}")
    scale = graph.input_value(node, 1)
    if spec.scale_type != "float":
        if graph.constant_tensor(scale) is not None:
            shape = params.const_shape(scale)
            f32 = step.constant(f"{scale.name}_float", ir.DataType.FLOAT, shape,
                                lambda: graph.constant_array(scale).astype(np.float32))
        else:
            if not cast_allowed("float", step.target) or spec.scale_type == "float8e8m0":
                return Outcome.refused(f"the {spec.scale_type} scale is computed at run time")
            cast = ir.node("Cast", [scale], {"to": ir.DataType.FLOAT},
                           name=f"{node.name}/scale_to_float")
            node.graph.insert_before(node, cast)
            cast.outputs[0].name = step.ctx.fresh(f"{scale.name}/float")
            f32 = cast.outputs[0]
        step.set_input(1, f32)
    node.attributes.pop("output_dtype", None)
    how = f"{spec.scale_type} scale → float"
    if out != "float":
        step.append([("Cast", [], {"to": types.by_name(out).ir_type}, "cast")],
                    ir.DataType.FLOAT)
        how += (f", DequantizeLinear to float then Cast to {out} (one rounding; "
                "onnxruntime's CPU provider skips that Cast where the next node has no "
                f"{out} kernel: `check --against` shows it)")
    return Outcome("changed", how, why)

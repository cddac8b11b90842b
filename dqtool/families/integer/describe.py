"""An integer operator read into its meaning: small immutable data, never an exception.

``IntegerOpSpec`` says, for each quantized tensor of the node, its type, its scale and
zero point (types, shapes, granularity) and whether they are constant; what is wrong is in
``problems`` with a stable code, as the Q/DQ codecs do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer import ops
from dqtool.spec import P_INPUTS, P_NO_IMPORT, P_ZP, Dim, Granularity, HasProblems, Problem

P_NO_QDQ = "DQ032"  # info: the operator has no faithful QDQ form


@dataclass(frozen=True)
class Operand:
    """One quantized tensor of an integer operator (an input, or the output)."""

    role: str
    type: str | None
    scale_type: str | None
    zero_point_type: str | None
    granularity: Granularity | None
    axis: int | None
    shape: tuple[Dim, ...] | None
    scale_shape: tuple[Dim, ...] | None
    constant: bool  # the value itself (False for the output)
    scale_constant: bool
    zero_point_constant: bool
    has_zero_point: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role, "type": self.type, "scale_type": self.scale_type,
            "zero_point_type": self.zero_point_type, "granularity": self.granularity,
            "axis": self.axis, "shape": _dims(self.shape), "scale_shape": _dims(self.scale_shape),
            "constant": self.constant, "scale_constant": self.scale_constant,
            "zero_point_constant": self.zero_point_constant,
            "has_zero_point": self.has_zero_point,
        }


@dataclass(frozen=True)
class IntegerOpSpec(HasProblems):
    op: str
    domain: str
    version: int
    kind: ops.Kind
    inputs: tuple[Operand, ...]
    output: Operand | None  # None: the output is not quantized
    output_type: str | None
    bias_type: str | None
    qdq_form: bool  # it has a faithful QDQ form
    no_qdq_reason: str | None
    problems: tuple[Problem, ...] = field(default=())

    @property
    def weights_constant(self) -> bool:
        """Every weight operand is stored in the model with its scale and zero point."""
        weights = [o for o in self.inputs if o.role in _WEIGHT_ROLES.get(self.op, ())]
        return bool(weights) and all(
            o.constant and (o.scale_constant or o.scale_type is None)
            and (o.zero_point_constant or not o.has_zero_point) for o in weights)

    def to_json(self) -> dict[str, Any]:
        return {
            "op_type": self.op, "domain": self.domain, "version": self.version,
            "kind": self.kind, "inputs": [o.to_json() for o in self.inputs],
            "output": None if self.output is None else self.output.to_json(),
            "output_type": self.output_type, "bias_type": self.bias_type,
            "weights_constant": self.weights_constant, "qdq_form": self.qdq_form,
            "no_qdq_reason": self.no_qdq_reason,
            "problems": [p.message for p in self.problems],
            "problem_details": [{"code": p.code, "severity": p.severity, "message": p.message}
                                for p in self.problems],
        }


_WEIGHT_ROLES = {d.op: tuple(s.role for s in d.inputs if s.weight) for d in ops.OPS}


def _dims(shape) -> list | None:
    return None if shape is None else list(shape)


def is_integer_op(node: ir.Node) -> bool:
    return ops.lookup(graph.domain_name(node.domain), node.op_type) is not None


def granularity_of(param_shape: tuple[Dim, ...] | None, value_shape: tuple[Dim, ...] | None,
                   per_axis: int | None) -> tuple[Granularity | None, int | None]:
    """Per-tensor when the parameter holds one element; per-axis otherwise, on
    ``per_axis`` (the operator's channel axis) or where the parameter's one non-1
    dimension sits."""
    if param_shape is None:
        return None, None
    n = graph.num_elements(param_shape)
    if n == 1:
        return "per-tensor", None
    if len(param_shape) > 1:  # QLinearMatMul's [.., M, 1] / [.., 1, K]
        big = [i for i, d in enumerate(param_shape) if d != 1]
        axis = big[-1] if big else None
        if value_shape is not None and len(value_shape) >= len(param_shape) and axis is not None:
            axis += len(value_shape) - len(param_shape)
        return "per-axis", axis
    if per_axis is not None:
        return "per-axis", per_axis
    return "per-axis", None if value_shape is None else len(value_shape) - 1


def channel_axis(op: str, role: str, node: ir.Node, rank: int | None) -> int | None:
    """The axis a 1-D scale of this operand runs along."""
    if role == "w" and op in ("QLinearConv", "ConvInteger"):
        return 0
    if op == "QGemm" and role == "b":
        attr = node.attributes.get("transB")
        return 0 if attr is not None and attr.value else 1
    if op == "DynamicQuantizeLSTM":
        return None if rank is None else rank - 1
    return None if rank is None else rank - 1


# DynamicQuantizeLinear's outputs (y, y_scale, y_zero_point): quantizers write no
# value_info for them, and their types and shapes are fixed by the operator.
_DQL_OUTPUTS = (("uint8", None), ("float", ()), ("uint8", ()))


def value_type(value: ir.Value | None) -> str | None:
    t = graph.elem_type(value)
    if t is None and value is not None:
        p = value.producer()
        if p is not None and p.op_type == "DynamicQuantizeLinear" and value.index() is not None:
            return _DQL_OUTPUTS[value.index()][0]
    return t


def value_shape(value: ir.Value | None) -> tuple[Dim, ...] | None:
    shape = graph.shape_of(value)
    if shape is None and value is not None:
        p = value.producer()
        if p is not None and p.op_type == "DynamicQuantizeLinear":
            index = value.index() or 0
            return _DQL_OUTPUTS[index][1] if index else graph.shape_of(p.inputs[0])
    return shape


def _operand(node: ir.Node, slot: ops.Slot, op: str) -> Operand:
    value = graph.input_value(node, slot.value) if slot.value is not None else None
    scale = graph.input_value(node, slot.scale) if slot.scale is not None else None
    zp = graph.input_value(node, slot.zero_point) if slot.zero_point is not None else None
    if slot.value is None:  # the output: its type is the zero point's, else uint8
        out = node.outputs[0] if node.outputs else None
        qtype = value_type(out) or value_type(zp) or "uint8"
        shape = value_shape(out)
    else:
        qtype = value_type(value) or value_type(zp)
        shape = value_shape(value)
    param = scale if scale is not None else zp
    rank = None if shape is None else len(shape)
    gran, axis = granularity_of(value_shape(param), shape,
                                channel_axis(op, slot.role, node, rank))
    return Operand(
        role=slot.role, type=qtype, scale_type=value_type(scale),
        zero_point_type=value_type(zp), granularity=gran, axis=axis, shape=shape,
        scale_shape=value_shape(scale),
        constant=value is not None and graph.constant_tensor(value) is not None,
        scale_constant=scale is not None and graph.constant_tensor(scale) is not None,
        zero_point_constant=zp is not None and graph.constant_tensor(zp) is not None,
        has_zero_point=zp is not None,
    )


def _problems(node: ir.Node, opdef: ops.OpDef, operands: list[Operand],
              opsets: dict[str, int]) -> list[Problem]:
    out: list[Problem] = []
    where = f"{opdef.domain} {opdef.op}"
    if graph.domain_name(node.domain) != "ai.onnx" and node.domain not in opsets:
        out.append(Problem(P_NO_IMPORT, f"domain {opdef.domain} is used without an opset "
                           "import"))
    needed = [s for s in (*ops.slots_of(opdef, len(node.inputs)),) if s.value is not None]
    for s in needed:
        if graph.input_value(node, s.value) is None:
            if not (s.optional and graph.input_value(node, s.scale) is None):
                out.append(Problem(P_INPUTS, f"{where}: input '{s.role}' is missing"))
        elif s.scale is not None and graph.input_value(node, s.scale) is None:
            out.append(Problem(P_INPUTS, f"{where}: the scale of '{s.role}' is missing"))
    # QGemm's y_scale is optional (float output); every other quantized output needs one.
    if opdef.output is not None and opdef.output.scale is not None and opdef.op != "QGemm" \
            and graph.input_value(node, opdef.output.scale) is None:
        out.append(Problem(P_INPUTS, f"{where}: the output scale is missing"))
    if opdef.op == "QLinearConcat" and (len(node.inputs) < 5 or (len(node.inputs) - 2) % 3):
        out.append(Problem(P_INPUTS, f"{where} takes Y_scale, Y_zero_point and one (value, "
                           f"scale, zero point) per input; got {len(node.inputs)} inputs"))
    for o in operands:
        if o.zero_point_type and o.type and o.zero_point_type != o.type and \
                o.type not in ("float", "float16", "bfloat16"):
            out.append(Problem(P_ZP, f"{where}: zero point of '{o.role}' is "
                               f"{o.zero_point_type}, its value is {o.type}"))
    if opdef.no_qdq:
        out.append(Problem(P_NO_QDQ, f"no QDQ form: {opdef.no_qdq}", "info"))
    return out


def read(node: ir.Node, opsets: dict[str, int]) -> IntegerOpSpec | None:
    """The meaning of an integer operator, or None if the node is not one."""
    domain = graph.domain_name(node.domain)
    opdef = ops.lookup(domain, node.op_type)
    if opdef is None:
        return None
    version = node.version if node.version is not None else \
        graph.opset_of(opsets, node.domain) or opdef.since_version
    slots = ops.slots_of(opdef, len(node.inputs))
    inputs = [_operand(node, s, opdef.op) for s in slots]
    if opdef.op in ("DynamicQuantizeLinear", "DynamicQuantizeMatMul"):
        inputs = [_dynamic_input(node, opdef.op), *inputs]
    output = _operand(node, opdef.output, opdef.op) if opdef.output else None
    if opdef.op == "DynamicQuantizeLinear":
        output = _dynamic_output(node)
    out_value = node.outputs[0] if node.outputs else None
    out_type = graph.elem_type(out_value) or (output.type if output else _default_out(opdef))
    bias = graph.input_value(node, opdef.bias) if opdef.bias is not None else None
    return IntegerOpSpec(
        op=opdef.op, domain=domain, version=version, kind=opdef.kind, inputs=tuple(inputs),
        output=output, output_type=out_type, bias_type=graph.elem_type(bias),
        qdq_form=opdef.no_qdq is None, no_qdq_reason=opdef.no_qdq,
        problems=tuple(_problems(node, opdef, [*inputs, *([output] if output else [])],
                                 opsets)),
    )


def _default_out(opdef: ops.OpDef) -> str:
    return "int32" if opdef.kind == "integer" else "float"


def _dynamic_input(node: ir.Node, op: str) -> Operand:
    """The float input a dynamic operator quantizes at run time (uint8, per-tensor)."""
    x = graph.input_value(node, 0)
    return Operand(role="a" if op == "DynamicQuantizeMatMul" else "x", type=graph.elem_type(x),
                   scale_type="float", zero_point_type="uint8", granularity="per-tensor",
                   axis=None, shape=graph.shape_of(x), scale_shape=(), constant=False,
                   scale_constant=False, zero_point_constant=False, has_zero_point=True)


def _dynamic_output(node: ir.Node) -> Operand:
    y = node.outputs[0] if node.outputs else None
    return Operand(role="y", type="uint8", scale_type="float", zero_point_type="uint8",
                   granularity="per-tensor", axis=None, shape=graph.shape_of(y),
                   scale_shape=(), constant=False, scale_constant=False,
                   zero_point_constant=False, has_zero_point=True)

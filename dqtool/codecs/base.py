"""What a codec is, and the node-reading helpers every codec shares."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.spec import (
    P_ATTR,
    P_INPUTS,
    P_INT32_ZP,
    P_TYPE,
    P_ZP,
    P_ZP_VALUE,
    Problem,
)


@dataclass(frozen=True)
class Schema:
    """The facts of one encoding version that reading and converting need."""

    quant_types: frozenset[str]
    scale_types: frozenset[str]
    float_types: frozenset[str]  # DQ outputs / Q inputs
    attributes: frozenset[str]
    per_axis: bool
    blocked: bool
    output_dtype: frozenset[str] = field(default=frozenset())  # allowed values, if any


def attr_int(node: ir.Node, name: str, default: int | None) -> int | None:
    attr = node.attributes.get(name)
    if attr is None or attr.is_ref():
        return default
    return attr.as_int() if attr.type == ir.AttributeType.INT else default


def attr_string(node: ir.Node, name: str, default: str | None) -> str | None:
    attr = node.attributes.get(name)
    if attr is None or attr.is_ref() or attr.type != ir.AttributeType.STRING:
        return default
    return attr.as_string()


def unknown_attributes(node: ir.Node, allowed: frozenset[str], where: str) -> list[Problem]:
    return [
        Problem(P_ATTR, f"attribute '{name}' is not defined for {where}")
        for name in sorted(node.attributes)
        if name not in allowed
    ]


def input_count_problems(node: ir.Node, lo: int, hi: int, where: str) -> list[Problem]:
    present = [v for v in node.inputs]
    out: list[Problem] = []
    if not lo <= len(present) <= hi:
        out.append(Problem(P_INPUTS, f"{where} takes {lo} to {hi} inputs, got {len(present)}"))
    for i in range(min(lo, len(present))):
        if present[i] is None:
            out.append(Problem(P_INPUTS, f"{where}: required input {i} is missing"))
    return out


def type_problem(kind: str, name: str | None, allowed: frozenset[str], where: str) -> list[Problem]:
    if name is None or name in allowed:
        return []
    return [Problem(P_TYPE, f"{kind} type {name} is not allowed by {where} "
                    f"(allowed: {', '.join(sorted(allowed))})")]


def zero_point_problems(
    x_type: str | None, zp_value: ir.Value | None, where: str
) -> list[Problem]:
    """Type and value rules of an integer-slot zero point (ONNX and com.microsoft)."""
    if zp_value is None:
        return []
    out: list[Problem] = []
    zp_type = graph.elem_type(zp_value)
    if x_type and zp_type and zp_type != x_type:
        out.append(Problem(P_ZP, f"zero point type {zp_type} differs from x type {x_type}"))
    if zp_type in types.FLOAT_QUANT or zp_type == "int32":
        # Only these rules need the values; zero points are small (one per scale).
        zp = graph.constant_array(zp_value)
        nonzero = zp is not None and bool(np.any(zp.astype(np.float32) != 0))
        if nonzero and zp_type == "int32":
            out.append(Problem(P_INT32_ZP, "int32 zero point is non-zero: the spec says int32 "
                               "has none, but onnxruntime and the reference apply it",
                               "warning"))
        elif nonzero:
            out.append(Problem(P_ZP_VALUE, f"{zp_type} zero point must be zero ({where}); "
                               "runtimes reject a non-zero one"))
    return out


def input_facts(x: ir.Value | None, scale: ir.Value | None,
                zp: ir.Value | None) -> dict[str, object]:
    """The QuantSpec fields every integer-slot encoding reads the same way from its inputs."""
    return {
        "zero_point": "integer" if zp is not None else "none",
        "zero_point_type": graph.elem_type(zp),
        "x_shape": graph.shape_of(x),
        "scale_shape": graph.shape_of(scale),
        "x_constant": graph.constant_tensor(x) is not None,
        "scale_constant": graph.constant_tensor(scale) is not None,
        "zero_point_constant": zp is not None and graph.constant_tensor(zp) is not None,
    }


def output_dtype_attr(node: ir.Node) -> str | None:
    """The ONNX name of an ``output_dtype`` attribute, None when absent or 0."""
    code = attr_int(node, "output_dtype", 0) or 0
    if not code:
        return None
    t = types.from_onnx_int(code)
    return t.name if t else f"<{code}>"


def consumers(value: ir.Value | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return tuple(use.node.op_type for use in value.uses())


def x_from_constant_quantize(x: ir.Value | None) -> bool:
    """x is produced by a QuantizeLinear whose inputs are all constant (a weight Q→DQ)."""
    if x is None:
        return False
    producer = x.producer()
    if producer is None or producer.op_type != "QuantizeLinear":
        return False
    return all(v is None or graph.constant_tensor(v) is not None for v in producer.inputs)

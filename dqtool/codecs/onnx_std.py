"""ai.onnx DequantizeLinear and QuantizeLinear, every version, read from onnx's schemas.

Types and attributes come from ``onnx.defs`` so that a new onnx release is picked up;
granularity limits (per-axis from 13, blocked from 21) are facts the schemas state only
in prose.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import onnx
import onnx_ir as ir

from dqtool import graph, types
from dqtool.codecs import base
from dqtool.codecs.base import Schema
from dqtool.codecs.granularity import classify
from dqtool.schemas import since_versions as versions
from dqtool.spec import P_PRECISION, P_TYPE, Problem, QuantSpec

OPS = ("DequantizeLinear", "QuantizeLinear")
# The first version allowing each granularity: facts the schemas state only in prose.
GRANULARITY_SINCE = {"per-tensor": 10, "per-axis": 13, "blocked": 21}


def _types_of(constraint: onnx.defs.OpSchema.TypeConstraintParam) -> frozenset[str]:
    return frozenset(t[len("tensor("):-1] for t in constraint.allowed_type_strs)


@cache
def schema_facts(op: str, since_version: int) -> Schema:
    s = onnx.defs.get_schema(op, since_version, "")
    by_param = {c.type_param_str: _types_of(c) for c in s.type_constraints}
    # Map the schema's inputs to their type parameters (names differ across versions).
    x_param = s.inputs[0].type_str
    scale_param = s.inputs[1].type_str
    y_param = s.outputs[0].type_str

    def resolve(param: str) -> frozenset[str]:
        return by_param.get(param) or frozenset({param[len("tensor("):-1]})

    if op == "DequantizeLinear":
        quant, scale, flt = resolve(x_param), resolve(scale_param), resolve(y_param)
    else:
        quant, scale, flt = resolve(y_param), resolve(scale_param), resolve(x_param)
    out_dtype = frozenset()
    if "output_dtype" in s.attributes:
        out_dtype = flt if op == "DequantizeLinear" else quant
    return Schema(
        quant_types=quant,
        scale_types=scale,
        float_types=flt,
        attributes=frozenset(s.attributes),
        per_axis=since_version >= GRANULARITY_SINCE["per-axis"],
        blocked=since_version >= GRANULARITY_SINCE["blocked"],
        output_dtype=out_dtype,
    )


def since_at(op: str, opset: int) -> int | None:
    """The since-version of ai.onnx ``op`` in force at ``opset`` (None before it exists)."""
    return max((v for v in versions(op) if v <= opset), default=None)


def _exact_in(diff_bits: int, float_type: str | None) -> bool:
    mantissa = {"float": 24, "float16": 11, "bfloat16": 8}.get(float_type or "", 24)
    return diff_bits <= mantissa


def _precision_note(quant: str | None, scale: str | None, out: str | None) -> list[Problem]:
    """Where the 23+ text ("output type determines the precision") could differ from
    what runtimes compute (exact x - zp, one float32 multiply, one rounding)."""
    if quant is None or out is None or quant not in types.TYPES:
        return []
    t = types.TYPES[quant]
    diff_bits = t.bits + 1 if t.is_integer else 0
    if (scale and scale != out) or not _exact_in(diff_bits, out):
        return [Problem(P_PRECISION, f"the spec's wording (multiply in {out}) could round "
                        f"differently from runtimes ({quant} - zero point, float32 multiply, "
                        f"one rounding to {out}); dqtool computes as the runtimes do", "info")]
    return []


@dataclass(frozen=True)
class OnnxCodec:
    op: str
    since_version: int
    domain: str = "ai.onnx"

    @property
    def schema(self) -> Schema:
        return schema_facts(self.op, self.since_version)

    @property
    def where(self) -> str:
        return f"{self.op}-{self.since_version}"

    def read(self, node: ir.Node, version: int) -> QuantSpec:
        if self.op == "DequantizeLinear":
            return self._read_dq(node, version)
        return self._read_q(node, version)

    def _layout(self, node: ir.Node, x: ir.Value | None, scale, zp):
        sch = self.schema
        block = base.attr_int(node, "block_size", 0) if "block_size" in sch.attributes else 0
        # A stray axis at version 10 (onnxruntime's old quantizer writes one) is reported
        # as an unknown attribute, but it still says what the writer meant.
        axis = base.attr_int(node, "axis", 1)
        return classify(
            graph.shape_of(x), graph.shape_of(scale), graph.shape_of(zp),
            axis=axis, block_size=block or 0, allow_per_axis=sch.per_axis,
            allow_blocked=sch.blocked, where=self.where,
        )

    def _common(self, node: ir.Node) -> list[Problem]:
        return base.input_count_problems(node, 2, 3, self.where) + base.unknown_attributes(
            node, self.schema.attributes, self.where
        )

    def _read_dq(self, node: ir.Node, version: int) -> QuantSpec:
        sch = self.schema
        x, scale, zp = (graph.input_value(node, i) for i in range(3))
        x_type, s_type = graph.elem_type(x), graph.elem_type(scale)
        if x_type is None and zp is not None:
            # x computed by a node without value_info: the zero point has x's type.
            x_type = graph.elem_type(zp)
        problems = self._common(node)
        problems += base.type_problem("quantized", x_type, sch.quant_types, self.where)
        problems += base.type_problem("scale", s_type, sch.scale_types, self.where)
        problems += base.zero_point_problems(x_type, zp, self.where)
        out_attr = base.output_dtype_attr(node) if sch.output_dtype else None
        problems += base.type_problem("output_dtype", out_attr, sch.output_dtype, self.where)
        out_type = out_attr or (s_type if s_type in sch.float_types else None)
        if s_type == "float8e8m0" and out_attr is None:
            problems.append(Problem(P_TYPE, "a float8e8m0 scale is not an output type: the "
                                    "node needs output_dtype"))
        if not sch.output_dtype and s_type and s_type not in sch.float_types:
            out_type = None
        if sch.output_dtype:
            problems += _precision_note(x_type, s_type, out_type)
        layout = self._layout(node, x, scale, zp)
        return QuantSpec(
            op="DequantizeLinear", domain=self.domain, version=version,
            since_version=self.since_version, quant_type=x_type, scale_type=s_type,
            float_type=out_type, granularity=layout.granularity, axis=layout.axis,
            block_size=layout.block_size, **base.input_facts(x, scale, zp),
            x_from_quantize=base.x_from_constant_quantize(x),
            output_dtype_attr=out_attr, problems=tuple(problems + list(layout.problems)),
        )

    def _read_q(self, node: ir.Node, version: int) -> QuantSpec:
        sch = self.schema
        x, scale, zp = (graph.input_value(node, i) for i in range(3))
        x_type, s_type = graph.elem_type(x), graph.elem_type(scale)
        problems = self._common(node)
        out_attr = base.output_dtype_attr(node) if sch.output_dtype else None
        zp_type = graph.elem_type(zp)
        q_type = zp_type or out_attr or (None if zp is not None else "uint8")
        if zp_type and out_attr and zp_type != out_attr:
            problems.append(Problem(P_TYPE, f"output_dtype {out_attr} differs from the zero "
                                    f"point's type {zp_type}"))
        problems += base.type_problem("input", x_type, sch.float_types, self.where)
        problems += base.type_problem("scale", s_type, sch.scale_types, self.where)
        problems += base.type_problem("quantized", q_type, sch.quant_types, self.where)
        if "precision" not in sch.attributes and x_type and s_type and x_type != s_type \
                and self.since_version >= 19:
            problems.append(Problem(P_TYPE, f"scale type {s_type} must equal input type "
                                    f"{x_type} in {self.where}"))
        problems += base.zero_point_problems(q_type, zp, self.where)
        saturate = None
        if "saturate" in sch.attributes and q_type in types.FLOAT8:
            saturate = bool(base.attr_int(node, "saturate", 1))
        layout = self._layout(node, x, scale, zp)
        return QuantSpec(
            op="QuantizeLinear", domain=self.domain, version=version,
            since_version=self.since_version, quant_type=q_type, scale_type=s_type,
            float_type=x_type, granularity=layout.granularity, axis=layout.axis,
            block_size=layout.block_size, **base.input_facts(x, scale, zp),
            output_dtype_attr=out_attr, saturate=saturate,
            problems=tuple(problems + list(layout.problems)),
        )


def codecs() -> list[OnnxCodec]:
    return [OnnxCodec(op, v) for op in OPS for v in versions(op)]

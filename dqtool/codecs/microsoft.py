"""onnxruntime's com.microsoft DequantizeLinear / QuantizeLinear (contrib ops, version 1).

Types are those of onnxruntime's CPU kernels (wider than the published doc). The doc says a
missing axis means per-tensor, but the kernel defaults axis to 1; granularity comes from
the scale's shape (``docs/semantics.md#commicrosoft-dequantizelinear``).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from dqtool import graph
from dqtool.codecs import base
from dqtool.codecs.base import Schema
from dqtool.codecs.granularity import classify
from dqtool.spec import QuantSpec

DOMAIN = "com.microsoft"

SCHEMA = Schema(
    quant_types=frozenset({"int8", "uint8", "int16", "uint16", "int32", "int4", "uint4"}),
    scale_types=frozenset({"float", "float16"}),
    float_types=frozenset({"float", "float16"}),
    attributes=frozenset({"axis"}),
    per_axis=True,
    blocked=False,
)


@dataclass(frozen=True)
class MicrosoftCodec:
    op: str
    since_version: int = 1
    domain: str = DOMAIN

    @property
    def schema(self) -> Schema:
        return SCHEMA

    @property
    def where(self) -> str:
        return f"com.microsoft.{self.op}"

    def read(self, node: ir.Node, version: int) -> QuantSpec:
        x, scale, zp = (graph.input_value(node, i) for i in range(3))
        x_type, s_type, zp_type = (graph.elem_type(v) for v in (x, scale, zp))
        dq = self.op == "DequantizeLinear"
        q_type = x_type if dq else (zp_type or "uint8")
        f_type = s_type if dq else x_type
        problems = base.input_count_problems(node, 2, 3, self.where)
        problems += base.unknown_attributes(node, SCHEMA.attributes, self.where)
        problems += base.type_problem("quantized", q_type, SCHEMA.quant_types, self.where)
        problems += base.type_problem("scale", s_type, SCHEMA.scale_types, self.where)
        if not dq:
            problems += base.type_problem("input", x_type, SCHEMA.float_types, self.where)
        problems += base.zero_point_problems(q_type, zp, self.where)
        layout = classify(
            graph.shape_of(x), graph.shape_of(scale), graph.shape_of(zp),
            axis=base.attr_int(node, "axis", 1),
            block_size=0, allow_per_axis=True, allow_blocked=False, where=self.where,
        )
        return QuantSpec(
            op=self.op, domain=DOMAIN, version=version, since_version=1,
            quant_type=q_type, scale_type=s_type, float_type=f_type,
            granularity=layout.granularity, axis=layout.axis, block_size=None,
            **base.input_facts(x, scale, zp),
            x_from_quantize=dq and base.x_from_constant_quantize(x),
            problems=tuple(problems + list(layout.problems)),
        )


def codecs() -> list[MicrosoftCodec]:
    return [MicrosoftCodec("DequantizeLinear"), MicrosoftCodec("QuantizeLinear")]

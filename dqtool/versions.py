"""Which ai.onnx version of DequantizeLinear / QuantizeLinear can express a node's meaning."""

from __future__ import annotations

from dqtool.codecs import onnx_std
from dqtool.spec import QuantSpec


def why_not(spec: QuantSpec, since_version: int) -> list[str]:
    """The reasons ai.onnx ``spec.op`` at ``since_version`` cannot express ``spec``
    directly (an opmx float zero point is expressed with an Add after, so it is no reason)."""
    sch = onnx_std.schema_facts(spec.op, since_version)
    reasons = []
    where = f"{spec.op}-{since_version}"
    if spec.quant_type and spec.quant_type not in sch.quant_types:
        reasons.append(f"{spec.quant_type} is not a quantized type of {where}")
    if spec.scale_type and spec.scale_type not in sch.scale_types:
        reasons.append(f"a {spec.scale_type} scale is not allowed by {where}")
    if spec.float_type and spec.float_type not in sch.float_types:
        reasons.append(f"{spec.float_type} is not a float type of {where}")
    elif spec.is_dequantize and spec.float_type and spec.scale_type and \
            spec.float_type != spec.scale_type and not sch.output_dtype:
        reasons.append(f"output {spec.float_type} differs from the {spec.scale_type} scale, "
                       f"which needs output_dtype (23+)")
    if not spec.is_dequantize and spec.float_type and spec.scale_type and \
            spec.float_type != spec.scale_type and "precision" not in sch.attributes and \
            since_version >= 19:
        reasons.append(f"scale {spec.scale_type} differs from input {spec.float_type} (23+)")
    need = onnx_std.GRANULARITY_SINCE.get(spec.granularity or "per-tensor", 10)
    if since_version < need:
        reasons.append(f"{spec.granularity} needs {spec.op} {need}+")
    return reasons


def lowest_version(spec: QuantSpec) -> int | None:
    """The lowest ai.onnx opset whose ``spec.op`` expresses ``spec``; None if none does
    or the model does not say the node's types."""
    if spec.quant_type is None or spec.scale_type is None:
        return None
    for v in onnx_std.versions(spec.op):
        if not why_not(spec, v):
            return v
    return None

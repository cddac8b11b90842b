"""Which ai.onnx version of DequantizeLinear / QuantizeLinear can express a node's meaning."""

from __future__ import annotations

from dataclasses import dataclass

from dqtool.codecs import onnx_std
from dqtool.spec import QuantSpec

# What a version lacks, by the code lint reports it under (``--target onnx-opset-N``).
R_QUANT_TYPE = "DQ101"  # the quantized type
R_TYPE = "DQ102"  # the scale, input or output type (or an output type ≠ the scale's)
R_GRANULARITY = "DQ103"  # per-axis, blocked


@dataclass(frozen=True)
class Reason:
    """Why a version cannot express a node, with a stable code (one of ``R_*``)."""

    code: str
    message: str

    def __str__(self) -> str:
        return self.message


def reasons(spec: QuantSpec, since_version: int) -> list[Reason]:
    """Why ai.onnx ``spec.op`` at ``since_version`` cannot express ``spec`` directly (an
    opmx float zero point is expressed with an Add after, so it is no reason)."""
    sch = onnx_std.schema_facts(spec.op, since_version)
    out = []
    where = f"{spec.op}-{since_version}"
    if spec.quant_type and spec.quant_type not in sch.quant_types:
        out.append(Reason(R_QUANT_TYPE, f"{spec.quant_type} is not a quantized type of {where}"))
    if spec.scale_type and spec.scale_type not in sch.scale_types:
        out.append(Reason(R_TYPE, f"a {spec.scale_type} scale is not allowed by {where}"))
    if spec.float_type and spec.float_type not in sch.float_types:
        out.append(Reason(R_TYPE, f"{spec.float_type} is not a float type of {where}"))
    elif spec.is_dequantize and spec.float_type and spec.scale_type and \
            spec.float_type != spec.scale_type and not sch.output_dtype:
        out.append(Reason(R_TYPE, f"output {spec.float_type} differs from the "
                          f"{spec.scale_type} scale, which needs output_dtype (23+)"))
    if not spec.is_dequantize and spec.float_type and spec.scale_type and \
            spec.float_type != spec.scale_type and "precision" not in sch.attributes and \
            since_version >= 19:
        out.append(Reason(R_TYPE, f"scale {spec.scale_type} differs from input "
                          f"{spec.float_type} (23+)"))
    need = onnx_std.GRANULARITY_SINCE.get(spec.granularity or "per-tensor", 10)
    if since_version < need:
        out.append(Reason(R_GRANULARITY, f"{spec.granularity} needs {spec.op} {need}+"))
    return out


def why_not(spec: QuantSpec, since_version: int) -> list[str]:
    """The messages of ``reasons``."""
    return [r.message for r in reasons(spec, since_version)]


def lowest_version(spec: QuantSpec) -> int | None:
    """The lowest ai.onnx opset whose ``spec.op`` expresses ``spec``; None if none does
    or the model does not say the node's types."""
    if spec.quant_type is None or spec.scale_type is None:
        return None
    for v in onnx_std.versions(spec.op):
        if not reasons(spec, v):
            return v
    return None

"""``onednn-graph``: oneDNN Graph's Dequantize (u8/s8/f8 → f32, per-tensor or per-channel,
scales and zero points as attributes) and DynamicDequantize (u8/s8/s4/u4, scale tensors,
output = scale type, per-group on the last two dimensions with exact division)
(``docs/semantics.md#onednn-graph``)."""

from __future__ import annotations

from dqtool.linting.targets.base import (
    Candidate,
    Profile,
    fixed,
    or_fold,
    ragged,
    rank_of,
    to_ai_onnx_fix,
)
from dqtool.spec import QuantSpec

_STATIC_X = frozenset({"uint8", "int8", "float8e4m3fn", "float8e5m2"})
_DYNAMIC_X = frozenset({"uint8", "int8", "int4", "uint4"})
_DYNAMIC_SCALES = frozenset({"float", "float16", "bfloat16"})


def _type_fix(spec: QuantSpec) -> str | None:
    qt = spec.quant_type or ""
    if qt in ("int2", "uint2"):
        return or_fold(spec, "`dqtool downgrade --opset 24` (int2 → int8)")
    if qt == "float4e2m1":
        return or_fold(spec, "`dqtool downgrade --opset 22` (float4e2m1 → float8e4m3fn)")
    return or_fold(spec, None) or "none: no exact rewrite to a type oneDNN takes"


def _dequantize(spec: QuantSpec) -> Candidate:
    c = Candidate("Dequantize")
    if spec.quant_type and spec.quant_type not in _STATIC_X:
        c.add("DQ101", f"x type {spec.quant_type} (Dequantize takes u8, s8, f8_e4m3, f8_e5m2)",
              _type_fix(spec))
    if spec.scale_type not in (None, "float") or spec.float_type not in (None, "float"):
        c.add("DQ102", f"scale {spec.scale_type} → output {spec.float_type} (Dequantize: f32 "
              "scales and output)", or_fold(spec, "`dqtool downgrade --opset 18` (float32 "
                                           "scale, Cast of the output)"))
    if spec.granularity == "blocked":
        c.add("DQ103", "blocked (Dequantize is per-tensor or per-channel)",
              "`dqtool upgrade --opset 21 --per-axis`")
    if not spec.scale_constant or (spec.zero_point != "none" and not spec.zero_point_constant):
        c.add("DQ108", "scale or zero point computed at run time (Dequantize takes them as "
              "attributes)", None)
    return c


def _dynamic(spec: QuantSpec) -> Candidate:
    c = Candidate("DynamicDequantize")
    if spec.quant_type and spec.quant_type not in _DYNAMIC_X:
        c.add("DQ101", f"x type {spec.quant_type} (DynamicDequantize takes u8, s8, s4, u4)",
              _type_fix(spec))
    if spec.scale_type and spec.scale_type not in _DYNAMIC_SCALES:
        c.add("DQ102", f"a {spec.scale_type} scale (DynamicDequantize takes f32, f16, bf16)",
              or_fold(spec, "`dqtool downgrade --opset 23` (float32 scale)"))
    elif spec.float_type and spec.scale_type and spec.float_type != spec.scale_type:
        c.add("DQ102", f"output {spec.float_type} differs from the {spec.scale_type} scale "
              "(DynamicDequantize: output type = scale type)",
              or_fold(spec, "`dqtool downgrade --opset 22` (output_dtype → Cast)"))
    rank = rank_of(spec)
    if spec.granularity == "blocked" and rank is not None and spec.axis is not None:
        if spec.axis < rank - 2:
            c.add("DQ103", f"blocked on axis {spec.axis} of {rank} (per_group groups only the "
                  "last two dimensions)", "`dqtool upgrade --opset 21 --per-axis`")
        elif ragged(spec):
            c.add("DQ107", f"block_size {spec.block_size} does not divide "
                  f"{spec.x_shape[spec.axis]} on axis {spec.axis} (group sizes must divide "
                  "exactly)", "`dqtool upgrade --opset 21 --per-axis` (pads the ragged block)")
    return c


def candidates(spec: QuantSpec, opset: int) -> list[Candidate]:
    if spec.domain != "ai.onnx":
        c = Candidate("Dequantize")
        c.add("DQ106", f"oneDNN Graph maps ai.onnx DequantizeLinear, not {spec.domain}",
              to_ai_onnx_fix(spec, opset))
        return [c]
    return [_dequantize(spec), _dynamic(spec)]


PROFILE = Profile("onednn-graph", "oneDNN Graph (Dequantize, DynamicDequantize)", candidates)

TARGETS = [fixed(PROFILE, order=30)]

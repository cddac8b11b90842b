"""``openvino`` / ``openvino-2026.4``: OpenVINO 2026.4.1's CPU plugin, whose low-precision
transformations run a Conv, MatMul or Gemm in int8 when its QDQ unit fits them.

Every rule was measured here: the compiled model's runtime precision per layer (its first
input arriving as u8/i8), with inference precision pinned to f32, over the generated QDQ
family (``tests/helpers/deploy_models.py``) and models/ (docs/targets-openvino.md, measured
2026-11-28). Other operators are not judged: OpenVINO fuses them into subgraphs whose
precision does not say which node ran how.
"""

from __future__ import annotations

from dqtool.linting.targets.base import Issue, Target, ragged, to_ai_onnx_fix
from dqtool.linting.targets.deploy import DeployProfile, no_candidates
from dqtool.linting.targets.units import NodeUnit, Operand, weight_axes, zero_points

RELEASE = "2026.4"
SOURCE = "OpenVINO 2026.4.1 CPU plugin, measured 2026-11-28"
_JUDGED = frozenset({"Conv", "MatMul", "Gemm"})
# 4-bit activations ran in int8 too (measured): the quantization maps onto u8/i8.
_ACTIVATIONS = frozenset({"uint8", "int8", "uint4", "int4"})
_REQUANTIZE = "re-quantize it (no exact dqtool rewrite)"
# Quantized types the ONNX reader refuses ("Unsupported type", measured one node each).
_UNREADABLE = {
    "int2": "`dqtool downgrade --opset 24` (int2 → int8, exact)",
    "uint2": "`dqtool downgrade --opset 24` (uint2 → uint8, exact)",
    "float8e4m3fnuz": "re-quantize as int8 or float8e4m3fn (no exact dqtool rewrite)",
    "float8e5m2fnuz": "re-quantize as int8 or float8e5m2 (no exact dqtool rewrite)",
    "float6e2m3": "re-quantize as int8 (no exact dqtool rewrite)",
    "float6e3m2": "re-quantize as int8 (no exact dqtool rewrite)",
}


def _name(o: Operand) -> str:
    return "'" + (o.dq.node.name or "<unnamed>") + "'" if o.dq is not None else "(none)"


def _refusals(unit: NodeUnit, w: Operand | None) -> list[Issue]:
    """What makes OpenVINO refuse the whole model (read or compile), not fall back."""
    issues = []
    for o in unit.operands:
        s = o.spec
        if s is not None and s.quant_type in _UNREADABLE:
            issues.append(Issue("DQ138", f"{_name(o)} is {s.quant_type} (the ONNX reader: "
                                "\"Unsupported type\")", _UNREADABLE[s.quant_type]))
        elif s is not None and s.x_from_quantize and s.granularity == "blocked":
            issues.append(Issue("DQ139", f"{_name(o)} dequantizes a blocked QuantizeLinear of "
                                "a constant (the ONNX reader fails to convert the pair)",
                                "`dqtool fold` of the QuantizeLinear → DequantizeLinear pair "
                                "(float weight), or store the weight quantized"))
        elif s is not None and ragged(s):
            issues.append(Issue("DQ134", f"{_name(o)} has block_size {s.block_size}, which "
                                f"does not divide {s.x_shape[s.axis]} on axis {s.axis} (the "
                                "ONNX reader refuses a ragged last block)",
                                "`dqtool upgrade --opset 21 --per-axis` (pads the ragged "
                                "block; exact)"))
    s = None if w is None else w.spec
    if s is None or w is None:
        return issues
    out_axis, _ = weight_axes(unit)
    if unit.op_type in ("MatMul", "Gemm") and s.granularity == "blocked" and not issues \
            and s.axis == out_axis and s.x_shape and s.block_size:
        dim = s.x_shape[s.axis]
        if isinstance(dim, int) and -(-dim // s.block_size) > 1:
            issues.append(Issue("DQ135", f"weight {_name(w)} is blocked along the output "
                                f"axis in {-(-dim // s.block_size)} blocks (the CPU plugin's "
                                "FullyConnected compression fails to compile it)",
                                "per-channel weights instead of blocks; " + _REQUANTIZE))
    x = unit.operands[0]
    # Measured: 8-bit activations (16-bit ones run in float), a weight per-tensor or per
    # output channel (per input channel or blocked, the Conv compiles and runs in float).
    per_out = s.granularity == "per-tensor" or (s.granularity == "per-axis" and s.axis == 0)
    if unit.op_type == "Conv" and s.quant_type == "uint8" and w.dq is not None \
            and zero_points(w.dq) == {0.0} and x.dq is not None and per_out \
            and x.spec is not None and x.spec.quant_type in ("uint8", "int8"):
        zps = zero_points(x.dq)
        if zps is not None and zps != {0.0}:
            issues.append(Issue("DQ136", f"a uint8 weight {_name(w)} with zero point 0 and "
                                "a non-zero activation zero point (the CPU plugin finds no "
                                "convolution implementation)", "int8 weights (quantize_static "
                                "weight_type=QInt8); " + _REQUANTIZE))
    return issues


def _weight(unit: NodeUnit, w: Operand) -> list[Issue]:
    s = w.spec
    assert s is not None
    issues = []
    if s.quant_type != "int8":
        issues.append(Issue("DQ131", f"weight {_name(w)} is {s.quant_type} (int8 layers take "
                            "int8 weights)", "int8 weights (quantize_static "
                            "weight_type=QInt8); " + _REQUANTIZE))
    zps = None if w.dq is None else zero_points(w.dq)
    if zps is None or zps != {0.0}:
        issues.append(Issue("DQ132", f"weight {_name(w)} has a non-zero zero point (int8 "
                            "layers take symmetric weights)", "symmetric weights "
                            "(quantize_static extra_options WeightSymmetric=True); "
                            + _REQUANTIZE))
    out_axis, _ = weight_axes(unit)
    if unit.op_type == "Conv" and s.granularity == "per-axis" and s.axis != out_axis:
        issues.append(Issue("DQ133", f"weight {_name(w)} is per-axis on axis {s.axis}, not "
                            "the output channels (the layer runs in float)",
                            "per-output-channel weights (axis 0); " + _REQUANTIZE))
    if s.granularity == "blocked" and (unit.op_type == "Conv" or s.axis != out_axis):
        issues.append(Issue("DQ133", f"weight {_name(w)} is blocked (the layer runs in float, "
                            "or as a weight-compressed float layer)",
                            "per-channel int8 weights instead of blocks; " + _REQUANTIZE))
    return issues


def judge(unit: NodeUnit) -> list[Issue] | None:
    for o in unit.operands:
        s = o.spec
        if s is not None and s.domain not in ("ai.onnx", "com.microsoft"):
            return [Issue("DQ137", f"{_name(o)} is a {s.domain} DequantizeLinear (OpenVINO's "
                          "ONNX reader has no such operator)", to_ai_onnx_fix(s, 21))]
    w = unit.weight
    if unit.op_type not in _JUDGED or w is None or w.spec is None:
        return None
    refused = _refusals(unit, w)
    if refused:
        return refused
    issues = []
    x = unit.operands[0]
    if x.dq is None:
        issues.append(Issue("DQ130", "the activation input is float, not from a "
                            "DequantizeLinear (the layer runs in float with a dequantized "
                            "weight)", "quantize the activation too (a QuantizeLinear → "
                            "DequantizeLinear pair, as quantize_static writes)"))
    if unit.op_type == "Conv" and x.dq is not None and x.spec is not None \
            and x.spec.quant_type == "int8" and zero_points(x.dq) != {0.0}:
        issues.append(Issue("DQ130", "int8 activations with a non-zero zero point (an int8 "
                            "Convolution takes symmetric int8, or uint8, activations)",
                            "symmetric int8 activations (quantize_static extra_options "
                            "ActivationSymmetric=True) or uint8 activations; " + _REQUANTIZE))
    wide = [s.quant_type for s in unit.activation_specs()
            if s.quant_type and s.quant_type not in _ACTIVATIONS]
    if wide:
        issues.append(Issue("DQ130", f"an activation is {wide[0]} (int8 layers take 8-bit "
                            "activations)", "quantize activations to uint8 or int8; "
                            + _REQUANTIZE))
    return issues + _weight(unit, w)


def _profile(name: str) -> DeployProfile:
    return DeployProfile(name, f"OpenVINO {RELEASE} CPU plugin, low-precision "
                         "transformations (measured)", no_candidates, judge=judge,
                         where="in int8 on the OpenVINO CPU plugin",
                         fallback="runs it in float (not int8)",
                         refusals=frozenset({"DQ134", "DQ135", "DQ136", "DQ137", "DQ138", "DQ139"}))


PROFILE = _profile(f"openvino-{RELEASE}")
ALIAS = _profile("openvino")

TARGETS = [
    Target("openvino", f"OpenVINO's CPU plugin (= openvino-{RELEASE})",
           lambda value: ALIAS if value == "openvino" else None, order=62),
    Target(PROFILE.name, SOURCE, lambda value: PROFILE if value == PROFILE.name else None,
           order=63),
]

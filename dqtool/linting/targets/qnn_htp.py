"""``qnn-htp`` / ``qnn-htp-2.7``: Qualcomm's HTP (Hexagon NPU) through onnxruntime's QNN
execution provider, ``onnxruntime-qnn`` 2.7.0 (QNN SDK 2.40 backend interface).

Every rule was measured here: the EP's HTP backend (its x86-64 simulator) validating the
node units of the generated QDQ family (``tests/helpers/deploy_models.py``) and of models/,
with the reasons it logs quoted in the messages (docs/targets-qnn.md, measured
2026-11-28). A unit that fails runs on the CPU; one onnxruntime does not group (int8
activations with another weight type) runs as a float operator.
"""

from __future__ import annotations

from dqtool import registry
from dqtool.linting.targets.base import Issue, Target, to_ai_onnx_fix
from dqtool.linting.targets.deploy import DeployProfile, no_candidates
from dqtool.linting.targets.units import NodeUnit, Operand, weight_axes, zero_points

RELEASE = "2.7"
SOURCE = "onnxruntime-qnn 2.7.0, HTP backend, measured 2026-11-28"
# 4-bit activations ran too (measured); wider or float types have no HTP fixed-point form.
_ACTIVATIONS = frozenset({"uint8", "int8", "uint16", "int16", "uint4", "int4"})
_SIXTEEN = frozenset({"uint16", "int16"})
_FC = frozenset({"MatMul", "Gemm"})
# Inputs that must come from a DequantizeLinear for the unit to be quantized.
_ALL_INPUTS = frozenset({"Add", "Sub", "Mul", "Div", "Concat", "Max", "Min"})
_REQUANTIZE = "re-quantize it (no exact dqtool rewrite)"


def _dq_name(o: Operand) -> str:
    return "'" + (o.dq.node.name or "<unnamed>") + "'" if o.dq is not None else "(none)"


def _structure(unit: NodeUnit) -> list[Issue]:
    """A QDQ unit needs its activations dequantized and its outputs quantized."""
    node = unit.site.node
    need = range(len(node.inputs)) if unit.op_type in _ALL_INPUTS else range(1)
    issues = []
    for o in unit.operands:
        if o.index in need and o.dq is None and node.inputs[o.index] is not None:
            issues.append(Issue("DQ125", f"input {o.index} ('{node.inputs[o.index].name}') "
                                "is float, not from a DequantizeLinear (no QDQ node unit)",
                                "quantize that input too (a QuantizeLinear → DequantizeLinear "
                                "pair, as onnxruntime's quantize_static writes)"))
    for value, q in zip(node.outputs, unit.outputs, strict=True):
        if q is None:
            issues.append(Issue("DQ125", f"output '{value.name}' has no QuantizeLinear (no "
                                "QDQ node unit)", "quantize the output too (a QuantizeLinear "
                                "→ DequantizeLinear pair)"))
    return issues


def _types(unit: NodeUnit) -> list[Issue]:
    issues = []
    for spec in unit.activation_specs():
        # A float8 Conv unit passed (measured); MatMul, Gemm and Add did not.
        if spec.quant_type and spec.quant_type not in _ACTIVATIONS and unit.op_type != "Conv":
            issues.append(Issue("DQ120", f"an activation is {spec.quant_type} (onnxruntime-qnn: "
                                "\"Zero-point ONNX data type is not supported\"; HTP "
                                "activations are 4-, 8- or 16-bit integers)",
                                "quantize activations to uint8 or uint16; " + _REQUANTIZE))
            break
    w = unit.weight
    acts = {s.quant_type for s in unit.activation_specs()}
    if w is not None and w.spec is not None and "int8" in acts and w.spec.quant_type != "int8":
        issues.append(Issue("DQ121", f"int8 activations with a {w.spec.quant_type} weight "
                            f"{_dq_name(w)} (onnxruntime groups int8 activations only with "
                            "int8 weights; the node runs as a float operator)",
                            "quantize the weight to int8 (quantize_static weight_type=QInt8) "
                            "or the activations to uint8"))
    return issues


def _conv(unit: NodeUnit, w: Operand) -> list[Issue]:
    s = w.spec
    assert s is not None
    issues = []
    if s.granularity == "per-axis" and s.axis not in (None, 0):
        issues.append(Issue("DQ122", f"weight {_dq_name(w)} is per-axis on axis {s.axis} "
                            "(onnxruntime-qnn: \"Conv's input[1] must be use axis == 0 for "
                            "per-channel quantization\")", "quantize the weight per output "
                            "channel (axis 0); " + _REQUANTIZE))
    if s.granularity == "blocked":
        bits = 16 if s.quant_type in _SIXTEEN else 4 if s.quant_type in ("int4", "uint4") else 8
        need = {8: 4, 4: 8}.get(bits)
        if need is None:
            issues.append(Issue("DQ124", f"weight {_dq_name(w)} is blocked {s.quant_type} (the "
                                "HTP block-quantized Conv takes 4- and 8-bit weights)",
                                "8-bit or 4-bit weight blocks; " + _REQUANTIZE))
        elif s.axis == 1 and s.block_size and s.block_size % need:
            issues.append(Issue("DQ124", f"weight {_dq_name(w)} has block_size "
                                f"{s.block_size} on the input channels (HTP needs a multiple "
                                f"of {need} for {bits}-bit weights)",
                                f"a block size that is a multiple of {need}; " + _REQUANTIZE))
    return issues


def _fc(unit: NodeUnit, w: Operand) -> list[Issue]:
    s = w.spec
    assert s is not None
    qt = s.quant_type or ""
    issues = []
    if qt in _SIXTEEN:
        return [Issue("DQ123", f"weight {_dq_name(w)} is {qt} (the HTP FullyConnected took no "
                      "16-bit weight in any measured form)", "8-bit weights; " + _REQUANTIZE)]
    if s.granularity == "per-axis" and w.dq is not None:
        zps = zero_points(w.dq)
        symmetric = {128.0} if qt == "uint8" else {0.0}
        if s.zero_point == "none" and qt.startswith("u"):
            issues.append(Issue("DQ123", f"per-axis {qt} weight {_dq_name(w)} has no zero "
                                "point (measured: unsigned per-channel weights ran only with "
                                "an explicit one)", "an explicit zero point (0 for uint4, 128 "
                                "for uint8), or int8 weights; " + _REQUANTIZE))
        elif zps is None or not zps <= symmetric:
            shown = "computed at run time" if zps is None else \
                ", ".join(str(int(z)) for z in sorted(zps)[:3])
            issues.append(Issue("DQ123", f"per-axis weight {_dq_name(w)} has zero point "
                                f"{shown} (per-channel weights must be symmetric: 0, or 128 "
                                "for uint8)", "symmetric per-channel weights "
                                "(quantize_static extra_options WeightSymmetric=True); "
                                + _REQUANTIZE))
    if qt.startswith("u") and any(x.quant_type == "int16" for x in unit.activation_specs()):
        issues.append(Issue("DQ123", f"int16 activations with an unsigned ({qt}) weight "
                            f"{_dq_name(w)}", "signed weights (int8) with int16 activations; "
                            + _REQUANTIZE))
    _, k_axis = weight_axes(unit)
    if s.granularity == "blocked" and s.axis == k_axis:
        issues.append(Issue("DQ124", f"weight {_dq_name(w)} is blocked along the reduction "
                            "axis (the EP asks for int16 activations, and with them failed to "
                            "add the block-quantized node in every measured form)",
                            "per-channel weights instead of blocks; " + _REQUANTIZE))
    return issues


def judge(unit: NodeUnit) -> list[Issue]:
    for o in unit.operands:
        s = o.spec
        if s is not None and s.domain not in ("ai.onnx", "com.microsoft"):
            why = registry.lint_fact(s.domain, "onnxruntime") or \
                f"onnxruntime has no {s.domain} operators"
            return [Issue("DQ126", f"{_dq_name(o)} is a {s.domain} DequantizeLinear ({why})",
                          to_ai_onnx_fix(s, 21))]
    issues = _structure(unit) + _types(unit)
    w = unit.weight
    if w is None or w.spec is None:
        return issues
    if unit.op_type == "Conv":
        issues += _conv(unit, w)
    elif unit.op_type in _FC:
        issues += _fc(unit, w)
    return issues


PROFILE = DeployProfile(f"qnn-htp-{RELEASE}", f"Qualcomm HTP, onnxruntime-qnn {RELEASE} QNN "
                        "execution provider (measured)", no_candidates, judge=judge,
                        where="on HTP", fallback="falls back (not quantized)")
ALIAS = DeployProfile("qnn-htp", PROFILE.description, no_candidates, judge=judge,
                      where="on HTP", fallback=PROFILE.fallback)

TARGETS = [
    Target("qnn-htp", f"Qualcomm HTP through onnxruntime's QNN EP (= qnn-htp-{RELEASE})",
           lambda value: ALIAS if value == "qnn-htp" else None, order=60),
    Target(PROFILE.name, f"Qualcomm HTP, {SOURCE}",
           lambda value: PROFILE if value == PROFILE.name else None, order=61),
]

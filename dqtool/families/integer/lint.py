"""DQ110: an integer operator the lint target cannot run, with the fix.

What each target runs (``docs/integer-ops.md`` lists the sources):

* ``onnx-opset-N``: QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger from opset 10,
  DynamicQuantizeLinear from 11; no com.microsoft operator at all;
* ``onnxruntime``: every operator of the family (CPU kernels, ai.onnx and com.microsoft)
  except those its release has no CPU kernel for (``ort_facts.NO_CPU_KERNEL``: MulInteger
  on 1.31 and 1.32) and the type combinations its kernels do not take
  (``ort_types``: e.g. QLinearMatMul of an int8 A with a uint8 B);
* ``directml-flX.Y`` (DirectML's operator set by feature level, ``_DML``):
  DML_OPERATOR_QUANTIZED_LINEAR_CONVOLUTION / _MATRIX_MULTIPLY, CONVOLUTION_INTEGER and
  MATRIX_MULTIPLY_INTEGER from FL2.1; DYNAMIC_QUANTIZE_LINEAR and
  ELEMENT_WISE_QUANTIZED_LINEAR_ADD from FL4.0; MATRIX_MULTIPLY_INTEGER_TO_FLOAT and
  QUANTIZED_LINEAR_AVERAGE_POOLING from FL6.2; the other com.microsoft operators have no
  DirectML operator;
* ``onednn-graph``: no integer operator; oneDNN Graph takes int8 as Dequantize → op →
  Quantize patterns (its DynamicQuantize takes scales, it does not compute them).

The fix is ``dqtool qdq`` (the QDQ form every target runs as float operators or fuses
back), or the reason the operator has no QDQ form.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dqtool import graph
from dqtool.families.integer import describe, ops, ort_facts, ort_types
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import define
from dqtool.runtimes import onnxruntime as ort_runtime

CODE = "DQ110"
define(CODE, "target-integer-operator", "error",
       "the target has no kernel for this integer operator (QLinear*, MatMulInteger, "
       "dynamic quantization)",
       "node 'fc_quant' (com.microsoft QGemm-1): onnx-opset-21 cannot run it: com.microsoft "
       "operators are not in ai.onnx; fix: `dqtool qdq` (DequantizeLinear → Gemm → "
       "QuantizeLinear)")

_ONNX_SINCE = {"QLinearConv": 10, "QLinearMatMul": 10, "MatMulInteger": 10,
               "ConvInteger": 10, "DynamicQuantizeLinear": 11}


@dataclass(frozen=True)
class DmlFact:
    """The DirectML operator that runs an integer operator, the first feature level that
    has it, and where that is stated (``docs/integer-ops.md`` lists them)."""

    operator: str
    since: tuple[int, int]

    @property
    def source(self) -> str:
        """The guard the operator's entry sits under in DirectML.h."""
        major, minor = self.since
        return f"DirectML.h: DML_TARGET_VERSION >= 0x{major:x}{minor:x}00"


# Each operator's DML_OPERATOR_TYPE entry sits under a DML_TARGET_VERSION guard in
# DirectML.h (0x2100 = feature level 2.1); DirectML's feature-level history and each
# operator's page ("introduced in DML_FEATURE_LEVEL_x_y") say the same.
_DML = {
    "QLinearConv": DmlFact("QUANTIZED_LINEAR_CONVOLUTION", (2, 1)),
    "QLinearMatMul": DmlFact("QUANTIZED_LINEAR_MATRIX_MULTIPLY", (2, 1)),
    "MatMulInteger": DmlFact("MATRIX_MULTIPLY_INTEGER", (2, 1)),
    "ConvInteger": DmlFact("CONVOLUTION_INTEGER", (2, 1)),
    "DynamicQuantizeLinear": DmlFact("DYNAMIC_QUANTIZE_LINEAR", (4, 0)),
    "QLinearAdd": DmlFact("ELEMENT_WISE_QUANTIZED_LINEAR_ADD", (4, 0)),
    "MatMulIntegerToFloat": DmlFact("MATRIX_MULTIPLY_INTEGER_TO_FLOAT", (6, 2)),
    "QLinearAveragePool": DmlFact("QUANTIZED_LINEAR_AVERAGE_POOLING", (6, 2)),
    "QLinearGlobalAveragePool": DmlFact("QUANTIZED_LINEAR_AVERAGE_POOLING", (6, 2)),
}


def dml_fact(op: str) -> DmlFact | None:
    return _DML.get(op)


def why_not(op: str, domain: str, target: str,
            signature: tuple[str | None, ...] = ()) -> str | None:
    """Why ``target`` cannot run the operator (with inputs and output of the types in
    ``signature``, see ``ort_types``), or None when it can."""
    if target == "onnxruntime" or target.startswith("onnxruntime-"):
        return _ort_why_not(op, domain, target, signature)
    if target.startswith("onnx-opset-"):
        n = int(target.rsplit("-", 1)[1])
        if domain != "ai.onnx":
            return f"{domain} operators are not in ai.onnx"
        since = _ONNX_SINCE.get(op)
        return None if since is None or n >= since else f"{op} is in ai.onnx from opset {since}"
    if target.startswith("directml-fl"):
        level = tuple(int(p) for p in target[len("directml-fl"):].split("."))
        if op not in _DML:
            return f"DirectML has no operator for {domain} {op}"
        fact = _DML[op]
        if level < fact.since:
            return (f"DML_OPERATOR_{fact.operator} is in DirectML from feature level "
                    f"{fact.since[0]}.{fact.since[1]}, not {level[0]}.{level[1]}")
        return None
    if target == "onednn-graph":
        return ("oneDNN Graph has no integer operators; it takes int8 as Dequantize → op → "
                "Quantize")
    return None


def _ort_why_not(op: str, domain: str, target: str,
                 signature: tuple[str | None, ...]) -> str | None:
    """An operator with a schema but no CPU kernel in the target's release, or none for
    its types (measured, ``ort_facts`` and ``ort_types``); ``onnxruntime`` is the installed
    release (probed where the table does not hold it). Another release not measured is
    assumed to run the family."""
    release = ort_runtime.target_release(target)
    if release is not None and ort_facts.has_cpu_kernel(op, release) is False:
        return f"onnxruntime {release} has no CPU kernel for com.microsoft {op} (measured)"
    if not signature or None in signature:
        return None
    sig = tuple(t for t in signature if t is not None)
    takes = ort_types.takes((domain, op), sig, release)
    if takes is None and target == "onnxruntime" and release is not None:
        probed = ort_types.probe().get((domain, op))  # the installed one, not in the table
        takes = None if probed is None else sig in probed
    if takes is False:
        return (f"onnxruntime {release} has no CPU kernel for {domain} {op} of these types "
                f"({_types_text(domain, op, sig)}; measured)")
    return None


def _types_text(domain: str, op: str, signature: tuple[str, ...]) -> str:
    opdef = ops.lookup(domain, op)
    assert opdef is not None
    roles = [s.role for s in opdef.inputs] + ["output"]
    return ", ".join(f"{r} {t}" for r, t in zip(roles, signature, strict=False))


def signature(node, opdef: ops.OpDef) -> tuple[str | None, ...]:
    """The node's quantized inputs' element types in slot order, then its output's
    ("int32", "float" or the quantized type), as ``ort_types`` keys them; None where a
    type is not known."""
    types = [graph.elem_type(graph.input_value(node, s.value)) for s in opdef.inputs
             if s.value is not None]
    if opdef.output is not None and graph.input_value(node, opdef.output.scale) is not None:
        out = graph.elem_type(graph.input_value(node, opdef.output.zero_point)) \
            if opdef.output.zero_point is not None and \
            graph.input_value(node, opdef.output.zero_point) is not None \
            else graph.elem_type(node.outputs[0])
    else:
        out = "int32" if opdef.kind == "integer" else "float"
    return (*types, out)


def fix_for(opdef: ops.OpDef, target: str = "") -> str:
    if opdef.op == "DynamicQuantizeLinear":
        return ("none in dqtool: a target without it has no run-time quantization (fold the "
                "model's weights, or quantize statically)")
    if opdef.no_qdq:
        return f"none: no QDQ form ({opdef.no_qdq})"
    float_op = f"{opdef.float_domain} {opdef.float_op}" if opdef.float_domain else \
        opdef.float_op
    if opdef.float_domain and target:  # no target that lacks the op runs its float twin
        return (f"none for {target}: the QDQ form (`dqtool qdq`) still needs {float_op}, "
                "which it lacks too")
    if opdef.output is not None:
        return f"`dqtool qdq` (DequantizeLinear → {float_op} → QuantizeLinear)"
    return f"`dqtool qdq` (DequantizeLinear → {float_op})"


def target_findings(ctx: ModelContext, target: str) -> Iterator[Finding]:
    for site in ctx.sites:
        node = site.node
        opdef = ops.lookup(graph.domain_name(node.domain), node.op_type)
        if opdef is None:
            continue
        reason = why_not(opdef.op, opdef.domain, target,
                         signature(node, opdef) if opdef.key in ort_types.TYPED_OPS else ())
        if reason is None:
            continue
        spec = describe.read(node, site.opsets)
        version = spec.version if spec is not None else opdef.since_version
        where = node.name or f"<unnamed {node.op_type}>"
        subject = f"node '{where}' ({opdef.domain} {opdef.op}-{version})"
        if site.graph != "main":
            subject += f" in {site.graph}"
        fix = fix_for(opdef, target)
        message = f"{ctx.path}: {subject}: {target} cannot run it: {reason}; fix: {fix}"
        yield Finding(CODE, "error", " ".join(message.split()), ctx.path, where, site.graph,
                      f"{opdef.domain}:{opdef.op}:{version}", target, fix)

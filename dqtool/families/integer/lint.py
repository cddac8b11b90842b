"""DQ110: an integer operator the lint target cannot run, with the fix.

What each target runs (``docs/integer-ops.md`` lists the sources):

* ``onnx-opset-N``: QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger from opset 10,
  DynamicQuantizeLinear from 11; no com.microsoft operator at all;
* ``onnxruntime``: every operator of the family (CPU kernels, ai.onnx and com.microsoft);
* ``directml-flX.Y`` (DirectML's operator set by feature level):
  DML_OPERATOR_QUANTIZED_LINEAR_CONVOLUTION / _MATRIX_MULTIPLY, CONVOLUTION_INTEGER and
  MATRIX_MULTIPLY_INTEGER not at FL1.0; DYNAMIC_QUANTIZE_LINEAR from FL4.0;
  MATRIX_MULTIPLY_INTEGER_TO_FLOAT and QUANTIZED_LINEAR_AVERAGE_POOLING from FL6.2; the
  other com.microsoft operators have no DirectML operator;
* ``onednn-graph``: no integer operator; oneDNN Graph takes int8 as Dequantize → op →
  Quantize patterns (its DynamicQuantize takes scales, it does not compute them).

The fix is ``dqtool qdq`` (the QDQ form every target runs as float operators or fuses
back), or the reason the operator has no QDQ form.
"""

from __future__ import annotations

from collections.abc import Iterator

from dqtool import graph
from dqtool.families.integer import describe, ops
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import define

CODE = "DQ110"
define(CODE, "target-integer-operator", "error",
       "the target has no kernel for this integer operator (QLinear*, MatMulInteger, "
       "dynamic quantization)",
       "node 'fc_quant' (com.microsoft QGemm-1): onnx-opset-21 cannot run it: com.microsoft "
       "operators are not in ai.onnx; fix: `dqtool qdq` (DequantizeLinear → Gemm → "
       "QuantizeLinear)")

_ONNX_SINCE = {"QLinearConv": 10, "QLinearMatMul": 10, "MatMulInteger": 10,
               "ConvInteger": 10, "DynamicQuantizeLinear": 11}
# DirectML's operator for each, and the feature level that has it (the profile's levels:
# the integer operators are absent at FL1.0 and present from FL2.1 on).
_DML = {"QLinearConv": ("QUANTIZED_LINEAR_CONVOLUTION", (2, 1)),
        "QLinearMatMul": ("QUANTIZED_LINEAR_MATRIX_MULTIPLY", (2, 1)),
        "MatMulInteger": ("MATRIX_MULTIPLY_INTEGER", (2, 1)),
        "ConvInteger": ("CONVOLUTION_INTEGER", (2, 1)),
        "DynamicQuantizeLinear": ("DYNAMIC_QUANTIZE_LINEAR", (4, 0)),
        "MatMulIntegerToFloat": ("MATRIX_MULTIPLY_INTEGER_TO_FLOAT", (6, 2)),
        "QLinearAveragePool": ("QUANTIZED_LINEAR_AVERAGE_POOLING", (6, 2)),
        "QLinearGlobalAveragePool": ("QUANTIZED_LINEAR_AVERAGE_POOLING", (6, 2))}


def why_not(op: str, domain: str, target: str) -> str | None:
    """Why ``target`` cannot run the operator, or None when it can."""
    if target == "onnxruntime" or target.startswith("onnxruntime-"):
        return None
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
        name, since = _DML[op]
        if level < since:
            return f"DML_OPERATOR_{name} is not in feature level {level[0]}.{level[1]}"
        return None
    if target == "onednn-graph":
        return ("oneDNN Graph has no integer operators; it takes int8 as Dequantize → op → "
                "Quantize")
    return None


def fix_for(opdef: ops.OpDef) -> str:
    if opdef.op == "DynamicQuantizeLinear":
        return ("none in dqtool: a target without it has no run-time quantization (fold the "
                "model's weights, or quantize statically)")
    if opdef.no_qdq:
        return f"none: no QDQ form ({opdef.no_qdq})"
    return f"`dqtool qdq` (DequantizeLinear → {opdef.float_op} → QuantizeLinear)" \
        if opdef.kind == "qlinear" else f"`dqtool qdq` (DequantizeLinear → {opdef.float_op})"


def target_findings(ctx: ModelContext, target: str) -> Iterator[Finding]:
    for site in ctx.sites:
        node = site.node
        opdef = ops.lookup(graph.domain_name(node.domain), node.op_type)
        if opdef is None:
            continue
        reason = why_not(opdef.op, opdef.domain, target)
        if reason is None:
            continue
        spec = describe.read(node, site.opsets)
        version = spec.version if spec is not None else opdef.since_version
        where = node.name or f"<unnamed {node.op_type}>"
        subject = f"node '{where}' ({opdef.domain} {opdef.op}-{version})"
        if site.graph != "main":
            subject += f" in {site.graph}"
        fix = fix_for(opdef)
        message = f"{ctx.path}: {subject}: {target} cannot run it: {reason}; fix: {fix}"
        yield Finding(CODE, "error", " ".join(message.split()), ctx.path, where, site.graph,
                      f"{opdef.domain}:{opdef.op}:{version}", target, fix)

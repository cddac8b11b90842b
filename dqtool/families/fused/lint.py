"""Lint facts of the fused family: which targets run com.microsoft MatMulNBits /
GatherBlockQuantized (only onnxruntime), and the command that makes a model portable."""

from __future__ import annotations

from collections.abc import Iterator

from dqtool.families.fused import ort_facts, read
from dqtool.families.fused.to_onnx import needed_opset
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import define

RULE = "DQ109"

define(RULE, "target-fused-op", "error",
       "the target cannot run a com.microsoft MatMulNBits / GatherBlockQuantized "
       "(dequantization inside an onnxruntime contrib op)",
       "node 'mm': directml-fl6.2 cannot run it: com.microsoft MatMulNBits (weight uint4 "
       "dequantized inside the operator) is an onnxruntime contrib op; fix: `dqtool upgrade "
       "--opset 21` (ai.onnx DequantizeLinear + MatMul, exact), or `dqtool fold`")


def target_findings(ctx: ModelContext, target: str) -> Iterator[Finding]:
    """DQ109 for every fused node a target cannot run (every target but onnxruntime, which
    runs them unless its CPU kernel rejects the combination)."""
    opset = ctx.onnx_opset or 0
    for site in ctx.sites:
        node = site.node
        if not read.is_fused(node):
            continue
        spec = read.read(node, site.opsets)
        name = node.name or f"<unnamed {node.op_type}>"
        if target.startswith("onnxruntime"):
            rejected = [p for p in spec.problems if p.code == "FU007"]
            if rejected:
                yield ctx.finding(RULE, "error", f"onnxruntime cannot run it: "
                                  f"{rejected[0].message}", target=target, node=name,
                                  where=site.graph, fix=_fix(spec, opset))
            continue
        yield ctx.finding(
            RULE, "error", f"{target} cannot run it: com.microsoft {node.op_type} (weight "
            f"{spec.quant_type} dequantized inside the operator) is an onnxruntime contrib "
            "op", target=target, node=name, where=site.graph, fix=_fix(spec, opset))


def _fix(spec, opset: int) -> str | None:
    from dqtool.families.fused.to_onnx import Refusal, check

    ways = []
    need = max(needed_opset(spec), opset)
    try:
        check(spec, need)
        ways.append(f"`dqtool upgrade --opset {need}` (ai.onnx DequantizeLinear + "
                    f"{'MatMul' if spec.op == 'MatMulNBits' else 'Gather'}, exact)")
    except Refusal:
        pass
    if spec.constant and ort_facts.g_idx_refusal(spec.g_idx, spec.zero_point) is None:
        ways.append("`dqtool fold` (float weights)")
    return ", or ".join(ways) or None

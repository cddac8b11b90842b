"""DQ113: a dequantization written by hand (``Cast → [Sub] → Mul``) that an exact
DequantizeLinear could replace, for targets whose runtimes fuse DequantizeLinear with the
operator after it and do not fuse ``Cast`` + ``Mul`` (``docs/handwritten.md``).

Information, never a failure. A target rule (DQ1xx: only with ``--target``): it is
reported by ``target_findings(ctx, target)``, the hook ``dqtool.linting.targets.run``
calls for each module that has one.
"""

from __future__ import annotations

from collections.abc import Iterator

from dqtool.handwritten import find
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import define

RULE = "DQ113"

define(RULE, "handwritten-dequantization", "info",
       "a dequantization written by hand (Cast → Sub → Mul) that an exact DequantizeLinear "
       "could replace, for a target that fuses DequantizeLinear and not Cast + Mul",
       "node 'Mul_12': Cast → Mul dequantizes 'w' (int8 per-axis) by hand; onnxruntime "
       "fuses DequantizeLinear with the MatMul after it, not Cast + Mul; fix: rewrite it "
       "into DequantizeLinear-13+ int8 per-axis axis 1 (exact: dqtool.handwritten.rewrite)")

# Targets whose runtime fuses DequantizeLinear with its consumer (and not Cast + Mul):
# onnxruntime's QDQ fusions (DequantizeLinear → MatMul/Conv/Gather), the QNN EP's QDQ node
# units, oneDNN Graph's dequantize + matmul/convolution patterns. Not OpenVINO: its own
# weight decompression is Convert → Subtract → Multiply, the hand-written form itself.
FUSING = ("onnxruntime", "qnn-htp", "onednn-graph")


def fuses(target: str) -> bool:
    return any(target == t or target.startswith(f"{t}-") for t in FUSING)


def target_findings(ctx: ModelContext, target: str) -> Iterator[Finding]:
    """DQ113 for each hand-written dequantization with an exact DequantizeLinear form
    (those without one have nothing to point to: ``dqtool.handwritten.find`` says why)."""
    if not fuses(target):
        return

    opset = ctx.onnx_opset or 0
    for r in find(ctx.model):
        if not (r.rewritable and r.exact and r.min_opset is not None):
            continue
        consumers = "/".join(r.consumers) or "graph output"
        at = f" at opset {r.min_opset}" if r.min_opset > opset else ""
        text = (f"{' → '.join(r.ops)} dequantizes '{r.output}' ({r.codes_type} "
                f"{r.granularity}) by hand; {target} fuses DequantizeLinear with the "
                f"{consumers} after it, not Cast + Mul")
        yield ctx.finding(RULE, "info", text, target=target, node=r.nodes[-1], where=r.graph,
                          op="ai.onnx:Mul",
                          fix=f"rewrite it into {r.form}{at}, exactly: dqtool upgrade --opset "
                          f"{max(opset, r.min_opset)} --handwritten")

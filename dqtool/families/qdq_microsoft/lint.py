"""The com.microsoft family's lint rule: DQ031, information, never a failure."""

from __future__ import annotations

from collections.abc import Iterator

from dqtool import versions
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import check, define

define("DQ031", "contrib-expressible", "info",
       "a com.microsoft DequantizeLinear that ai.onnx DequantizeLinear can express",
       "node 'W_DequantizeLinear' (com.microsoft DequantizeLinear-1): expressible as ai.onnx "
       "DequantizeLinear-21; `dqtool upgrade --opset 21` converts it")


@check("DQ031")
def expressible_in_ai_onnx(ctx: ModelContext) -> Iterator[Finding]:
    opset = ctx.onnx_opset or 0
    for q in ctx.dequantize:
        if q.spec.domain == "com.microsoft":
            lowest = versions.lowest_version(q.spec)
            if lowest is not None:
                n = max(lowest, opset)
                yield ctx.finding("DQ031", "info", f"expressible as ai.onnx DequantizeLinear-"
                                  f"{lowest}; `dqtool upgrade --opset {n}` converts it", q)

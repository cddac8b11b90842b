"""DQ030: information, never a failure — what dqtool could simplify. (DQ031, a
com.microsoft node ai.onnx can express, is the com.microsoft family's own rule.)"""

from __future__ import annotations

from collections.abc import Iterator

from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import check, define

define("DQ030", "foldable", "info",
       "a DequantizeLinear whose inputs are all constant: it could be folded",
       "node 'W_DequantizeLinear' (ai.onnx DequantizeLinear-13): all inputs are constant; "
       "`dqtool fold` would store its float output instead")


@check("DQ030")
def simplifications(ctx: ModelContext) -> Iterator[Finding]:
    for q in ctx.dequantize:
        if q.spec.constant and q.spec.valid:
            yield ctx.finding("DQ030", "info", "all inputs are constant; `dqtool fold` would "
                              f"store its {q.spec.float_type or 'float'} output instead", q)

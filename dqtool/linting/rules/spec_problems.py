"""DQ010–DQ019: the rules the codecs already check while reading a node, as lint findings.

The codes are ``QuantSpec`` problem codes (``dqtool.spec``), so ``inspect --json`` and
lint agree. Two kinds of codec problem are reported by a more specific rule instead:
zero-point *values* (DQ002) and a domain without an opset import (DQ020).
"""

from __future__ import annotations

from collections.abc import Iterator

from dqtool import spec as S
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import check, define

define(S.P_TYPE, "type-not-allowed", "error",
       "a quantized, scale or output type the op does not allow at the opset in force",
       "node 'W_DequantizeLinear' (ai.onnx DequantizeLinear-17): quantized type uint4 is not "
       "allowed by DequantizeLinear-13")
define(S.P_ATTR, "attribute-not-allowed", "error",
       "an attribute the op does not define at the opset in force",
       "node 'W_DequantizeLinear' (ai.onnx DequantizeLinear-11): attribute 'axis' is not "
       "defined for DequantizeLinear-10")
define(S.P_SHAPE, "scale-shape", "error",
       "scale / zero-point shape fits no granularity, or granularity not allowed at the opset",
       "scale shape (4) is per-axis, which DequantizeLinear-10 does not allow")
define(S.P_AXIS, "axis-range", "error", "axis outside [-r, r-1]",
       "axis 2 is out of range [-2, 1] for x of rank 2")
define(S.P_BLOCK, "block-size", "error",
       "block_size missing, not positive, or not fitting the scale's shape",
       "block_size 4 does not fit: x has 10 on axis 0 and the scale 2 blocks, so block_size "
       "must be in [5, 9]")
define(S.P_ZP, "zero-point", "error",
       "zero-point type, shape or presence rules (values: DQ002)",
       "zero point type uint8 differs from x type int8")
define(S.P_INT32_ZP, "int32-zero-point", "warning",
       "int32 with a non-zero zero point: the spec says none, runtimes apply it",
       "int32 zero point is non-zero: the spec says int32 has none, but onnxruntime and the "
       "reference apply it")
define(S.P_VERSION, "op-version", "error",
       "the op does not exist at the version in force",
       "ai.onnx DequantizeLinear does not exist at opset 9")
define(S.P_INPUTS, "inputs", "error", "wrong number of inputs, or a required one missing",
       "DequantizeLinear-21 takes 2 to 3 inputs, got 1")
define(S.P_PRECISION, "precision-wording", "info",
       "the spec's wording (multiply in the output type) could round differently from what "
       "runtimes compute; dqtool computes as the runtimes do",
       "the spec's wording (multiply in float16) could round differently from runtimes")

_CODES = (S.P_TYPE, S.P_ATTR, S.P_SHAPE, S.P_AXIS, S.P_BLOCK, S.P_ZP, S.P_INT32_ZP,
          S.P_VERSION, S.P_INPUTS, S.P_PRECISION)


def _owned_elsewhere(p: S.Problem) -> bool:
    # DQ002 checks zero-point values for every type, DQ020 every node's domain import.
    return p.code in (S.P_ZP_VALUE, S.P_NO_IMPORT)


@check(*_CODES)
def codec_problems(ctx: ModelContext) -> Iterator[Finding]:
    for q in ctx.quant:
        for p in q.spec.problems:
            if not _owned_elsewhere(p):
                yield ctx.finding(p.code, p.severity, p.message, q)

"""DQ021: a QuantizeLinear → DequantizeLinear pair whose parameters differ.

A Q→DQ pair stands for one quantization (fake-quant); with different scales, zero points,
axes or block sizes it silently rescales the tensor, and QDQ-aware runtimes will not treat
it as one. Parameters are compared only when both are known (same value, or constants).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from dqtool import codecs, graph
from dqtool.linting.context import ModelContext, QuantSite
from dqtool.linting.finding import Finding
from dqtool.linting.registry import check, define

define("DQ021", "pair-mismatch", "error",
       "a QuantizeLinear → DequantizeLinear pair whose scale, zero point, axis or block size "
       "differ",
       "node 'X_DequantizeLinear' (ai.onnx DequantizeLinear-13): its QuantizeLinear "
       "'X_QuantizeLinear' uses a different scale (0.02 vs 0.04)")


def _same(a: ir.Value | None, b: ir.Value | None, *, zero_if_absent: bool) -> bool | None:
    """True/False when known; None when a value is not constant (cannot tell)."""
    if a is b:
        return True
    arrays = []
    for v in (a, b):
        if v is None:
            if not zero_if_absent:
                return None
            arrays.append(None)
            continue
        arr = graph.constant_array(v)
        if arr is None:
            return None
        arrays.append(arr)
    x, y = arrays
    if x is None or y is None:  # an absent zero point equals an all-zero one
        other = y if x is None else x
        return other is None or not np.any(other.astype(np.float64))
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _brief(v: ir.Value | None) -> str:
    arr = graph.constant_array(v)
    if arr is None:
        return "none" if v is None else f"'{v.name}'"
    if arr.size <= 3:
        return str(arr.astype(np.float64).reshape(-1).tolist())
    return f"{arr.dtype}{arr.shape}"


def _mismatches(q: QuantSite, producer: ir.Node, ctx: ModelContext) -> list[str]:
    qspec = ctx.spec_of[id(producer)]
    out = []
    for i, what in ((1, "scale"), (2, "zero point")):
        a, b = graph.input_value(producer, i), graph.input_value(q.node, i)
        if _same(a, b, zero_if_absent=i == 2) is False:
            out.append(f"a different {what} ({_brief(a)} vs {_brief(b)})")
    d = q.spec
    if qspec.granularity == d.granularity and d.granularity in ("per-axis", "blocked"):
        if qspec.axis != d.axis:
            out.append(f"a different axis ({qspec.axis} vs {d.axis})")
        if qspec.block_size != d.block_size:
            out.append(f"a different block_size ({qspec.block_size} vs {d.block_size})")
    return out


@check("DQ021")
def pairs(ctx: ModelContext) -> Iterator[Finding]:
    for q in ctx.dequantize:
        x = graph.input_value(q.node, 0)
        producer = None if x is None else x.producer()
        if producer is None or producer.op_type != "QuantizeLinear" or \
                not codecs.is_quant_node(producer):
            continue
        diffs = _mismatches(q, producer, ctx)
        if diffs:
            yield ctx.finding("DQ021", "error", f"its QuantizeLinear "
                              f"'{producer.name or '<unnamed>'}' uses " + ", ".join(diffs), q)

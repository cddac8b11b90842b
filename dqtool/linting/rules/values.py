"""DQ001 scale values and DQ002 zero-point values: rules that need the constants' values
(scales and zero points are small: one per channel or block)."""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np

from dqtool import graph, types
from dqtool.linting.context import ModelContext, QuantSite
from dqtool.linting.finding import Finding
from dqtool.linting.registry import check, define

define("DQ001", "scale-value", "error",
       "a scale that is zero, NaN or infinite (error), or negative or subnormal (warning)",
       "node 'W_DequantizeLinear' (ai.onnx DequantizeLinear-13): scale has 1 zero value "
       "(first at index (2,)); a zero scale maps every value to 0")
define("DQ002", "zero-point-value", "error",
       "a zero point outside its quantized type's range, or non-zero for float8/float4/float6",
       "node 'W_DequantizeLinear' (ai.onnx DequantizeLinear-19): float8e4m3fn zero point has "
       "1 non-zero value (first at index ()); runtimes reject it")


def _first(mask: np.ndarray) -> str:
    return str(tuple(int(i) for i in np.argwhere(mask)[0])) if mask.ndim else "()"


def _scale_findings(ctx: ModelContext, q: QuantSite) -> Iterator[Finding]:
    value = graph.input_value(q.node, 1)
    arr = graph.constant_array(value)
    if arr is None or arr.size == 0:
        return
    s = arr.astype(np.float64)
    kinds: list[tuple[str, np.ndarray, str]] = [
        ("zero", s == 0, "error"), ("NaN", np.isnan(s), "error"),
        ("infinite", np.isinf(s), "error"), ("negative", s < 0, "warning"),
    ]
    name = types.name_of(value.dtype) if value is not None and value.dtype else None
    # Only float scales have subnormals; ml_dtypes' int4/uint4 are kind "V" like its floats.
    elem = types.TYPES.get(name or "")
    if (arr.dtype != np.dtype(ml_dtypes.float8_e8m0fnu) and arr.dtype.kind in "fV"
            and elem is not None and not elem.is_integer):
        tiny = float(ml_dtypes.finfo(arr.dtype).smallest_normal)
        kinds.append(("subnormal", (s != 0) & (np.abs(s) < tiny), "warning"))
    for kind, mask, severity in kinds:
        n = int(mask.sum())
        if n:
            yield ctx.finding("DQ001", severity, f"{name or ''} scale has {n} {kind} value"
                              f"{'s' if n > 1 else ''} (first at index {_first(mask)})", q)


def _zero_point_findings(ctx: ModelContext, q: QuantSite) -> Iterator[Finding]:
    spec = q.spec
    if spec.zero_point != "integer" or spec.quant_type not in types.TYPES:
        return
    arr = graph.constant_array(graph.input_value(q.node, 2))
    if arr is None or arr.size == 0:
        return
    qt = types.TYPES[spec.quant_type]
    z = arr.astype(np.float64)
    if not qt.is_integer:
        bad, why = (z != 0) | np.isnan(z), "non-zero value"
        tail = "runtimes reject it"
    else:
        bad, why = (z < qt.min) | (z > qt.max), "value outside"
        tail = f"{qt.name} holds {qt.min}..{qt.max}"
    n = int(bad.sum())
    if n:
        text = (f"{qt.name} zero point has {n} {why}{'s' if n > 1 and not qt.is_integer else ''}"
                f"{' its range' if qt.is_integer else ''} (first at index {_first(bad)}); {tail}")
        yield ctx.finding("DQ002", "error", text, q)


@check("DQ001", "DQ002")
def value_rules(ctx: ModelContext) -> Iterator[Finding]:
    for q in ctx.quant:
        yield from _scale_findings(ctx, q)
        yield from _zero_point_findings(ctx, q)

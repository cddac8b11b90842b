"""``directml-flX.Y``: DML_ELEMENT_WISE_DEQUANTIZE_LINEAR by feature level, and from 6.3
DML_DEQUANTIZE for blocked int4/int8 (``docs/semantics.md#directml``).

The element-wise operator broadcasts scale and zero point by zero strides, so per-tensor
and per-axis fit and blocked does not; its output type is the scale's type.
"""

from __future__ import annotations

from dataclasses import dataclass

from dqtool import registry
from dqtool.linting.targets.base import Candidate, Profile, Target, or_fold, ragged, rank_of
from dqtool.spec import QuantSpec

_INTS = frozenset({"int8", "int16", "int32", "uint8", "uint16", "uint32"})


@dataclass(frozen=True)
class Level:
    name: str
    dims: tuple[int, int]  # dimension counts allowed (inclusive)
    x_types: frozenset[str]
    scale_types: frozenset[str]
    zero_point_optional: bool
    dequantize_op: bool  # DML_DEQUANTIZE (blocked) available


LEVELS = {
    "1.0": Level("1.0", (4, 4), frozenset({"uint8"}), frozenset({"float"}), False, False),
    "2.1": Level("2.1", (4, 4), _INTS, frozenset({"float"}), False, False),
    "3.0": Level("3.0", (1, 8), _INTS, frozenset({"float"}), False, False),
    "6.0": Level("6.0", (1, 8), _INTS, frozenset({"float", "float16"}), False, False),
    "6.2": Level("6.2", (1, 8), _INTS, frozenset({"float", "float16"}), True, False),
    "6.3": Level("6.3", (1, 8), _INTS, frozenset({"float", "float16"}), True, True),
}
_BLOCK_TYPES = frozenset({"int8", "int4", "uint8", "uint4"})


def _type_fix(spec: QuantSpec) -> str | None:
    qt = spec.quant_type or ""
    if qt in ("int4", "uint4", "int2", "uint2"):
        return or_fold(spec, "`dqtool downgrade --opset 20` (widens to int8/uint8)")
    return or_fold(spec, None) or "none: no exact rewrite to a type DirectML takes"


def _scale_fix(spec: QuantSpec) -> str | None:
    if spec.scale_type == "float8e8m0":
        return or_fold(spec, "`dqtool downgrade --opset 23` (float32 scale)")
    if spec.float_type != spec.scale_type and spec.output_dtype_attr:
        return or_fold(spec, "`dqtool downgrade --opset 22` (output_dtype → Cast)")
    return or_fold(spec, "`dqtool downgrade --opset 18` (float32 scale, Cast of the output)")


def _common(c: Candidate, spec: QuantSpec, lv: Level, x_types: frozenset[str],
            scale_types: frozenset[str]) -> None:
    where = f"FL{lv.name}"
    if spec.quant_type and spec.quant_type not in x_types:
        c.add("DQ101", f"x type {spec.quant_type} ({where} takes "
              f"{', '.join(sorted(x_types))})", _type_fix(spec))
    if spec.scale_type and spec.scale_type not in scale_types:
        c.add("DQ102", f"a {spec.scale_type} scale ({where} takes "
              f"{', '.join(sorted(scale_types))})", _scale_fix(spec))
    elif spec.float_type and spec.scale_type and spec.float_type != spec.scale_type:
        c.add("DQ102", f"output {spec.float_type} differs from the {spec.scale_type} scale "
              f"({where}: output type = scale type)", _scale_fix(spec))
    rank = rank_of(spec)
    lo, hi = lv.dims
    if rank is not None and not lo <= rank <= hi:
        want = f"exactly {lo}" if lo == hi else f"{lo} to {hi}"
        c.add("DQ104", f"x has {rank} dimensions ({where} takes {want})",
              or_fold(spec, None) or "none in dqtool: reshape to 4-D in the exporter")
    if spec.zero_point == "none" and not lv.zero_point_optional:
        c.add("DQ105", f"no zero point ({where} requires one below FL6.2)",
              or_fold(spec, None) or "none in dqtool: give the node an all-zero zero point")


def profile(level: str) -> Profile:
    lv = LEVELS[level]

    def candidates(spec: QuantSpec, opset: int) -> list[Candidate]:
        foreign = registry.lint_fact(spec.domain, "directml")
        if foreign:
            c = Candidate("DML_ELEMENT_WISE_DEQUANTIZE_LINEAR")
            c.add("DQ106", foreign,
                  f"`dqtool upgrade --opset {max(opset, 21)}` (to ai.onnx)")
            return [c]
        ew = Candidate("DML_ELEMENT_WISE_DEQUANTIZE_LINEAR")
        _common(ew, spec, lv, lv.x_types, lv.scale_types)
        if spec.granularity == "blocked":
            why = ("the element-wise operator broadcasts, it cannot block" if lv.dequantize_op
                   else "only DML_DEQUANTIZE, from FL6.3, takes blocks")
            ew.add("DQ103", f"blocked ({why})",
                   f"`dqtool upgrade --opset {max(opset, 21)} --per-axis` (blocked → per-axis), "
                   "or `dqtool downgrade --opset 20`")
        out = [ew]
        if lv.dequantize_op:
            dq = Candidate("DML_DEQUANTIZE")
            _common(dq, spec, lv, _BLOCK_TYPES, frozenset({"float", "float16"}))
            if ragged(spec):
                dq.add("DQ107", f"block_size {spec.block_size} does not divide "
                       f"{spec.x_shape[spec.axis]} on axis {spec.axis} (DML_DEQUANTIZE needs "
                       "exact division)", f"`dqtool upgrade --opset {max(opset, 21)} "
                       "--per-axis` (pads the ragged block)")
            out.append(dq)
        return out

    return Profile(f"directml-fl{level}", f"DirectML feature level {level}", candidates)


TARGETS = [Target(f"directml-fl{lv}", f"DirectML feature level {lv}",
                  lambda value, lv=lv: profile(lv) if value == f"directml-fl{lv}" else None,
                  order=20)
           for lv in LEVELS]

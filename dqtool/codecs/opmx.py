"""OpenPPL's opmx DequantizeLinear (domain ``opmx``, older exports ``pmx``), version 1.

int4 is packed four unsigned nibbles per int16 along dimension 0, with an implicit zero
point of 8; ``quant_axis`` names the dimension along which a scale is shared, in groups of
``group_size`` that must divide exactly; a float zero point is a bias added after the
multiply (``docs/semantics.md#opmx``). The spec reads the *logical* (unpacked) shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.codecs import base
from dqtool.codecs.granularity import _fmt
from dqtool.spec import (
    P_ATTR,
    P_BLOCK,
    P_SHAPE,
    P_TYPE,
    P_ZP,
    P_ZP_VALUE,
    Dim,
    Problem,
    QuantSpec,
)

ATTRIBUTES = frozenset(
    {"quant_data_type", "quant_method", "quant_axis", "group_size", "has_zeropoint",
     "float_zeropoint"}
)
PACKING_INT4 = "int4x4-int16-dim0"
SCALE_TYPES = frozenset({"float", "float16"})


def logical_shape(packed: tuple[Dim, ...] | None, quant_data_type: str) -> tuple[Dim, ...] | None:
    if packed is None or quant_data_type != "int4" or not packed:
        return packed
    d0 = packed[0]
    return (d0 * 4 if isinstance(d0, int) else None, *packed[1:])


def _layout(x_shape, scale_shape, quant_axis: int, group: int) -> tuple[str | None, int | None,
                                                                        int | None, list[Problem]]:
    if scale_shape is None:
        return None, None, None, []
    if len(scale_shape) == 0 or scale_shape == (1,):
        return "per-tensor", None, None, []
    if x_shape is None or len(scale_shape) != len(x_shape):
        return None, None, None, [Problem(P_SHAPE, f"scale shape {_fmt(scale_shape)} must be a "
                                          f"scalar, (1) or of x's rank (x {_fmt(x_shape)})")]
    problems: list[Problem] = []
    for d, (xd, sd) in enumerate(zip(x_shape, scale_shape, strict=True)):
        if d != quant_axis and isinstance(xd, int) and isinstance(sd, int) and xd != sd:
            problems.append(Problem(P_SHAPE, f"scale {_fmt(scale_shape)} must equal x "
                                    f"{_fmt(x_shape)} on every axis but quant_axis {quant_axis}"))
    xd, sd = x_shape[quant_axis], scale_shape[quant_axis]
    if sd == 1 and (group == 0 or xd == group):
        # one scale for the whole quant_axis: per-channel along the other dimension
        if len(x_shape) == 2:
            return "per-axis", 1 - quant_axis, None, problems
        return "blocked", quant_axis, xd if isinstance(xd, int) else None, problems
    if group <= 0:
        problems.append(Problem(P_BLOCK, f"scale {_fmt(scale_shape)} is grouped on quant_axis "
                                f"{quant_axis} but group_size is {group}"))
        return "blocked", quant_axis, None, problems
    if isinstance(xd, int) and (xd % group or (isinstance(sd, int) and sd != xd // group)):
        problems.append(Problem(P_BLOCK, f"group_size {group} must divide x's {xd} on "
                                f"quant_axis {quant_axis} exactly into the scale's {sd} groups"))
    return "blocked", quant_axis, group, problems


@dataclass(frozen=True)
class OpmxCodec:
    domain: str  # "opmx" or "pmx"
    op: str = "DequantizeLinear"
    since_version: int = 1

    def read(self, node: ir.Node, version: int) -> QuantSpec:
        where = f"{self.domain}.DequantizeLinear"
        x, scale, zp = (graph.input_value(node, i) for i in range(3))
        qdt = base.attr_string(node, "quant_data_type", None)
        quant_axis = base.attr_int(node, "quant_axis", 1)
        group = base.attr_int(node, "group_size", 128)
        has_zp = bool(base.attr_int(node, "has_zeropoint", 0))
        float_zp = bool(base.attr_int(node, "float_zeropoint", 0))
        x_type, s_type, zp_type = (graph.elem_type(v) for v in (x, scale, zp))
        problems = base.input_count_problems(node, 2, 3, where)
        problems += base.unknown_attributes(node, ATTRIBUTES, where)
        if qdt not in ("int4", "int8"):
            problems.append(Problem(P_ATTR, f"quant_data_type must be int4 or int8, got {qdt!r}"))
        want_x = {"int4": "int16", "int8": "int8"}.get(qdt or "")
        if want_x and x_type and x_type != want_x:
            problems.append(Problem(P_TYPE, f"x must be {want_x} for quant_data_type {qdt}, "
                                    f"got {x_type}"))
        problems += base.type_problem("scale", s_type, SCALE_TYPES, where)
        if quant_axis not in (0, 1):
            problems.append(Problem(P_ATTR, f"quant_axis must be 0 or 1, got {quant_axis}"))
        problems += self._zero_point_problems(zp, zp_type, has_zp, float_zp, qdt)
        x_shape = logical_shape(graph.shape_of(x), qdt or "")
        scale_shape = graph.shape_of(scale)
        if zp is not None and graph.shape_of(zp) not in (None, scale_shape):
            problems.append(Problem(P_SHAPE, "zero point shape differs from scale shape"))
        gran, axis, block, lay_problems = _layout(
            x_shape, scale_shape, quant_axis if quant_axis in (0, 1) else 1, group or 0
        )
        zp_kind = "float" if (has_zp and float_zp) else "integer" if has_zp else "none"
        # Unpacked, opmx int4 is ONNX int4 (nibble ^ 8) or uint4 with its zero point.
        q_type = ("uint4" if zp_kind == "integer" else "int4") if qdt == "int4" else "int8"
        attrs = (("float_zeropoint", float_zp), ("group_size", group),
                 ("has_zeropoint", has_zp), ("quant_axis", quant_axis),
                 ("quant_data_type", qdt))
        return QuantSpec(
            op="DequantizeLinear", domain=self.domain, version=version, since_version=1,
            quant_type=q_type, scale_type=s_type, float_type=s_type, granularity=gran,
            axis=axis, block_size=block, zero_point=zp_kind,
            zero_point_type=zp_type if has_zp else None,
            packing=PACKING_INT4 if qdt == "int4" else "none",
            x_shape=x_shape, scale_shape=scale_shape,
            x_constant=graph.constant_tensor(x) is not None,
            scale_constant=graph.constant_tensor(scale) is not None,
            zero_point_constant=has_zp and graph.constant_tensor(zp) is not None,
            attributes=attrs, problems=tuple(problems + lay_problems),
        )

    @staticmethod
    def _zero_point_problems(zp, zp_type, has_zp, float_zp, qdt) -> list[Problem]:
        if not has_zp:
            return [Problem(P_ZP, "a zero point is given but has_zeropoint is 0: it is ignored",
                            "warning")] if zp is not None else []
        if zp is None:
            return [Problem(P_ZP, "has_zeropoint is 1 but no zero point input is given")]
        want = ("float", "float16") if float_zp else ("int8",)
        if zp_type and zp_type not in want:
            return [Problem(P_ZP, f"zero point must be {' or '.join(want)} "
                            f"{'(float_zeropoint=1)' if float_zp else ''}, got {zp_type}")]
        if not float_zp and qdt == "int4":
            values = graph.constant_array(zp)
            if values is not None and values.size and (
                    int(np.min(values)) < 0 or int(np.max(values)) > 15):
                return [Problem(P_ZP_VALUE, "int4 zero point values must be in 0..15")]
        return []


def codecs() -> list[OpmxCodec]:
    return [OpmxCodec("opmx"), OpmxCodec("pmx")]

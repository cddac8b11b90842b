"""``opmx``: what OpenPPL's opmx DequantizeLinear can hold (``docs/semantics.md#opmx``):
int8, or int4 packed four per int16 along dimension 0; float32/float16 scales with output =
scale type; constant scale and zero point; groups along ``quant_axis`` 0 or 1, dividing
exactly. dqtool converts opmx to ai.onnx, not back, so most fixes are "none"."""

from __future__ import annotations

from dqtool import registry
from dqtool.linting.targets.base import Candidate, Profile, fixed, ragged, rank_of
from dqtool.spec import QuantSpec

_X = frozenset({"int8", "int4", "uint4"})
_NONE = "none: dqtool does not write opmx"


def candidates(spec: QuantSpec, opset: int) -> list[Candidate]:
    c = Candidate("opmx DequantizeLinear")
    if registry.lint_fact(spec.domain, "opmx") == "native":
        return [c]  # the codec's own rules (DQ010–DQ019) judge these
    if spec.quant_type and spec.quant_type not in _X:
        c.add("DQ101", f"x type {spec.quant_type} (opmx takes int8, or int4 as int4x4)", _NONE)
    if spec.scale_type and spec.scale_type not in ("float", "float16"):
        c.add("DQ102", f"a {spec.scale_type} scale (opmx takes float32, float16)", _NONE)
    elif spec.float_type != spec.scale_type:
        c.add("DQ102", f"output {spec.float_type} differs from the scale {spec.scale_type} "
              "(opmx: output type = scale type)", "`dqtool downgrade --opset 22` "
              "(output_dtype → Cast)")
    rank = rank_of(spec)
    if spec.granularity == "per-axis" and rank is not None and rank > 2:
        c.add("DQ103", f"per-axis on a rank-{rank} tensor (opmx groups along one of "
              "dimensions 0 and 1 only)", _NONE)
    if spec.granularity == "blocked" and spec.axis is not None and spec.axis > 1:
        c.add("DQ103", f"blocked on axis {spec.axis} (opmx quant_axis is 0 or 1)", _NONE)
    if ragged(spec):
        c.add("DQ107", f"block_size {spec.block_size} does not divide "
              f"{spec.x_shape[spec.axis]} (group_size must divide exactly)", _NONE)
    if spec.quant_type in ("int4", "uint4") and spec.x_shape and \
            isinstance(spec.x_shape[0], int) and spec.x_shape[0] % 4:
        c.add("DQ107", f"dimension 0 is {spec.x_shape[0]}, not a multiple of 4 (int4x4 "
              "packs four rows per int16)", _NONE)
    if not spec.scale_constant or (spec.zero_point != "none" and not spec.zero_point_constant):
        c.add("DQ108", "scale or zero point computed at run time (opmx takes constants)", _NONE)
    return [c]


PROFILE = Profile("opmx", "OpenPPL opmx DequantizeLinear", candidates)

TARGETS = [fixed(PROFILE, order=40)]

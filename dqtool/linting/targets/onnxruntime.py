"""``onnxruntime``: the CPU execution provider of onnxruntime 1.31 (measured here): no
bfloat16 scale, float4e2m1, float8e8m0 or float6, ai.onnx opsets up to 26, no opmx; its
com.microsoft DequantizeLinear takes float scales only (SEMANTICS.md §1–2)."""

from __future__ import annotations

from dqtool import families
from dqtool.linting.targets.base import Candidate, Profile, fixed, or_fold, to_ai_onnx_fix
from dqtool.spec import QuantSpec

MAX_OPSET = 26


def candidates(spec: QuantSpec, opset: int) -> list[Candidate]:
    c = Candidate("onnxruntime CPU DequantizeLinear")
    foreign = families.lint_fact(spec.domain, "onnxruntime")
    if foreign:
        c.add("DQ106", foreign, to_ai_onnx_fix(spec, opset))
        return [c]
    if spec.domain == "com.microsoft":
        if spec.scale_type not in (None, "float"):
            c.add("DQ102", f"a {spec.scale_type} scale: onnxruntime's CPU com.microsoft "
                  "DequantizeLinear takes float scales only", to_ai_onnx_fix(spec, opset))
        return [c]
    qt, st = spec.quant_type, spec.scale_type
    if qt == "float4e2m1":
        c.add("DQ101", "float4e2m1 has no CPU kernel",
              or_fold(spec, "`dqtool downgrade --opset 22` (float4e2m1 → float8e4m3fn, exact)"))
    elif qt in ("float6e2m3", "float6e3m2"):
        c.add("DQ101", f"{qt} has no CPU kernel (and needs opset 28)", or_fold(spec, None))
    if st == "bfloat16":
        c.add("DQ102", "a bfloat16 scale has no CPU kernel",
              or_fold(spec, "`dqtool downgrade --opset 18` (float32 scale, Cast of the output)"))
    elif st == "float8e8m0":
        c.add("DQ102", "a float8e8m0 scale has no CPU kernel",
              or_fold(spec, "`dqtool downgrade --opset 23` (float8e8m0 scale → float32, exact)"))
    return [c]


PROFILE = Profile("onnxruntime", "onnxruntime 1.31 CPU", candidates, max_opset=MAX_OPSET,
                  opset_fix=f"`dqtool downgrade --opset {MAX_OPSET}`")

TARGETS = [fixed(PROFILE, order=10)]

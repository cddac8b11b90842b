"""``tensorrt`` / ``tensorrt-10`` / ``tensorrt-8.6``: TensorRT's IDequantizeLayer, as its
ONNX parser imports an ai.onnx DequantizeLinear. No GPU here, so nothing is measured: every
rule is NVIDIA's documentation (docs/targets-tensorrt.md):

- TensorRT 8.6.1 Operators, Quantize/Dequantize
  (docs.nvidia.com/deeplearning/tensorrt/archives/tensorrt-861/operators/docs/): int8 only;
  the scale a build-time constant scalar or 1-D tensor, float32; the zero point all zeros.
- TensorRT 10 Operators, Dequantize (docs.nvidia.com/deeplearning/tensorrt/operators/docs/
  Dequantize.html; IDequantizeLayer in the 10.1.0 C++ API): int8, float8, int4; the scale
  a build-time constant scalar, 1-D tensor, or 2-D tensor for block quantization (int4
  only), of the output's type (float32, float16, bfloat16); the zero point all zeros; at
  most 2^31-1 elements (Quantize page, "Volume Limits").
- TensorRT 10.11 "Working with Quantized Types": symmetric quantization; activations and
  weights for INT8 and FP8, weight-only for INT4; "Explicit Quantization", ONNX support:
  QuantizeLinear / DequantizeLinear are imported as Q/DQ layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.linting.context import QuantSite
from dqtool.linting.targets.base import Candidate, Issue, Target, or_fold, to_ai_onnx_fix
from dqtool.linting.targets.deploy import DeployProfile, no_candidates
from dqtool.linting.targets.units import NodeUnit
from dqtool.spec import QuantSpec

_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class Release:
    name: str
    types: frozenset[str]
    scale_types: frozenset[str]
    blocked_types: frozenset[str]  # 2-D block scales
    weight_only: frozenset[str]  # types for weights only (constant x)


RELEASES = {
    "8.6": Release("8.6", frozenset({"int8"}), frozenset({"float"}), frozenset(),
                   frozenset()),
    "10": Release("10", frozenset({"int8", "float8e4m3fn", "int4"}),
                  frozenset({"float", "float16", "bfloat16"}), frozenset({"int4"}),
                  frozenset({"int4"})),
}


def _type_fix(spec: QuantSpec, r: Release) -> str | None:
    qt = spec.quant_type or ""
    if qt == "float4e2m1" and "float8e4m3fn" in r.types:
        return or_fold(spec, "`dqtool downgrade --opset 22` (float4e2m1 → float8e4m3fn, "
                       "exact)")
    if qt in ("int4", "int2") and spec.constant and "int8" in r.types:
        return "`dqtool downgrade --opset 20` (widens the weight to int8, blocks → per-axis)"
    return or_fold(spec, None) or "re-quantize as int8, symmetric (no exact dqtool rewrite)"


def _zero_point(q_node: ir.Node, spec: QuantSpec, c: Candidate, where: str) -> None:
    if spec.zero_point == "none":
        return
    arr = graph.constant_array(graph.input_value(q_node, 2))
    if arr is None:
        c.add("DQ142", f"the zero point is computed at run time ({where}: a build-time "
              "constant of zeros)", "make it an initializer of zeros (symmetric "
              "quantization); no exact dqtool rewrite")
        return
    n = int(np.count_nonzero(arr.astype(np.float64)))
    if n:
        c.add("DQ141", f"the zero point has {n} non-zero value{'s' if n > 1 else ''} "
              f"({where}: symmetric quantization, zero points of 0)",
              "re-quantize symmetrically (zero point 0); no exact dqtool rewrite")


def _shape(spec: QuantSpec, r: Release, c: Candidate, where: str, opset: int) -> None:
    if spec.granularity == "blocked":
        rank = None if spec.x_shape is None else len(spec.x_shape)
        if spec.quant_type not in r.blocked_types:
            fix = f"`dqtool upgrade --opset {max(opset, 21)} --per-axis` (blocked → per-axis)"
            if spec.quant_type in ("int4", "uint4") and spec.constant:
                fix = "`dqtool downgrade --opset 20` (widens to int8, blocks → per-axis)"
            takes = (f"2-D block scales are for {', '.join(sorted(r.blocked_types))} only"
                     if r.blocked_types else "scalar or 1-D scales only")
            c.add("DQ143", f"blocked {spec.quant_type} ({where}: {takes})", fix)
        elif rank not in (None, 2):
            c.add("DQ143", f"blocked on a rank-{rank} tensor ({where}: 2-D block scales)",
                  f"`dqtool upgrade --opset {max(opset, 21)} --per-axis` (blocked → per-axis)")
    n = graph.num_elements(spec.x_shape)
    if n is not None and n > _LIMIT:
        c.add("DQ144", f"x has {n} elements ({where}: at most {_LIMIT})",
              "split the tensor in the exporter; no exact dqtool rewrite")


def check(spec: QuantSpec, q_node: ir.Node, r: Release, opset: int) -> Candidate:
    where = f"TensorRT {r.name}"
    c = Candidate(f"TensorRT {r.name} IDequantizeLayer")
    if spec.domain != "ai.onnx":
        c.add("DQ146", f"a {spec.domain} DequantizeLinear ({where}'s ONNX parser imports "
              "ai.onnx DequantizeLinear)", to_ai_onnx_fix(spec, opset))
        return c
    qt = spec.quant_type
    if qt and qt not in r.types:
        c.add("DQ140", f"x type {qt} ({where} takes {', '.join(sorted(r.types))})",
              _type_fix(spec, r))
    elif qt in r.weight_only and not (spec.x_constant or spec.x_from_quantize):
        c.add("DQ140", f"{qt} activations ({where}: {qt} is for weights only)",
              "int8 or float8 activations; no exact dqtool rewrite")
    st = spec.scale_type
    if st and st not in r.scale_types:
        fix = "`dqtool downgrade --opset 23` (float32 scale, exact)" \
            if st == "float8e8m0" else "`dqtool downgrade --opset 18` (float32 scale, Cast " \
            "of the output)"
        c.add("DQ145", f"a {st} scale ({where} takes {', '.join(sorted(r.scale_types))})",
              or_fold(spec, fix))
    elif st and spec.float_type and spec.float_type != st:
        c.add("DQ145", f"output {spec.float_type} differs from the {st} scale ({where}: "
              "output type = scale type)", "`dqtool downgrade --opset 22` (output_dtype → "
              "Cast)")
    if not spec.scale_constant:
        c.add("DQ142", f"the scale is computed at run time ({where}: a build-time "
              "constant)", "make the scale an initializer; no exact dqtool rewrite")
    _zero_point(q_node, spec, c, where)
    _shape(spec, r, c, where, opset)
    return c


def profile(release: str, name: str) -> DeployProfile:
    r = RELEASES[release]

    def sites(q: QuantSite, opset: int) -> list[Candidate]:
        return [check(q.spec, q.node, r, opset)]

    def judge(unit: NodeUnit) -> list[Issue]:
        opset = graph.opset_of(unit.site.opsets, "") or 21
        issues: list[Issue] = []
        for o in unit.operands:
            if o.dq is not None:
                issues += check(o.dq.spec, o.dq.node, r, opset).issues
        w = unit.weight
        weight_only = w is not None and w.spec is not None and \
            w.spec.quant_type in r.weight_only
        if unit.operands[0].dq is None and w is not None and not weight_only:
            issues.append(Issue("DQ147", "the activation input is float: TensorRT "
                                f"{r.name} quantizes activations and weights together, so "
                                "the layer runs in float with a dequantized weight",
                                "quantize the activation too (a QuantizeLinear → "
                                "DequantizeLinear pair)"))
        return issues

    return DeployProfile(name, f"TensorRT {release} IDequantizeLayer (documentation)",
                         no_candidates, judge=judge, where=f"on TensorRT {release}",
                         fallback="runs it in float", unit_codes=frozenset({"DQ147"}),
                         site_candidates=sites)


def _answer(release: str, name: str):
    return lambda value: profile(release, name) if value == name else None


TARGETS = [
    Target("tensorrt", "TensorRT's ONNX parser, IDequantizeLayer (= tensorrt-10)",
           _answer("10", "tensorrt"), order=64),
    *(Target(f"tensorrt-{r}", f"TensorRT {r} IDequantizeLayer, from NVIDIA's documentation",
             _answer(r, f"tensorrt-{r}"), order=65) for r in RELEASES),
]

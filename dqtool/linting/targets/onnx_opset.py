"""``onnx-opset-N``: can ai.onnx DequantizeLinear at opset N express the node, and if not,
which ``dqtool downgrade`` rewrite gets it there (``docs/semantics.md#aionnx-dequantizelinear``;
the rewrites are ``dqtool/convert``'s adapters)."""

from __future__ import annotations

import re

from dqtool import versions
from dqtool.codecs import onnx_std
from dqtool.errors import UsageError
from dqtool.linting.targets.base import Candidate, Profile, Target, or_fold, to_ai_onnx_fix
from dqtool.spec import QuantSpec
from dqtool.storage import MAX_ONNX_OPSET

_WIDENED = frozenset({"int4", "uint4", "int2", "uint2", "int16", "uint16"})


def _fix(spec: QuantSpec, code: str, n: int) -> str | None:
    """The exact rewrite ``downgrade`` offers for this reason, else decomposing/folding."""
    down = f"`dqtool downgrade --opset {n}`"
    decompose = f"`dqtool downgrade --opset {n} --allow-decompose` (Cast/Sub/Mul, no longer QDQ)"
    x_const = spec.x_constant or spec.x_from_quantize
    qt = spec.quant_type or ""
    if code == versions.R_QUANT_TYPE:
        if qt in _WIDENED:
            return down + " (widens the constant values)" if x_const else decompose
        if qt == "float4e2m1" and n >= 19:
            return down + " (float4e2m1 → float8e4m3fn, exact)"
        return or_fold(spec, decompose)
    if code == versions.R_GRANULARITY:
        if spec.granularity == "blocked" and n >= 13 and x_const:
            return down + " (blocked → per-axis layout rewrite)"
        return or_fold(spec, decompose)
    return down + " (float32 scale / Cast of the output)"


def profile(n: int) -> Profile:
    since = onnx_std.since_at("DequantizeLinear", n)

    def candidates(spec: QuantSpec, opset: int) -> list[Candidate]:
        c = Candidate(f"ai.onnx DequantizeLinear at opset {n}")
        if spec.domain != "ai.onnx":
            lowest = versions.lowest_version(spec)
            fix = to_ai_onnx_fix(spec, n) if lowest is not None and lowest <= n else \
                or_fold(spec, None)
            c.add("DQ106", f"{spec.domain} is not the ai.onnx domain", fix)
            return [c]
        if since is None:
            c.add("DQ106", f"ai.onnx has no DequantizeLinear at opset {n}")
            return [c]
        for reason in versions.reasons(spec, since):
            c.add(reason.code, reason.message, _fix(spec, reason.code, n))
        return [c]

    return Profile(f"onnx-opset-{n}", f"ai.onnx opset {n}", candidates, max_opset=n,
                   opset_fix=f"`dqtool downgrade --opset {n}`")


def _parse(value: str) -> Profile | None:
    m = re.fullmatch(r"onnx-opset-(\d+)", value)
    if m is None:
        return None
    n = int(m.group(1))
    if not 10 <= n <= MAX_ONNX_OPSET:
        raise UsageError(f"--target {value}: opset must be 10 to {MAX_ONNX_OPSET}")
    return profile(n)


TARGETS = [Target("onnx-opset-N", "ai.onnx DequantizeLinear at opset N (10 to the installed "
                  "onnx's newest)", _parse, order=0)]

"""``onnxruntime`` (the installed runtime, probed) and ``onnxruntime-X.Y`` (the fixed profile
of a release a user deploys): the CPU execution provider's DequantizeLinear, from the facts
in ``dqtool.runtimes.onnxruntime`` — the ai.onnx opset it still runs a DequantizeLinear at,
the quantized and scale types it takes, the scale types of its com.microsoft
DequantizeLinear, and the custom domains it has (no opmx)."""

from __future__ import annotations

from dqtool import registry
from dqtool.linting.targets.base import Candidate, Profile, Target, or_fold, to_ai_onnx_fix
from dqtool.runtimes import onnxruntime as ort_facts
from dqtool.spec import QuantSpec

# Exact ways out for the types onnxruntime lacks (dqtool's downgrade lowerings).
_QUANT_FIX = {"float4e2m1": "`dqtool downgrade --opset 22` (float4e2m1 → float8e4m3fn, exact)"}
_SCALE_FIX = {
    "bfloat16": "`dqtool downgrade --opset 18` (float32 scale, Cast of the output)",
    "float8e8m0": "`dqtool downgrade --opset 23` (float8e8m0 scale → float32, exact)",
}


def _candidates(facts: ort_facts.OrtProfile):
    def candidates(spec: QuantSpec, opset: int) -> list[Candidate]:
        c = Candidate(f"{facts.name} DequantizeLinear")
        if spec.domain != "ai.onnx" and spec.domain not in facts.domains:
            why = (registry.lint_fact(spec.domain, "onnxruntime")
                   or f"onnxruntime has no {spec.domain} domain")
            c.add("DQ106", why, to_ai_onnx_fix(spec, opset))
            return [c]
        if spec.domain == "com.microsoft":
            st = spec.scale_type
            if st is not None and st not in facts.microsoft_scale_types:
                c.add("DQ102", f"a {st} scale: onnxruntime's CPU com.microsoft "
                      "DequantizeLinear takes "
                      f"{' or '.join(sorted(facts.microsoft_scale_types))} scales only",
                      to_ai_onnx_fix(spec, opset))
            return [c]
        qt, st = spec.quant_type, spec.scale_type
        if qt is not None and qt not in facts.quant_types:
            needs = " (and needs opset 28)" if qt.startswith("float6") else ""
            c.add("DQ101", f"{qt} has no CPU kernel{needs}", or_fold(spec, _QUANT_FIX.get(qt)))
        if st is not None and st not in facts.scale_types:
            c.add("DQ102", f"a {st} scale has no CPU kernel", or_fold(spec, _SCALE_FIX.get(st)))
        return [c]

    return candidates


def profile(release: str | None = None) -> Profile:
    """``None``: the installed onnxruntime, probed; else a fixed release ("1.31")."""
    facts = ort_facts.profile_for(release)
    name = "onnxruntime" if release is None else f"onnxruntime-{release}"
    return Profile(name, facts.name if release else f"{facts.name}, probed", _candidates(facts),
                   max_opset=facts.max_opset,
                   opset_fix=f"`dqtool downgrade --opset {facts.max_opset}`")


def _answer(release: str | None):
    name = "onnxruntime" if release is None else f"onnxruntime-{release}"
    return lambda value: profile(release) if value == name else None


TARGETS = [
    Target("onnxruntime", "the installed onnxruntime's CPU provider, probed (one-node sessions)",
           _answer(None), order=10),
    *(Target(f"onnxruntime-{r}", f"onnxruntime {r} CPU, fixed profile ({p.source})",
             _answer(r), order=11) for r, p in ort_facts.FIXED.items()),
]

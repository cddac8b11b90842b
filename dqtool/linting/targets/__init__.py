"""Target profiles (``--target``): what a runtime or opset can run, from SEMANTICS.md.

Each profile module says, for one DequantizeLinear, which operators of the target could run
it and why each cannot; ``run`` turns the best candidate's issues into DQ1xx findings, each
with the dqtool command that would make the node run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from dqtool.errors import UsageError
from dqtool.io import MAX_ONNX_OPSET
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.targets import directml, onednn, onnx_opset, onnxruntime, opmx
from dqtool.linting.targets.base import Profile, best
from dqtool.runtimes import onnxruntime as ort_facts

NAMES = ("onnx-opset-N", "onnxruntime",
         *(f"onnxruntime-{release}" for release in ort_facts.FIXED),
         *(f"directml-fl{lv}" for lv in directml.LEVELS), "onednn-graph", "opmx")


def parse(target: str) -> Profile:
    m = re.fullmatch(r"onnx-opset-(\d+)", target)
    if m:
        n = int(m.group(1))
        if not 10 <= n <= MAX_ONNX_OPSET:
            raise UsageError(f"--target {target}: opset must be 10 to {MAX_ONNX_OPSET}")
        return onnx_opset.profile(n)
    m = re.fullmatch(r"directml-fl(\d\.\d)", target)
    if m and m.group(1) in directml.LEVELS:
        return directml.profile(m.group(1))
    if target == "onnxruntime":
        return onnxruntime.profile(None)  # the installed runtime, probed
    m = re.fullmatch(r"onnxruntime-(\d+\.\d+)", target)
    if m and m.group(1) in ort_facts.FIXED:
        return onnxruntime.profile(m.group(1))
    fixed = {"onednn-graph": onednn.PROFILE, "opmx": opmx.PROFILE}
    if target in fixed:
        return fixed[target]
    raise UsageError(f"unknown --target {target!r} (known: {', '.join(NAMES)})")


def run(ctx: ModelContext, profile: Profile) -> Iterator[Finding]:
    opset = ctx.onnx_opset or 0
    if profile.max_opset is not None and opset > profile.max_opset:
        fix = f"{profile.opset_fix} would lower it" if profile.opset_fix else None
        who = "" if profile.name.startswith("onnx-opset-") else f" ({profile.description})"
        yield ctx.finding("DQ100", "error", f"the model's ai.onnx opset {opset} is above the "
                          f"target's {profile.max_opset}{who}",
                          target=profile.name, fix=fix)
    for q in ctx.dequantize:
        worst = best(profile.candidates(q.spec, opset))
        if worst is None:
            continue
        for issue in worst.issues:
            yield ctx.finding(issue.code, "error", f"{profile.name} cannot run it "
                              f"({worst.name}): {issue.reason}", q, target=profile.name,
                              fix=issue.fix)

"""How far a QDQ form is from its integer original, in quantization steps.

Integer accumulation (the QOperator kernels) and the float simulation of a QDQ graph are
not bit-identical in general: the float operator sums float products and rounds each
partial sum, where the integer kernel sums integers exactly and rounds once. A conversion
between the two forms is therefore faithful, not exact. ``judge`` measures it: every
output on onnxruntime (``ORT_DISABLE_ALL``) and on dqtool's reference evaluator, in steps
where the output has one, and whether onnxruntime with ``ORT_ENABLE_ALL`` (which fuses QDQ
back into integer kernels) reproduces the original exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from dqtool.checking import against, compare, inputs, path_deviations
from dqtool.families.integer import fused_back, local_error

# An output with no quantization step (a float output of a dynamic model) is judged in
# float terms: its largest difference within this fraction of its largest magnitude.
FLOAT_BUDGET = 1e-3


@dataclass
class NumericsCheck:
    outputs: list[dict[str, Any]] = field(default_factory=list)  # end to end
    skipped: list[str] = field(default_factory=list)
    fused: dict[str, Any] | None = None
    # Each converted operator fed the original's inputs (``local_error``): what the
    # conversion itself controls, and what the verdict judges when it could be measured.
    local: list[local_error.LocalError] = field(default_factory=list)
    # onnxruntime's deviations on this CPU's code path (reported, never judged)
    runtime_notes: list[str] = field(default_factory=list)

    @property
    def measured_locally(self) -> bool:
        return any(e.comparison is not None for e in self.local)

    @property
    def local_ok(self) -> bool:
        return all(e.comparison is None or bool(e.comparison.within_one_step)
                   or (e.max_steps is None and e.comparison.max_abs == 0.0)
                   for e in self.local)

    @property
    def judged_runtime(self) -> str:
        """End to end, the reference evaluator (the spec, the same on every CPU) decides;
        onnxruntime's integer kernels differ by CPU code path and are reported beside it.
        Only where the reference evaluator compared nothing does onnxruntime decide."""
        return "reference" if any(o["runtime"] == "reference" for o in self.outputs) \
            else "onnxruntime"

    @property
    def end_to_end_ok(self) -> bool:
        judged = self.judged_runtime
        return all(o["within_budget"] for o in self.outputs if o["runtime"] == judged)

    @property
    def ok(self) -> bool:
        """Every converted operator within one step of the original on the original's
        inputs; when no operator could be measured alone, every output end to end. Growth
        through re-quantizing layers is the model's (reported in ``outputs``)."""
        if not self.outputs:
            return False
        if self.measured_locally:
            return self.local_ok
        return self.end_to_end_ok

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "judged": "per-op" if self.measured_locally else "end-to-end",
                "judged_runtime": self.judged_runtime,
                "per_op": [e.to_json() for e in self.local],
                "per_op_summary": local_error.summary(self.local),
                "outputs": self.outputs, "skipped": self.skipped, "fused": self.fused,
                "runtime_deviations": self.runtime_notes}

    def describe(self) -> list[str]:
        lines = []
        if self.local:
            s = local_error.summary(self.local)
            lines.append(f"per op (each converted operator fed the original's inputs): "
                         f"{s['measured']} measured, max {s['max_steps']} step(s)"
                         + (f", {s['skipped']} not measured" if s["skipped"] else "") + ": "
                         + ("ok" if self.local_ok else "BEYOND ONE STEP: "
                            + ", ".join(s["beyond_one_step"])))
            lines += [f"  {e.describe()}" for e in self.local
                      if e.comparison is None or e.beyond_one_step]
        judged = not self.measured_locally
        head = "end to end" + ("" if judged else " (reported: growth through re-quantizing "
                               "layers is the model's, not the conversion's)")
        lines.append(f"{head}:")
        for o in self.outputs:
            if o["max_steps"] is not None:
                what = (f"max {o['max_steps']} step(s) (step {o['step']:.6g}); "
                        f"{o['off_by_one']} of {o['size']} elements about 1 step apart, "
                        f"{o['off_by_more']} more; max abs {o['max_abs']:.6g}")
            else:
                what = (f"no quantization step: max abs {o['max_abs']:.6g}, max rel "
                        f"{o['max_rel']:.6g} (budget {FLOAT_BUDGET:g} of max |y| "
                        f"{o['max_expected']:.6g})")
            verdict = "ok" if o["within_budget"] else "beyond one step"
            if judged and o["runtime"] == self.judged_runtime and not o["within_budget"]:
                verdict = "BEYOND ONE STEP"
            elif o["runtime"] != self.judged_runtime:
                verdict += " (reported, not judged)"
            lines.append(f"  {o['runtime']}: {o['name']}: {what}: {verdict}")
        lines += [f"skipped: {s}" for s in self.skipped]
        lines += [f"onnxruntime on this CPU: {n}" for n in self.runtime_notes]
        if self.fused is not None:
            f = self.fused
            if f.get("error"):
                lines.append(f"onnxruntime ORT_ENABLE_ALL: cannot run it: {f['error']}")
            else:
                same = "identical" if f["identical"] else "differs"
                lines.append("onnxruntime ORT_ENABLE_ALL (fuses QDQ back into integer "
                             f"kernels) vs the original: {same} ({f['mismatched']} elements "
                             "differ)")
        return lines


def judge(original: onnx.ModelProto, converted: onnx.ModelProto, seed: int = 0,
          fused: bool = True, given: Mapping[str, np.ndarray] | None = None
          ) -> NumericsCheck:
    """``fused``: also run the converted model on ORT_ENABLE_ALL (a QDQ model, whose
    patterns onnxruntime fuses back) against the original. ``given``: feeds by input name
    (token ids a vocabulary bounds); the others are generated from ``seed``."""
    feeds, _ = inputs.generate(original, seed=seed, given=given)
    notes: list[str] = []
    result = NumericsCheck()
    comparisons = against.compare_models(converted, original, feeds, rtol=0.0, atol=0.0,
                                         notes=notes)
    for c in comparisons:
        if c.skipped:
            result.skipped.append(c.skipped)
            continue
        for o in c.outputs:
            result.outputs.append(_verdict(c.runtime, o))
    result.fused = fused_back.fused_run(original, converted, feeds) if fused else None
    found = path_deviations.applicable(original, converted)
    if found:
        result.runtime_notes = path_deviations.describe(found) + \
            path_deviations.own_distance(original, feeds)
    try:
        result.local = local_error.measure(original, converted, feeds)
    except Exception as e:  # then the outputs are judged end to end, and it says why
        result.local = [local_error.LocalError(
            "<all>", "", "", None, f"per-op errors not measured: {type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]}")]
    return result


def _verdict(runtime: str, o: compare.OutputComparison) -> dict[str, Any]:
    doc = o.to_json()
    # (NaN where both outputs are NaN there: no value to measure against)
    worst = o.worst_expected if o.worst_expected is not None else 0.0
    expected = abs(worst) if math.isfinite(worst) else 0.0
    if o.failure:
        ok = False
    elif o.max_steps is not None:
        ok = bool(o.within_one_step)
    else:  # equal outputs are within any budget
        ok = o.nan_mismatches == 0 and (o.mismatched == 0 or
                                        o.max_abs <= FLOAT_BUDGET * max(expected, 1e-30))
    return {"runtime": runtime, "name": o.name, "size": o.size, "step": o.step,
            "max_steps": o.max_steps, "off_by_one": o.off_by_one,
            "off_by_more": o.off_by_more, "max_abs": o.max_abs, "max_rel": o.max_rel,
            "max_expected": expected, "mismatched": o.mismatched, "failure": o.failure,
            "within_budget": ok, "comparison": doc}

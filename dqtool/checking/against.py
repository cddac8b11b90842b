"""``check --against``: two models, the same inputs, every output compared on each runtime.

Both models run on onnxruntime (``ORT_DISABLE_ALL``) and on dqtool's reference evaluator;
on each runtime the checked model's outputs are compared with the original's. A runtime
that cannot run a model is reported with its reason; the comparison on it is skipped, not
failed — except the reference evaluator, which runs every dialect and is the ground truth.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from dqtool.checking import compare, runners
from dqtool.checking.models import for_ort


@dataclass(frozen=True)
class RuntimeComparison:
    runtime: str  # "onnxruntime" or "reference"
    outputs: tuple[compare.OutputComparison, ...]
    skipped: str | None = None  # why nothing was compared on this runtime
    required: bool = True  # a skip on this runtime fails the check

    @property
    def passed(self) -> bool:
        if self.skipped is not None:
            return not self.required
        return all(o.passed for o in self.outputs)

    def judge(self, rtol: float, atol: float) -> RuntimeComparison:
        return RuntimeComparison(self.runtime, tuple(o.judge(rtol, atol) for o in self.outputs),
                                 self.skipped, self.required)

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "passed": self.passed, "skipped": self.skipped,
                "outputs": [o.to_json() for o in self.outputs]}


Runner = Callable[[onnx.ModelProto, Mapping[str, np.ndarray], Path | None],
                  dict[str, np.ndarray]]


def _run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
             external_dir: Path | None) -> dict[str, np.ndarray]:
    return runners.run_ort(for_ort(model)[0], feeds, external_dir=external_dir)


def _run_ref(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
             external_dir: Path | None) -> dict[str, np.ndarray]:
    return runners.run_reference(model, feeds, external_dir=external_dir)


def compare_models(model: onnx.ModelProto, original: onnx.ModelProto,
                   feeds: Mapping[str, np.ndarray], *, rtol: float, atol: float,
                   notes: list[str], model_dir: Path | None = None,
                   original_dir: Path | None = None) -> list[RuntimeComparison]:
    """``model_dir``/``original_dir``: where a model's external tensors stay (see
    ``models.Loaded.external_dir``); None when they are in the protobuf."""
    names = [o.name for o in model.graph.output]
    extra = sorted(set(names) - {o.name for o in original.graph.output})
    if extra:
        notes.append(f"outputs only the checked model has (not compared): {', '.join(extra)}")
    return [
        _on("onnxruntime", _run_ort, (model, model_dir), (original, original_dir), feeds,
            rtol, atol, required=False),
        _on("reference", _run_ref, (model, model_dir), (original, original_dir), feeds,
            rtol, atol, required=True),
    ]


def _on(runtime: str, run: Runner, model: tuple[onnx.ModelProto, Path | None],
        original: tuple[onnx.ModelProto, Path | None], feeds: Mapping[str, np.ndarray],
        rtol: float, atol: float, required: bool) -> RuntimeComparison:
    results = []
    for label, (m, d) in (("the checked model", model), ("the original", original)):
        try:
            results.append(run(m, feeds, d))
        except runners.RuntimeFailure as e:
            return RuntimeComparison(runtime, (), f"{runtime} cannot run {label}: {e}",
                                     required)
    got, want = results
    outputs = []
    for o in original[0].graph.output:
        if o.name not in got:
            outputs.append(compare.failed(o.name, "missing from the checked model").judge(
                rtol, atol))
        else:
            outputs.append(compare.compare(o.name, got[o.name], want[o.name], rtol=rtol,
                                           atol=atol))
    return RuntimeComparison(runtime, tuple(outputs), None, required)

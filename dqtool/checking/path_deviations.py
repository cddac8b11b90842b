"""onnxruntime's CPU-path deviations in a check: named, measured, kept out of the verdict.

Where an entry of ``dqtool.runtimes.code_paths`` applies to the installed release on this
CPU's path and to an operator a compared model holds, onnxruntime's outputs are not the
specification's there: the reference evaluator (the kernel) decides, and the report says
which deviation applies and how far the original's own onnxruntime output lies from its
spec. The same model and flags so give the same verdict on every CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from dqtool.checking import against, compare, runners
from dqtool.checking.models import for_ort
from dqtool.runtimes import code_paths, cpu_path
from dqtool.runtimes.code_paths import PathDeviation
from dqtool.runtimes.onnxruntime import installed_version


def _ops(model: onnx.ModelProto) -> set[str]:
    return {f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in model.graph.node}


def for_op(op: str | None = None) -> tuple[PathDeviation, ...]:
    """The entries for the installed onnxruntime on this CPU's path (for ``op``,
    "domain:Op", or for any operator)."""
    version = installed_version()
    if version is None:
        return ()
    return code_paths.applicable("onnxruntime", version, cpu_path.probe().name, op)


def _typed_ops(model: onnx.ModelProto) -> set[tuple[str, str]]:
    """("domain:Op", element type) of each constant input of the main graph's nodes."""
    types = {t.name: onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name
             for t in model.graph.initializer
             if t.data_type in onnx.helper.get_all_tensor_dtypes()
             and t.data_type not in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED)}
    return {(f"{n.domain or 'ai.onnx'}:{n.op_type}", types[i]) for n in model.graph.node
            for i in n.input if i in types}


def applicable(*models: onnx.ModelProto) -> tuple[PathDeviation, ...]:
    """The entries for the installed onnxruntime on this CPU's path whose operators one of
    ``models`` holds (main graph), reading an element type the entry names if it names
    any."""
    ops = set().union(*(_ops(m) for m in models))
    found = [d for d in for_op() if ops & set(d.ops)]
    if any(d.types for d in found):
        typed = set().union(*(_typed_ops(m) for m in models))
        found = [d for d in found if not d.types
                 or any((op, t) in typed for op in d.ops for t in d.types)]
    return tuple(found)


def describe(found: Sequence[PathDeviation]) -> list[str]:
    version = installed_version() or ""
    path = cpu_path.probe().description
    return [d.describe(version, path) for d in found]


def own_distance(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[str]:
    """Each output of ``model`` on onnxruntime against the reference evaluator, in steps
    where the output has one: how far this CPU's onnxruntime lies from the spec."""
    try:
        ort = runners.run_ort(for_ort(model)[0], feeds)
        ref = runners.run_reference(model, feeds)
    except runners.RuntimeFailure as e:
        return [f"the original's own distance from its spec not measured: {e}"]
    steps = against.output_steps(model)
    lines = []
    for name, want in ref.items():
        if name not in ort:
            continue
        c = compare.compare(name, ort[name], want, step=steps.get(name))
        size = (f"{c.max_steps:g} step(s)" if c.max_steps is not None
                else f"max abs {c.max_abs:.6g}")
        lines.append(f"the original's own output '{name}' on onnxruntime here is {size} "
                     "from its spec" if c.mismatched else
                     f"the original's own output '{name}' on onnxruntime here is its spec")
    return lines


def keep_out(comparisons: Sequence[against.RuntimeComparison],
             found: Sequence[PathDeviation], notes: list[str]
             ) -> tuple[against.RuntimeComparison, ...]:
    """onnxruntime's differing outputs passed with the deviation as the reason, where the
    reference evaluator compared the models (it then decides); a note says so."""
    if not found or not any(c.runtime == "reference" and c.skipped is None
                            for c in comparisons):
        return tuple(comparisons)
    reason = "; ".join(describe(found)) + " (a known deviation from the spec: the " \
        "reference evaluator decides)"
    out, count = against.tolerate(comparisons, reason, runtime="onnxruntime")
    if count:
        notes.append(f"onnxruntime: {count} output(s) differ where {reason}")
    return out

"""``check`` of one model on its own: structure, then every DequantizeLinear's numbers.

Structure: onnx's checker (full check) and dqtool's own rules (the codecs' problems).
Numbers: every main-graph DequantizeLinear's inputs and output become extra graph outputs
of one onnxruntime run; the kernel recomputes each output from onnxruntime's own inputs
and the two must be bit-identical. When onnxruntime cannot run the whole model, each node
runs alone (inputs from dqtool's reference evaluator); a node onnxruntime cannot run at all
is computed by the kernel alone, and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import codecs, graph, types
from dqtool.checking import compare, runners, single_node
from dqtool.checking.models import for_ort, with_outputs
from dqtool.graph import Site
from dqtool.messages import one_line
from dqtool.spec import QuantSpec

BIT_EXACT, MISMATCH, KERNEL_ONLY, SKIPPED, ERROR = (
    "bit-exact", "mismatch", "kernel-only", "skipped", "error")


@dataclass(frozen=True)
class NodeCheck:
    name: str
    graph: str
    op: str  # "ai.onnx:DequantizeLinear-21" (spec.op_id)
    status: str  # one of BIT_EXACT, MISMATCH, KERNEL_ONLY, SKIPPED, ERROR
    reason: str | None = None
    comparison: compare.OutputComparison | None = None

    @property
    def passed(self) -> bool:
        return self.status in (BIT_EXACT, KERNEL_ONLY, SKIPPED)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "graph": self.graph, "op": self.op, "status": self.status,
                "passed": self.passed, "reason": self.reason,
                "comparison": None if self.comparison is None else self.comparison.to_json()}


@dataclass(frozen=True)
class Structure:
    onnx_checker: str | None  # None when it passed, else its first line
    problems: tuple[dict[str, str], ...]  # dqtool's rules, every severity

    @property
    def passed(self) -> bool:
        return self.onnx_checker is None and not any(
            p["severity"] == "error" for p in self.problems)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "onnx_checker": self.onnx_checker or "passed",
                "problems": list(self.problems)}


def structure(proto: onnx.ModelProto, sites: list[tuple[Site, QuantSpec]],
              path: Path | None = None) -> Structure:
    """``path``: check the file instead of ``proto`` (a model past protobuf's 2 GB limit
    must be given to onnx's checker as a path)."""
    try:
        onnx.checker.check_model(proto if path is None else str(path), full_check=True)
        checker = None
    except Exception as e:  # checker and shape inference raise several types
        checker = one_line(e, 300)
    problems = tuple(
        {"node": s.node.name or "", "graph": s.graph, "code": p.code,
         "severity": p.severity, "message": p.message}
        for s, spec in sites for p in spec.problems)
    return Structure(checker, problems)


def quant_sites(model: ir.Model) -> list[tuple[Site, QuantSpec]]:
    return [(s, codecs.read_node(s.node, s.opsets)) for s in graph.walk(model)
            if codecs.is_quant_node(s.node)]


def numeric(proto: onnx.ModelProto, model: ir.Model, sites: list[tuple[Site, QuantSpec]],
            feeds: Mapping[str, np.ndarray], notes: list[str],
            external_dir: Path | None = None) -> list[NodeCheck]:
    """``external_dir``: where the model's external tensors stay (None: in ``proto``)."""
    dqs = [(s, spec) for s, spec in sites if spec.is_dequantize]
    main = [(s, spec) for s, spec in dqs if s.graph == "main"]
    to_ort, to_ref = _exposable(main)
    ort_values: dict[str, np.ndarray] = {}
    ort_model, note = for_ort(with_outputs(proto, to_ort))
    if note:
        notes.append(note)
    try:
        ort_values = runners.run_ort(ort_model, feeds, [o.name for o in ort_model.graph.output],
                                     external_dir=external_dir)
    except runners.RuntimeFailure as e:
        notes.append(f"onnxruntime cannot run the whole model ({e}); each DequantizeLinear "
                     "ran alone, its inputs from dqtool's reference evaluator")
        to_ref, to_ort = to_ref + to_ort, []
    ref_values: dict[str, np.ndarray] = {}
    if to_ref:
        try:
            ref_values = runners.run_reference(with_outputs(proto, to_ref), feeds, to_ref,
                                               external_dir=external_dir)
        except runners.RuntimeFailure as e:
            notes.append(f"dqtool's reference evaluator cannot run the model ({e}); only "
                         "DequantizeLinear nodes with constant inputs were checked")
    return [_check_node(s, spec, ort_values, ref_values, model.ir_version) for s, spec in dqs]


# onnxruntime's Python API hands these back as raw bytes or not at all.
_NO_NUMPY_IN_ORT = frozenset({"int4", "uint4", "int2", "uint2", "float4e2m1", "float6e2m3",
                              "float6e3m2", "float8e8m0", "bfloat16"}) | types.FLOAT8


def _exposable(main: list[tuple[Site, QuantSpec]]) -> tuple[list[str], list[str]]:
    """Names of the non-constant values main-graph DQs read or write: those onnxruntime
    can return, and those that must come from the reference evaluator. A DQ of constants
    (a weight) is left out: it runs alone on both, so a model's dequantized weights are
    never all held at once (a 2.4 GB model's took 15 GB as outputs of one run)."""
    to_ort: list[str] = []
    to_ref: list[str] = []
    for site, _ in main:
        node = site.node
        if all(v is None or graph.constant_tensor(v) is not None for v in node.inputs):
            continue
        for v in [*node.inputs, *node.outputs[:1]]:
            if v is None or graph.constant_tensor(v) is not None or v.name in to_ort + to_ref:
                continue
            (to_ref if graph.elem_type(v) in _NO_NUMPY_IN_ORT else to_ort).append(v.name)
    return to_ort, to_ref


def _check_node(site: Site, spec: QuantSpec, ort_values: dict[str, np.ndarray],
                ref_values: dict[str, np.ndarray], ir_version: int) -> NodeCheck:
    node = site.node
    base = {"name": node.name or "", "graph": site.graph, "op": spec.op_id}
    if single_node.has_reference_attributes(node):
        return NodeCheck(**base, status=SKIPPED,
                         reason="attributes refer to the calling node's; cannot run alone")
    inputs: list[np.ndarray | None] = []
    from_ort = True  # every input as onnxruntime computed it in the whole-model run
    for v in node.inputs:
        const = graph.constant_array(v)
        if v is None or const is not None:
            inputs.append(const)
        elif v.name in ort_values:
            inputs.append(ort_values[v.name])
        elif v.name in ref_values:
            inputs.append(ref_values[v.name])
            from_ort = False
        else:
            where = "is inside a subgraph or function" if site.graph != "main" else \
                "could not be computed"
            return NodeCheck(**base, status=SKIPPED, reason=f"input '{v.name}' {where}; it "
                             "cannot be exposed as a graph output")
    alone = single_node.build(node, inputs, site.opsets, ir_version)
    try:
        kernel = runners.run_reference(alone, {}, ["y"])["y"]
    except runners.RuntimeFailure as e:
        return NodeCheck(**base, status=ERROR, reason=f"the kernel failed: {e}")
    y = node.outputs[0].name
    if from_ort and y in ort_values:
        ort_y = ort_values[y]
    else:
        try:
            ort_y = runners.run_ort(alone, {}, ["y"])["y"]
        except runners.RuntimeFailure as e:
            return NodeCheck(**base, status=KERNEL_ONLY,
                             reason=f"onnxruntime cannot run this node: {e}")
    if compare.bit_identical(kernel, ort_y):
        return NodeCheck(**base, status=BIT_EXACT)
    stats = compare.compare(y, kernel, ort_y)
    return NodeCheck(**base, status=MISMATCH, comparison=stats,
                     reason=f"kernel and onnxruntime differ in {stats.mismatched} of "
                     f"{stats.size} elements (worst at {stats.worst_index}: kernel "
                     f"{stats.worst_actual!r}, onnxruntime {stats.worst_expected!r})")

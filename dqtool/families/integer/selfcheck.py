"""``dqtool check MODEL`` for integer operators: every main-graph integer operator the
reference evaluator runs is recomputed by the kernel from onnxruntime's own inputs (one
whole-model run exposes them) and must be bit-identical to onnxruntime's output.

A node onnxruntime cannot run is computed by the kernel alone (``kernel-only``); an
operator the kernel has no implementation of (DynamicQuantizeLSTM, QAttention, ...) is
``skipped`` with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph
from dqtool.checking import runners, single_node
from dqtool.checking.models import for_ort, with_outputs
from dqtool.checking.selfcheck import SKIPPED, NodeCheck, judge_alone
from dqtool.families.integer import describe, ops


def _has_kernel(node: ir.Node) -> bool:
    from dqtool.families.integer.evaluator_ops import EVALUATOR_OPS

    domain = "" if node.domain in graph.DEFAULT_DOMAINS else node.domain
    return any(op.__name__ == node.op_type and op.op_domain == domain for op in EVALUATOR_OPS)


def numeric(proto: onnx.ModelProto, model: ir.Model, feeds: Mapping[str, np.ndarray],
            notes: list[str], external_dir: Path | None = None) -> list[NodeCheck]:
    sites = [s for s in graph.walk(model) if s.graph == "main" and describe.is_integer_op(s.node)]
    if not sites:
        return []
    exposed: list[str] = []
    for s in sites:
        for v in [*s.node.inputs, *s.node.outputs[:1]]:
            if v is not None and graph.constant_tensor(v) is None and v.name not in exposed:
                exposed.append(v.name)
    ort_model, note = for_ort(with_outputs(proto, exposed))
    if note:
        notes.append(note)
    values: dict[str, np.ndarray] = {}
    from_ort = True
    try:
        values = runners.run_ort(ort_model, feeds, [o.name for o in ort_model.graph.output],
                                 external_dir=external_dir)
    except runners.RuntimeFailure as e:
        from_ort = False
        notes.append(f"onnxruntime cannot run the whole model ({e}); each integer operator "
                     "ran alone, its inputs from dqtool's reference evaluator")
        try:
            values = runners.run_reference(with_outputs(proto, exposed), feeds, exposed,
                                           external_dir=external_dir)
        except runners.RuntimeFailure as e2:
            notes.append(f"dqtool's reference evaluator cannot run the model ({e2}); integer "
                         "operators were not checked")
    return [_check(s, values, from_ort, model.ir_version) for s in sites]


def _check(site: graph.Site, values: dict[str, np.ndarray], from_ort: bool,
           ir_version: int) -> NodeCheck:
    node = site.node
    opdef = ops.lookup(graph.domain_name(node.domain), node.op_type)
    version = graph.opset_of(site.opsets, node.domain) or 1
    base = {"name": node.name or "", "graph": site.graph,
            "op": f"{opdef.domain}:{opdef.op}-{version}" if opdef else node.op_type}
    if not _has_kernel(node):
        return NodeCheck(**base, status=SKIPPED, reason="dqtool's kernel has no "
                         f"implementation of {node.op_type}")
    inputs: list[np.ndarray | None] = []
    for v in node.inputs:
        const = graph.constant_array(v)
        if v is None or const is not None:
            inputs.append(const)
        elif v.name in values:
            inputs.append(values[v.name])
        else:
            return NodeCheck(**base, status=SKIPPED, reason=f"input '{v.name}' could not be "
                             "computed")
    alone = single_node.build(node, inputs, site.opsets, ir_version)
    if len(node.outputs) > 1:  # DynamicQuantizeLinear: its quantized output is compared
        alone.graph.node[0].output.extend(f"unused{i}" for i in range(1, len(node.outputs)))
    y = node.outputs[0].name
    return judge_alone(alone, y, base, values.get(y) if from_ort else None,
                       integer_steps=True)

"""``dqtool check MODEL`` for integer operators: every main-graph integer operator the
reference evaluator runs is recomputed by the kernel from onnxruntime's own inputs (one
whole-model run exposes them) and must be bit-identical to onnxruntime's output.

A node onnxruntime cannot run is computed by the kernel alone (``kernel-only``); an
operator the kernel has no implementation of is ``skipped`` with the reason. An output
with a stated float tolerance (``ort_facts.FLOAT_TOLERANCE``) that is not bit-identical
passes as ``within-tolerance`` when it is within it, and the report gives the ulps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph
from dqtool.checking import compare, runners, single_node
from dqtool.checking.models import for_ort, with_outputs
from dqtool.checking.selfcheck import (
    BIT_EXACT,
    DEVIATION,
    MISMATCH,
    SKIPPED,
    WITHIN,
    NodeCheck,
    judge_alone,
)
from dqtool.families.integer import describe, lstm, ops, ort_facts


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
        for v in [*s.node.inputs, *s.node.outputs]:
            if (v is not None and v.name and graph.constant_tensor(v) is None
                    and v.name not in exposed):
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


def _compared(node: ir.Node) -> tuple[int, ir.Value | None]:
    """The index of the output a check compares, and its value: the first the node has."""
    for i, v in enumerate(node.outputs):
        if v is not None and v.name:
            return i, v
    return 0, None


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
    # The first output the node has decides the status (DynamicQuantizeLinear: its
    # quantized output; a DynamicQuantizeLSTM without Y: Y_h); every other output it has
    # must then be bit-identical too. Absent outputs stay absent: their presence can change
    # what the operator computes (an LSTM without Y).
    index = _compared(node)[0]
    names = {i: "y" if i == index else f"out{i}" for i, v in enumerate(node.outputs)
             if v is not None and v.name}
    del alone.graph.node[0].output[:]
    alone.graph.node[0].output.extend(names.get(i, "") for i in range(len(node.outputs)))
    alone.graph.output.extend(onnx.ValueInfoProto(name=n) for i, n in names.items()
                              if i != index)
    y = node.outputs[index].name
    ort_y = values.get(y) if from_ort else None
    result = judge_alone(alone, "y", base, ort_y, integer_steps=True)
    threads = 1
    if result.status == MISMATCH and node.op_type == "DynamicQuantizeLSTM":
        result, threads = _lstm_thread_groups(result, alone, ort_y) or (result, 1)
    elif result.status == MISMATCH:
        result = _within_tolerance(result, alone, node.op_type, index, ort_y) or result
    if result.status in (BIT_EXACT, WITHIN) and len(names) > 1:
        differs = _other_outputs(node, names, index, alone, values, from_ort, threads)
        if differs:
            result = NodeCheck(**base, status=MISMATCH, reason=differs)
    if result.status == MISMATCH and opdef is not None:
        return _path_deviation(result, f"{opdef.domain}:{opdef.op}") or result
    return result


def _path_deviation(result: NodeCheck, op: str) -> NodeCheck | None:
    """A mismatch that onnxruntime's release makes on this CPU's code path (an entry of
    ``dqtool.runtimes.code_paths``): reported with its size, and passed, since the kernel
    computes the specification and the verdict must not depend on the machine."""
    from dqtool.runtimes import code_paths, cpu_path
    from dqtool.runtimes.onnxruntime import installed_version

    version = installed_version()
    path = cpu_path.probe()
    found = code_paths.applicable("onnxruntime", version or "", path.name, op)
    if not found:
        return None
    c = result.comparison
    size = "" if c is None else (f": {c.mismatched} of {c.size} elements differ"
                                 + ("" if c.max_steps is None else
                                    f", at most {c.max_steps:g} step(s) from the spec"))
    what = "; ".join(d.describe(version or "", path.description) for d in found)
    return NodeCheck(name=result.name, graph=result.graph, op=result.op, status=DEVIATION,
                     comparison=c, reason=f"{what}{size} (known deviation, not counted)")


def _other_outputs(node: ir.Node, names: dict[int, str], index: int,
                   alone: onnx.ModelProto, values: dict[str, np.ndarray], from_ort: bool,
                   threads: int) -> str | None:
    """Why an output other than the first differs from onnxruntime's, or None."""
    others = {i: n for i, n in names.items() if i != index}
    token = lstm.THREADS.set(threads)
    try:
        kernel = runners.run_reference(alone, {}, list(others.values()))
    except runners.RuntimeFailure as e:
        return f"the kernel failed on the other outputs: {e}"
    finally:
        lstm.THREADS.reset(token)
    want = {n: values.get(node.outputs[i].name) if from_ort else None
            for i, n in others.items()}
    if any(v is None for v in want.values()):
        try:
            want = runners.run_ort(alone, {}, list(others.values()))
        except runners.RuntimeFailure:
            return None  # onnxruntime cannot run the node: the first output said so
    for i, n in others.items():
        if not compare.bit_identical(kernel[n], want[n]):
            k, w = np.asarray(kernel[n]), np.asarray(want[n])
            count = int(np.sum(k != w)) if k.shape == w.shape else k.size
            return (f"output {i} ('{node.outputs[i].name}') differs from onnxruntime's in "
                    f"{count} of {w.size} elements (the first output is bit-identical)")
    return None


def _lstm_thread_groups(result: NodeCheck, alone: onnx.ModelProto,
                        ort_y: np.ndarray | None) -> tuple[NodeCheck, int] | None:
    """onnxruntime quantizes an LSTM's hidden state per group of batch rows, one group per
    thread of its session (``lstm.py``): a result that differs from the one-thread kernel
    is compared with the kernel for each thread count this machine could have used."""
    if ort_y is None:
        try:
            ort_y = runners.run_ort(alone, {}, ["y"])["y"]
        except runners.RuntimeFailure:
            return None
    x = next((t for t in alone.graph.initializer if t.name == "in0"), None)
    batch = int(x.dims[1]) if x is not None and len(x.dims) == 3 else 0
    seen: set[int] = {batch}  # one group of every row: the one-thread result
    for threads in range(2, (os.cpu_count() or 1) + 1):
        rows = -(-batch // threads)
        if rows in seen:
            continue  # the same grouping as a thread count already tried
        seen.add(rows)
        token = lstm.THREADS.set(threads)
        try:
            kernel = runners.run_reference(alone, {}, ["y"])["y"]
        except runners.RuntimeFailure:
            return None
        finally:
            lstm.THREADS.reset(token)
        if compare.bit_identical(kernel, ort_y):
            return NodeCheck(name=result.name, graph=result.graph, op=result.op,
                             status=BIT_EXACT, reason=f"with onnxruntime's grouping of the "
                             f"batch rows for {threads} threads (the hidden state is "
                             "quantized per group)"), threads
    return None


def _within_tolerance(result: NodeCheck, alone: onnx.ModelProto, op: str, output: int,
                      ort_y: np.ndarray | None) -> NodeCheck | None:
    """A float output of an operator with a stated tolerance (``ort_facts``): within it,
    the node passes and the report says by how much it differs."""
    from dqtool.runtimes.onnxruntime import installed_version, release_of

    version = installed_version()
    release = release_of(version) if version else None
    tol = ort_facts.tolerance(op, output, release)
    if tol is None:
        return None
    try:
        kernel = runners.run_reference(alone, {}, ["y"])["y"]
        if ort_y is None:
            ort_y = runners.run_ort(alone, {}, ["y"])["y"]
    except runners.RuntimeFailure:
        return None
    if kernel.dtype != np.float32 or ort_y.dtype != np.float32 or kernel.shape != ort_y.shape:
        return None
    worst = ort_facts.row_ulps(kernel, ort_y)
    if worst > tol.ulps:
        return None
    where = "" if release in tol.releases else (
        f"; onnxruntime {version} not measured, the largest stated tolerance applies")
    return NodeCheck(name=result.name, graph=result.graph, op=result.op, status=WITHIN,
                     comparison=result.comparison,
                     reason=f"within {worst:g} ulps (float activations): stated tolerance "
                     f"{tol.ulps} ulps for onnxruntime {tol.measured}{where}")

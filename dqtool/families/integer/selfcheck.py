"""``dqtool check MODEL`` for integer operators: every main-graph integer operator the
reference evaluator runs is recomputed by the kernel from onnxruntime's own inputs (one
whole-model run exposes them) and must be bit-identical to onnxruntime's output.

A node onnxruntime cannot run is computed by the kernel alone (``kernel-only``); an
operator the kernel has no implementation of is ``skipped`` with the reason. An output
with a stated float tolerance (``ort_facts.FLOAT_TOLERANCE``) that is not bit-identical
passes as ``within-tolerance`` when it is within it, and the report gives the ulps.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph
from dqtool.checking import compare, path_deviations, runners, single_node
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
from dqtool.families.integer import describe, kernel, lstm, ops, ort_facts
from dqtool.families.integer.evaluator_ops import EVALUATOR_OPS
from dqtool.runtimes import code_paths
from dqtool.runtimes.onnxruntime import installed_version, release_of


def _has_kernel(node: ir.Node) -> bool:
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
        return _path_deviation(result, f"{opdef.domain}:{opdef.op}", alone) or result
    return result


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


def _path_deviation(result: NodeCheck, op: str, alone: onnx.ModelProto) -> NodeCheck | None:
    """A mismatch that onnxruntime's release makes on this CPU's code path (an entry of
    ``dqtool.runtimes.code_paths``), shown to be that deviation: the node rerun with the
    entry's emulation in the kernel's place gives onnxruntime's outputs bit for bit (or
    within the entry's ulps). It is reported with its size and passed, since the kernel
    computes the specification and the verdict must not depend on the machine; a mismatch
    the entry does not explain stays a mismatch."""
    found = path_deviations.for_op(op)
    if not found or not _explained(found, alone):
        return None
    c = result.comparison
    size = "" if c is None else (f": {c.mismatched} of {c.size} elements differ"
                                 + ("" if c.max_steps is None else
                                    f", at most {c.max_steps:g} step(s) from the spec"))
    what = "; ".join(path_deviations.describe(found))
    return NodeCheck(name=result.name, graph=result.graph, op=result.op, status=DEVIATION,
                     comparison=c, reason=f"{what}{size} (known deviation, reproduced by "
                     "its emulation; not counted)")


def _explained(found: tuple, alone: onnx.ModelProto) -> bool:
    """Whether the node's every output on onnxruntime is what the entries say."""
    names = [o.name for o in alone.graph.output]
    try:
        want = runners.run_ort(alone, {}, names)
        with emulating(any(d.key == "u8s8-pair-saturation" for d in found)):
            got = runners.run_reference(alone, {}, names)
    except runners.RuntimeFailure:
        return False
    ulps = max((d.ulps or 0 for d in found), default=0)
    steps = max((d.steps or 0 for d in found), default=0)
    for n in names:
        if compare.bit_identical(got[n], want[n]):
            continue
        g, w = np.asarray(got[n]), np.asarray(want[n])
        if g.dtype.kind in "iu" and g.shape == w.shape and steps and int(np.max(np.abs(
                g.astype(np.int64) - w.astype(np.int64)))) <= steps:
            continue  # integer codes within the entry's steps (ties on arm64-dotprod)
        if not ulps or g.dtype != np.float32 or ort_facts.row_ulps(g, w) > ulps:
            return False
    return True


def emulations() -> dict[str, object]:
    """The kernel's integer GEMM, QLinearConv's convolution and ConvInteger as onnxruntime
    computes them on a path with ``u8s8-pair-saturation`` (u8 × s8 operands emulated;
    ConvInteger is exact there, as measured), by the kernel module's names."""
    exact_mm, exact_conv = kernel.integer_matmul, kernel.integer_conv

    def u8s8(a: np.ndarray, b: np.ndarray) -> bool:
        return np.asarray(a).dtype == np.uint8 and np.asarray(b).dtype == np.int8

    def matmul(a, a_zp, b, b_zp):
        if not u8s8(a, b):
            return exact_mm(a, a_zp, b, b_zp)
        return code_paths.u8s8_matmul(a, b, a_zp, b_zp).astype(np.int64)

    def conv(x, x_zp, w, w_zp, attrs):
        if not u8s8(x, w) or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
            return exact_conv(x, x_zp, w, w_zp, attrs)
        return code_paths.u8s8_conv(
            x, w, x_zp, w_zp, group=int(attrs.get("group", 1)), pads=attrs.get("pads"),
            strides=attrs.get("strides"), dilations=attrs.get("dilations")).astype(np.int64)

    def conv_integer(x, w, x_zp=None, w_zp=None, **attrs):
        return exact_conv(x, x_zp, w, w_zp, kernel._conv_attrs(attrs)).astype(np.int32)

    return {"integer_matmul": matmul, "integer_conv": conv, "conv_integer": conv_integer}


@contextlib.contextmanager
def emulating(u8s8: bool) -> Iterator[None]:
    """``emulations()`` in the kernel's place while the block runs: to explain
    onnxruntime's result on such a path, never to compute a verdict's reference."""
    if not u8s8:
        yield
        return
    saved = {name: getattr(kernel, name) for name in ("integer_matmul", "integer_conv",
                                                      "conv_integer")}
    for name, fn in emulations().items():
        setattr(kernel, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(kernel, name, fn)

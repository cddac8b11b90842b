"""``check`` of one model on its own: structure, then every DequantizeLinear's numbers.

Structure: onnx's checker (full check) and dqtool's own rules (the codecs' problems).
Numbers: every main-graph DequantizeLinear's inputs and output become extra graph outputs
of one onnxruntime run; the kernel recomputes each output from onnxruntime's own inputs
and the two must be bit-identical. When onnxruntime cannot run the whole model, each node
runs alone (inputs from dqtool's reference evaluator); a node onnxruntime cannot run at all
is computed by the kernel alone, and the report says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import codecs, graph, registry, types
from dqtool.checking import compare, runners, single_node, slices
from dqtool.checking.models import for_ort, qdq_value_bytes, with_outputs
from dqtool.graph import Site
from dqtool.messages import one_line
from dqtool.spec import QuantSpec

BIT_EXACT, MISMATCH, KERNEL_ONLY, SKIPPED, ERROR = (
    "bit-exact", "mismatch", "kernel-only", "skipped", "error")
# A float output within the tolerance its family states for the installed runtime
# (an integer operator's float activations); the reason gives the measured difference.
WITHIN = "within-tolerance"
# onnxruntime differs from the kernel (the spec) where an entry of
# ``dqtool.runtimes.code_paths`` keyed by its release and this CPU's path says it does: the
# reason names the entry and the size; the verdict is the spec's, the same on every CPU.
DEVIATION = "runtime-deviation"


@dataclass(frozen=True)
class NodeCheck:
    name: str
    graph: str
    op: str  # "ai.onnx:DequantizeLinear-21" (spec.op_id)
    status: str  # one of BIT_EXACT, WITHIN, DEVIATION, MISMATCH, KERNEL_ONLY, SKIPPED, ERROR
    reason: str | None = None
    comparison: compare.OutputComparison | None = None

    @property
    def passed(self) -> bool:
        return self.status in (BIT_EXACT, WITHIN, DEVIATION, KERNEL_ONLY, SKIPPED)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "graph": self.graph, "op": self.op, "status": self.status,
                "passed": self.passed, "reason": self.reason,
                "comparison": None if self.comparison is None else self.comparison.to_json()}


@dataclass(frozen=True)
class Structure:
    onnx_checker: str | None  # None when it passed, else its first line
    problems: tuple[dict[str, str], ...]  # dqtool's rules, every severity
    # Why the checker's type inference did not count (None: it ran and counted): it stopped
    # at operators onnx has no schema for, and the checker passed without it.
    inference: str | None = None
    # With --against, where the original fails too: its first problem (a conversion
    # carries an invalid node over; the check judges the conversion, so not counted)
    inherited: str | None = None

    @property
    def valid(self) -> bool:
        return self.onnx_checker is None and not any(
            p["severity"] == "error" for p in self.problems)

    @property
    def passed(self) -> bool:
        return self.valid or self.inherited is not None

    def first_problem(self) -> str | None:
        if self.onnx_checker is not None:
            return f"onnx checker: {self.onnx_checker}"
        errors = [p for p in self.problems if p["severity"] == "error"]
        return f"{errors[0]['code']} {errors[0]['node']}: {errors[0]['message']}" \
            if errors else None

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "onnx_checker": self.onnx_checker or "passed",
                "onnx_inference": self.inference or "passed", "problems": list(self.problems),
                "inherited": self.inherited}


def structure(proto: onnx.ModelProto, sites: list[tuple[Site, QuantSpec]],
              path: Path | None = None) -> Structure:
    """``path``: check the file instead of ``proto`` (a model past protobuf's 2 GB limit
    must be given to onnx's checker as a path).

    A type-inference error does not fail a model that holds operators onnx has no schema
    for (onnxruntime's com.microsoft ones) when every node it names reads a value
    computed from such an operator's output and the checker passes without inference:
    onnx cannot type those values, so inference stops at the first operator reading one
    (a MatMulNBits inside a function left the function's outputs untyped, and the Add
    after its call failed a model onnxruntime runs). It is reported as not counted. An
    error at any other node (an Add of float and int64 beside a MatMulNBits) fails."""
    target = proto if path is None else str(path)
    inference = None
    try:
        onnx.checker.check_model(target, full_check=True)
        checker = None
    except Exception as e:  # checker and shape inference raise several types
        checker = one_line(e, 300)
        unknown = schemaless_ops(proto)
        if unknown and "InferenceError" in type(e).__name__ \
                and _downstream_of_schemaless(proto, str(e)):
            try:
                onnx.checker.check_model(target)
            except Exception as e2:
                checker = one_line(e2, 300)
            else:
                inference = (f"not counted: onnx has no schema for {', '.join(unknown[:3])}"
                             f"{' …' if len(unknown) > 3 else ''}, whose outputs it cannot "
                             f"type ({checker})")
                checker = None
    problems = tuple(
        {"node": s.node.name or "", "graph": s.graph, "code": p.code,
         "severity": p.severity, "message": p.message}
        for s, spec in sites for p in spec.problems)
    return Structure(checker, problems, inference)


# "(op_type:Add, node name: add1)", or "(op_type:Relu)" for a node without a name
_FAILED_NODE = re.compile(r"\(op_type:([^,)]*)(?:, node name: ([^)]*))?\)")


def _downstream_of_schemaless(proto: onnx.ModelProto, message: str) -> bool:
    """Every node an inference error names reads a value computed from the output of an
    operator onnx has no schema for (directly, through other nodes, or through a call of
    a local function holding one); False when it names none, or a node not found. A node
    without a name is named by its operator: every unnamed node of it must read one."""
    failing = {(op, name or "") for op, name in _FAILED_NODE.findall(message)}
    if not failing:
        return False
    functions = {(f.domain, f.name): f for f in proto.functions}
    untyped_fns: set[tuple[str, str]] = set()
    changed = True
    while changed:  # a function holding one, or calling a function that does
        changed = False
        for key, f in functions.items():
            if key not in untyped_fns and any(_opaque(n, functions, untyped_fns)
                                              for n, _ in _all_nodes(f.node)):
                untyped_fns.add(key)
                changed = True
    untyped: set[str] = set()
    reads: dict[tuple[str, str], bool] = {}  # failing (op, name) → each reads an untyped one
    for body in [proto.graph.node, *(f.node for f in proto.functions)]:
        for n, outer in _all_nodes(body):
            tainted = _opaque(n, functions, untyped_fns) or any(i in untyped for i in n.input)
            key = (n.op_type, n.name)
            if key in failing:
                reads[key] = reads.get(key, True) and any(i in untyped for i in n.input)
            if tainted:  # and the outputs of the nodes whose subgraph holds it
                for m in (n, *outer):
                    untyped.update(o for o in m.output if o)
    return set(reads) == failing and all(reads.values())


def _opaque(node: onnx.NodeProto, functions: dict, untyped_fns: set) -> bool:
    """onnx cannot type this node's outputs: no schema, or a call of a function that
    holds such a node."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if (node.domain, node.op_type) in functions:
        return (node.domain, node.op_type) in untyped_fns
    return not onnx.defs.has(node.op_type, domain)


def _all_nodes(nodes) -> list[tuple[onnx.NodeProto, tuple[onnx.NodeProto, ...]]]:
    """(node, the nodes whose subgraphs hold it, innermost first) for the nodes and, right
    after each, those of its subgraphs: before anything that reads the node's outputs.
    Iterative: the nesting depth is the file's."""
    out: list[tuple[onnx.NodeProto, tuple[onnx.NodeProto, ...]]] = []
    stack: list[tuple[Iterator[onnx.NodeProto], tuple[onnx.NodeProto, ...]]] = [
        (iter(nodes), ())]
    while stack:
        it, outer = stack[-1]
        node = next(it, None)
        if node is None:
            stack.pop()
            continue
        out.append((node, outer))
        subgraphs = [a.g for a in node.attribute if a.HasField("g")] + \
            [g for a in node.attribute for g in a.graphs]
        for g in reversed(subgraphs):
            stack.append((iter(g.node), (node, *outer)))
    return out


def schemaless_ops(proto: onnx.ModelProto) -> list[str]:
    """``domain:op`` of every operator the model uses that onnx has no schema for and no
    model-local function defines (sorted, once each)."""
    functions = {(f.domain, f.name): f for f in proto.functions}
    return sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}"
                   for body in [proto.graph.node, *(f.node for f in proto.functions)]
                   for n, _ in _all_nodes(body)
                   if (n.domain, n.op_type) not in functions and _opaque(n, functions, set())})


def quant_sites(model: ir.Model) -> list[tuple[Site, QuantSpec]]:
    return [(s, codecs.read_node(s.node, s.opsets)) for s in graph.walk(model)
            if codecs.is_quant_node(s.node)]


def family_spec_sites(model: ir.Model) -> list[tuple[Site, Any]]:
    """(site, spec) of the other nodes a family reads into a spec with problems (the fused
    operators): their problems are dqtool's rules too (inspect and lint report them)."""
    supports = registry.inspect_supports()
    out: list[tuple[Site, Any]] = []
    for s in graph.walk(model):
        if codecs.is_quant_node(s.node):
            continue
        for support in supports:
            spec = getattr(support.node(s.node, s.opsets, s.graph), "spec", None)
            if spec is not None and hasattr(spec, "problems"):
                out.append((s, spec))
                break
    return out


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
        # Only values of non-constant DQs are taken from the whole-model run: a large
        # model without any is not run whole (it would dequantize every weight).
        held = qdq_value_bytes(proto)
        if not to_ort and held > WHOLE_RUN_MAX_BYTES:
            notes.append(f"the whole model was not run on onnxruntime: it would hold about "
                         f"{held / 2**30:.2f} GiB of dequantized weights, and every "
                         "DequantizeLinear reads constants (each is checked alone)")
        else:
            ort_values = runners.run_ort(ort_model, feeds,
                                         [o.name for o in ort_model.graph.output],
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
    # A large weight is read a band at a time, never whole (``slices``).
    weight = slices.weight(node, spec, PIECE_BYTES)
    inputs: list[np.ndarray | None] = []
    from_ort = True  # every input as onnxruntime computed it in the whole-model run
    for i, v in enumerate(node.inputs):
        if i == 0 and weight is not None:
            inputs.append(None)
            continue
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
    if weight is not None:
        return _check_in_pieces(node, spec, base, weight, inputs, site.opsets, ir_version)
    alone = single_node.build(node, inputs, site.opsets, ir_version)
    y = node.outputs[0].name
    return judge_alone(alone, y, base, ort_values.get(y) if from_ort else None)


def kernel_failed(base: dict[str, str], e: runners.RuntimeFailure) -> NodeCheck:
    """A node the kernel does not implement (an attribute it refuses) is skipped with the
    reason; any other kernel failure is an error."""
    if e.unsupported:
        return NodeCheck(**base, status=SKIPPED, reason=f"not compared: {e}")
    return NodeCheck(**base, status=ERROR, reason=f"the kernel failed: {e}")


def judge_alone(alone: onnx.ModelProto, y: str, base: dict[str, str],
                ort_y: np.ndarray | None, integer_steps: bool = False) -> NodeCheck:
    """Run the one-node model ``alone`` on the kernel and compare it bit for bit with
    onnxruntime's output ``ort_y`` (from the whole-model run), or, when that is None, with
    onnxruntime running ``alone`` too. ``integer_steps``: a mismatch of an integer output
    is also measured in steps of 1."""
    try:
        kernel = runners.run_reference(alone, {}, ["y"])["y"]
    except runners.RuntimeFailure as e:
        return kernel_failed(base, e)
    if ort_y is None:
        try:
            ort_y = runners.run_ort(alone, {}, ["y"])["y"]
        except runners.RuntimeFailure as e:
            return NodeCheck(**base, status=KERNEL_ONLY,
                             reason=f"onnxruntime cannot run this node: {e}")
    if compare.bit_identical(kernel, ort_y):
        return NodeCheck(**base, status=BIT_EXACT)
    step = 1.0 if integer_steps and kernel.dtype.kind in "iu" else None
    stats = compare.compare(y, kernel, ort_y, step=step)
    return NodeCheck(**base, status=MISMATCH, comparison=stats,
                     reason=f"kernel and onnxruntime differ in {stats.mismatched} of "
                     f"{stats.size} elements (worst at {stats.worst_index}: kernel "
                     f"{stats.worst_actual!r}, onnxruntime {stats.worst_expected!r})")


# Past this many bytes of dequantized values, a model whose DequantizeLinears all read
# constants is not run whole (its nodes are checked alone anyway).
WHOLE_RUN_MAX_BYTES = 256 << 20

# A weight DequantizeLinear whose output passes this many bytes is checked slice by slice,
# so a check never holds a large weight's whole dequantized value.
PIECE_BYTES = 16 << 20


def _check_in_pieces(node: ir.Node, spec: QuantSpec, base: dict[str, str],
                     weight: slices.Weight, inputs: list[np.ndarray | None],
                     opsets: dict[str, int], ir_version: int) -> NodeCheck:
    """``inputs``: the node's scale and zero point (x is ``weight``, read band by band)."""
    for where, part in slices.parts(spec, weight, inputs[1:], PIECE_BYTES):
        alone = single_node.build(node, part, opsets, ir_version)
        try:
            kernel = runners.run_reference(alone, {}, ["y"])["y"]
        except runners.RuntimeFailure as e:
            return kernel_failed(base, e)
        try:
            ort_y = runners.run_ort(alone, {}, ["y"])["y"]
        except runners.RuntimeFailure as e:
            return NodeCheck(**base, status=KERNEL_ONLY,
                             reason=f"onnxruntime cannot run this node: {e}")
        if not compare.bit_identical(kernel, ort_y):
            stats = compare.compare(node.outputs[0].name, kernel, ort_y)
            return NodeCheck(**base, status=MISMATCH, comparison=stats,
                             reason=f"kernel and onnxruntime differ in {stats.mismatched} "
                             f"of {stats.size} elements of the slice at {where} (worst at "
                             f"{stats.worst_index} of the slice: kernel "
                             f"{stats.worst_actual!r}, onnxruntime {stats.worst_expected!r})")
        del kernel, ort_y, alone, part
    return NodeCheck(**base, status=BIT_EXACT)

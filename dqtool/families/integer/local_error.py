"""Per-op local error of a QDQ conversion: each converted operator fed the ORIGINAL's inputs.

End to end, a difference one converted operator makes is carried on by every operator after
it; in a dynamically quantized model each DynamicQuantizeLinear re-quantizes the slightly
different activations (a new scale, codes flipped at rounding boundaries), so the
differences grow with depth. That growth is a property of the model, not of one rewrite.
What a conversion controls is each operator's own error, measured here: one run of the
original on the reference evaluator (the specification: integer accumulation exact, on every
CPU) gives every operator's inputs and output; each converted region of the checked model
(its DequantizeLinear inputs, the float operator, a bias Add, the QuantizeLinear after it)
runs alone on the original's inputs, on the reference evaluator too, and its output is
compared with the original operator's output. onnxruntime's integer kernels differ by CPU
code path (``dqtool.runtimes.code_paths``), so they decide nothing here:

* a quantized output (QLinear*) in codes;
* a float output (MatMulInteger / ConvInteger → Cast → Mul, MatMulIntegerToFloat, ...) in
  its own dynamic quantization step (``dqtool.checking.float_steps``), and in float terms.

A converted operator is found by name: ``dqtool qdq`` gives the float operator the integer
operator's name. An unnamed integer operator's float operator is named ``<OpType>/...``
afresh; the rewrite keeps the graph's order, so the k-th unnamed operator of a type is the
k-th such float operator (or the k-th unnamed operator of that type left unconverted). An
operator with no counterpart is not measured (listed as skipped).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph
from dqtool.checking import compare, float_steps, runners
from dqtool.checking.models import with_outputs
from dqtool.families.integer import fused_back, ops
from dqtool.families.integer.rewrite import Refused
from dqtool.families.integer.scaled_pattern import scaled_output


@dataclass(frozen=True)
class LocalError:
    node: str
    op: str  # the original operator, "domain:op"
    into: str  # the converted region's operators, "DequantizeLinear ×2 → Conv → ..."
    comparison: compare.OutputComparison | None
    skipped: str | None = None

    @property
    def max_steps(self) -> float | int | None:
        return None if self.comparison is None else self.comparison.max_steps

    @property
    def beyond_one_step(self) -> bool:
        """Measured, with a step, and some element more than one step apart."""
        c = self.comparison
        return c is not None and c.within_one_step is False

    def to_json(self) -> dict[str, Any]:
        c = self.comparison
        return {"node": self.node, "op": self.op, "into": self.into, "skipped": self.skipped,
                "step": None if c is None else c.step,
                "max_steps": self.max_steps,
                "off_by_one": None if c is None else c.off_by_one,
                "off_by_more": None if c is None else c.off_by_more,
                "size": None if c is None else c.size,
                "max_abs": None if c is None else c.max_abs,
                "max_rel": None if c is None else c.max_rel}

    def describe(self) -> str:
        if self.comparison is None:
            return f"{self.node} ({self.op}): not measured: {self.skipped}"
        c = self.comparison
        steps = "no step" if c.max_steps is None else \
            f"max {c.max_steps} step(s) (step {c.step:.6g}), {c.off_by_one} of {c.size} " \
            f"about 1 step apart, {c.off_by_more} more"
        return f"{self.node} ({self.op} → {self.into}): {steps}; max abs {c.max_abs:.6g}"


@dataclass
class _Region:
    site_node: str
    op: str
    original_out: str
    nodes: list[ir.Node]
    out: ir.Value


def measure(original: onnx.ModelProto, converted: onnx.ModelProto,
            feeds: Mapping[str, np.ndarray], external_dir: Path | None = None
            ) -> list[LocalError]:
    """Every main-graph integer operator of ``original`` that ``converted`` holds in QDQ
    form, its converted region run alone on the original's inputs (the reference
    evaluator). Empty when the original has none."""
    orig = ir.serde.deserialize_model(original)
    conv = ir.serde.deserialize_model(converted)
    by_name = {n.name: n for n in conv.graph if n.name}
    unnamed = _unnamed_twins(orig.graph, conv.graph)
    regions: list[_Region] = []
    results: list[LocalError] = []
    for node in list(orig.graph):
        opdef = ops.lookup(graph.domain_name(node.domain), node.op_type)
        if opdef is None or opdef.op == "DynamicQuantizeLinear" or opdef.no_qdq:
            continue
        op = f"{opdef.domain}:{opdef.op}"
        label = node.name or f"<unnamed {node.op_type}>"
        out = _original_output(node, opdef)
        twin = by_name.get(node.name) if node.name else unnamed.get(id(node))
        if out is None or twin is None or twin.op_type != opdef.float_op:
            results.append(LocalError(label, op, "", None, "no converted counterpart "
                                      "(not rewritten, or renamed) in the checked model"))
            continue
        nodes, region_out = _region(twin, f"{node.name or node.op_type}/")
        regions.append(_Region(label, op, out.name, nodes, region_out))
    if not regions:
        return results
    # The converted model names a rewritten value afresh: map it to the original's.
    renamed = {r.out.name: r.original_out for r in regions}
    originals = {v.name for v in orig.graph.initializers.values()} | \
        {v.name for n in orig.graph for v in n.outputs} | {v.name for v in orig.graph.inputs}
    wanted: set[str] = set()
    plans = []
    for r in regions:
        feeds_from, missing = _inputs(r, renamed, originals)
        plans.append((r, feeds_from, missing))
        if missing is None:
            wanted |= {*feeds_from.values(), r.original_out}
    try:
        values = runners.run_reference(with_outputs(original, sorted(wanted)), feeds,
                                       sorted(wanted), external_dir=external_dir)
    except runners.RuntimeFailure as e:
        return results + [LocalError(r.site_node, r.op, _into(r.nodes), None,
                                     f"the reference evaluator cannot run the original: {e}")
                          for r in regions]
    for r, feeds_from, missing in plans:
        into = _into(r.nodes)
        if missing is not None:
            results.append(LocalError(r.site_node, r.op, into, None, missing))
            continue
        try:
            got = _run_region(r, conv, {k: values[v] for k, v in feeds_from.items()})
        except runners.RuntimeFailure as e:
            results.append(LocalError(r.site_node, r.op, into, None,
                                      f"the reference evaluator cannot run the region: {e}"))
            continue
        want = values[r.original_out]
        step: float | None = 1.0 if np.asarray(want).dtype.kind in "iu" else \
            float_steps.dynamic_step(want)
        results.append(LocalError(r.site_node, r.op, into,
                                  compare.compare(r.site_node, got, want, step=step)))
    return results


def _unnamed_twins(orig: ir.Graph, conv: ir.Graph) -> dict[int, ir.Node | None]:
    """Each unnamed integer operator of ``orig`` (by ``id``) to its float operator in
    ``conv`` (None when it was left unconverted), paired in graph order per op type."""
    pending: dict[tuple[str, str], list[ir.Node]] = {}
    for node in orig:
        opdef = ops.lookup(graph.domain_name(node.domain), node.op_type)
        if not node.name and opdef is not None and opdef.float_op:
            pending.setdefault((node.op_type, opdef.float_op), []).append(node)
    twins: dict[int, ir.Node | None] = {}
    for n in conv:
        for (op_type, float_op), queue in pending.items():
            left_as_is = not n.name and n.op_type == op_type
            converted = n.op_type == float_op and (n.name or "").startswith(f"{op_type}/")
            if queue and (left_as_is or converted):
                twins[id(queue.pop(0))] = n if converted else None
                break
    return twins


def _integer_count(m: onnx.ModelProto) -> int:
    return sum(ops.lookup(n.domain or "ai.onnx", n.op_type) is not None for n in m.graph.node)


def fused_for_check(checked: onnx.ModelProto, original: onnx.ModelProto,
                    feeds: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """``check --against``'s fused-back run, for a conversion to QDQ (the checked model
    holds fewer integer operators than the original): the checked model on onnxruntime
    with every optimization against the original on ``ORT_DISABLE_ALL``."""
    if _integer_count(checked) >= _integer_count(original):
        return None
    return fused_back.fused_run(original, checked, feeds)


def for_check(checked: onnx.ModelProto, original: onnx.ModelProto,
              feeds: Mapping[str, np.ndarray], original_dir: Path | None = None
              ) -> list[LocalError]:
    """``check --against``'s per-op section: measured only when the checked model holds
    fewer integer operators than the original (a conversion to QDQ)."""
    if _integer_count(checked) >= _integer_count(original):
        return []
    try:
        errors = measure(original, checked, feeds, original_dir)
    except Exception as e:  # a report section, never a crash of the whole check
        return [LocalError("<all>", "", "", None, f"per-op errors not measured: "
                           f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")]
    return [e for e in errors
            if e.comparison is not None or "no converted counterpart" not in (e.skipped or "")]


def _original_output(node: ir.Node, opdef: ops.OpDef) -> ir.Value | None:
    """The value the integer operator (with its ``Cast → Mul`` for MatMulInteger /
    ConvInteger) produces in the original."""
    if opdef.kind != "integer":
        return node.outputs[0]
    try:
        return scaled_output(node)
    except Refused:
        return None


def _region(float_op: ir.Node, prefix: str) -> tuple[list[ir.Node], ir.Value]:
    """The float operator and what ``dqtool qdq`` made around it (named ``prefix...``, the
    integer operator's name or, unnamed, its op type): the DequantizeLinear (and
    DynamicQuantizeLinear) nodes that feed it, a bias Add of a DequantizeLinear after it,
    or the QuantizeLinear after it."""

    def own(n: ir.Node | None, op: str) -> bool:
        return n is not None and n.op_type == op and (n.name or "").startswith(prefix)

    nodes = [float_op]
    for v in float_op.inputs:
        p = v.producer() if v is not None else None
        if own(p, "DequantizeLinear"):
            nodes.append(p)
            src = p.inputs[0].producer() if p.inputs[0] is not None else None
            if own(src, "DynamicQuantizeLinear"):
                nodes.append(src)  # DynamicQuantizeMatMul's own quantizer
    out = float_op.outputs[0]
    uses = list(out.uses())
    if len(uses) == 1 and not out.is_graph_output():
        nxt = uses[0].node
        if own(nxt, "Add"):
            nodes.append(nxt)
            for v in nxt.inputs:
                p = v.producer() if v is not None and v is not out else None
                if own(p, "DequantizeLinear"):
                    nodes.append(p)
            out = nxt.outputs[0]
        elif own(nxt, "QuantizeLinear"):
            nodes.append(nxt)
            out = nxt.outputs[0]
    # The exact dynamic form (``qdq --exact-dynamic``): DequantizeLinear with scale 1, then
    # the original's own Mul by the scale product, which the region ends with.
    uses = list(out.uses())
    if _unit_scaled(nodes) and len(uses) == 1 and not out.is_graph_output() and \
            uses[0].node.op_type == "Mul":
        nodes.append(uses[0].node)
        out = uses[0].node.outputs[0]
    return nodes, out


def _unit_scaled(nodes: list[ir.Node]) -> bool:
    dqs = [n for n in nodes if n.op_type == "DequantizeLinear"]
    for n in dqs:
        scale = graph.constant_array(n.inputs[1]) if len(n.inputs) > 1 else None
        if scale is None or not np.all(np.asarray(scale) == 1):
            return False
    return bool(dqs)


def _inputs(r: _Region, renamed: dict[str, str], originals: set[str]
            ) -> tuple[dict[str, str], str | None]:
    """Region input name → the original's value name that feeds it; or a reason."""
    produced = {v.name for n in r.nodes for v in n.outputs}
    out: dict[str, str] = {}
    for n in r.nodes:
        for v in n.inputs:
            if v is None or v.name in produced or graph.constant_array(v) is not None:
                continue
            src = renamed.get(v.name, v.name)
            if src not in originals:
                return out, f"input '{v.name}' has no counterpart in the original"
            out[v.name] = src
    return out, None


def _run_region(r: _Region, conv: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    order = {id(n): i for i, n in enumerate(conv.graph)}
    nodes = sorted(r.nodes, key=lambda n: order.get(id(n), 0))
    produced = {v.name for n in nodes for v in n.outputs}
    inits, seen = [], set()
    protos = []
    for n in nodes:
        for v in n.inputs:
            if v is None or v.name in produced or v.name in seen or v.name in feeds:
                continue
            arr = graph.constant_array(v)
            if arr is not None:
                seen.add(v.name)
                inits.append(onnx.numpy_helper.from_array(np.asarray(arr), v.name))
        protos.append(ir.serde.serialize_node(n))
    inputs = [onnx.helper.make_tensor_value_info(
        k, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), list(np.shape(a)))
        for k, a in feeds.items()]
    g = onnx.helper.make_graph(protos, "region", inputs, [onnx.ValueInfoProto(name=r.out.name)],
                               inits)
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid(d, v)
                                                 for d, v in conv.opset_imports.items()])
    m.ir_version = min(conv.ir_version, 10)
    return runners.run_reference(m, feeds, [r.out.name])[r.out.name]


def _into(nodes: list[ir.Node]) -> str:
    from collections import Counter

    counts = Counter(n.op_type for n in nodes)
    return ", ".join(f"{op} ×{c}" if c > 1 else op for op, c in counts.items())


def summary(errors: list[LocalError]) -> dict[str, Any]:
    measured = [e for e in errors if e.comparison is not None]
    steps = [e.max_steps for e in measured if e.max_steps is not None]
    return {"measured": len(measured), "skipped": len(errors) - len(measured),
            "max_steps": max(steps, default=None),
            "beyond_one_step": [e.node for e in measured if e.beyond_one_step]}


"""Every other ai.onnx op: a version step whose schemas differ only in allowed types leaves
the node unchanged (when its types are allowed on both sides); a real change goes through
onnx's version converter on a one-node model built for that node (never the whole model,
which it would materialize); what neither handles is refused by name.

"Only types differ" compares, per step: inputs and outputs (count and optionality),
attributes (name, type, default; a new attribute must be absent or at its default when
going down, and have a default when going up), and type constraints.
"""

from __future__ import annotations

import itertools
from functools import cache

import onnx
import onnx_ir as ir

from dqtool import graph
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome


@cache
def since_versions(op: str) -> tuple[int, ...]:
    return tuple(sorted(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                        if s.name == op and s.domain == ""))


def since_at(op: str, opset: int) -> int | None:
    vs = [v for v in since_versions(op) if v <= opset]
    return vs[-1] if vs else None


@cache
def _schema(op: str, since: int) -> onnx.defs.OpSchema:
    return onnx.defs.get_schema(op, since, "")


def _slots(params) -> tuple:
    return tuple(int(p.option) for p in params)


def _attr_facts(s: onnx.defs.OpSchema) -> dict[str, tuple]:
    return {n: (int(a.type), a.required, a.default_value.SerializeToString())
            for n, a in s.attributes.items()}


def _allowed(s: onnx.defs.OpSchema, formal) -> frozenset[str]:
    by = {c.type_param_str: c.allowed_type_strs for c in s.type_constraints}
    return frozenset(t[len("tensor("):-1] if t.startswith("tensor(") else t
                     for t in by.get(formal.type_str, [formal.type_str]))


def type_only_difference(node: ir.Node, lo: int, hi: int) -> str | None:
    """None if ``node`` means the same at since-versions ``lo`` and ``hi`` (adjacent);
    else what differs."""
    a, b = _schema(node.op_type, lo), _schema(node.op_type, hi)
    if _slots(a.inputs) != _slots(b.inputs) or _slots(a.outputs) != _slots(b.outputs):
        return "inputs or outputs differ"
    fa, fb = _attr_facts(a), _attr_facts(b)
    for name in sorted(set(fa) | set(fb)):
        if name in fa and name in fb and fa[name] != fb[name]:
            return f"attribute '{name}' differs"
        if name not in fa or name not in fb:
            attr = node.attributes.get(name)
            side = fb if name in fb else fa
            if attr is not None:
                if not _is_default(attr, side[name][2]):
                    return f"attribute '{name}' exists at only one of the versions"
            elif side[name][1] or not side[name][2]:
                return f"attribute '{name}' exists at only one of the versions"
    for formals, values in ((zip(a.inputs, b.inputs, strict=True), node.inputs),
                            (zip(a.outputs, b.outputs, strict=True), node.outputs)):
        for i, (pa, pb) in enumerate(formals):
            ta, tb = _allowed(a, pa), _allowed(b, pb)
            if ta == tb:
                continue
            value = values[i] if i < len(values) else None
            t = graph.elem_type(value) if value is not None else None
            if t is None:
                continue  # type unknown: reported as a warning by the caller
            if t not in ta or t not in tb:
                return f"type {t} of '{value.name}' is not allowed on both sides"
    return None


def _is_default(attr: ir.Attr, default: bytes) -> bool:
    """The node sets the attribute to the schema's default (so either side means it)."""
    if not default or attr.is_ref():
        return False
    d = onnx.AttributeProto.FromString(default)
    if not d.name and d.type == 0:
        return False
    mine = ir.serde.serialize_attribute(attr)
    return onnx.helper.get_attribute_value(mine) == onnx.helper.get_attribute_value(d)


def convert(node: ir.Node, step: Step, source_opset: int) -> Outcome:
    op = node.op_type
    src, dst = since_at(op, source_opset), since_at(op, step.target)
    if dst is None:
        first = since_versions(op)[0] if since_versions(op) else "?"
        return Outcome.refused(f"{op} does not exist at opset {step.target} (it starts at "
                               f"{first})")
    if src is None:
        return Outcome.refused(f"{op} does not exist at the source opset {source_opset}")
    if src == dst:
        return Outcome.unchanged()
    vs = [v for v in since_versions(op) if min(src, dst) <= v <= max(src, dst)]
    diffs = [d for lo, hi in itertools.pairwise(vs)
             if (d := type_only_difference(node, lo, hi))]
    if not diffs:
        return Outcome.unchanged()
    return _with_onnx_converter(node, step, source_opset, "; ".join(diffs))


def _with_onnx_converter(node: ir.Node, step: Step, source_opset: int, why: str) -> Outcome:
    """Run onnx's version converter on a model holding only this node."""
    from onnx import helper, version_converter

    inputs = []
    for v in node.inputs:
        if v is None:
            continue
        t = v.dtype or ir.DataType.FLOAT
        inputs.append(helper.make_tensor_value_info(v.name, int(t), None))
    proto_node = ir.serde.serialize_node(node)
    outs = [helper.make_tensor_value_info(v.name, 0, None) for v in node.outputs if v.name]
    g = helper.make_graph([proto_node], "one", inputs, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", source_opset)])
    try:
        converted = version_converter.convert_version(m, step.target)
    except Exception as e:  # onnx raises RuntimeError / ConvertError / C++ errors
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return Outcome.refused(f"{node.op_type}: {why}, and onnx's version converter "
                               f"failed ({reason})")
    new_nodes = list(converted.graph.node)
    if len(new_nodes) != 1 or converted.graph.initializer or \
            new_nodes[0].op_type != node.op_type or len(new_nodes[0].input) != len(node.inputs):
        return Outcome.refused(f"{node.op_type}: {why}; onnx's version converter rewrites it "
                               "into other nodes, which dqtool does not splice")
    new = new_nodes[0]
    node.attributes.clear()
    for a in new.attribute:
        attr = ir.serde.deserialize_attribute(a)
        node.attributes[attr.name] = attr
    return Outcome("changed", f"attributes rewritten by onnx's version converter "
                   f"({node.op_type} {source_opset}→{step.target})", why)

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
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph, types
from dqtool.codecs import base, onnx_std
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome

# Any ai.onnx op's versions, from onnx's schemas (the codecs' lookup serves every op).
since_versions = onnx_std.versions
since_at = onnx_std.since_at


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


def type_only_difference(node: ir.Node, lo: int, hi: int, source: int | None = None,
                         untyped: list[str] | None = None) -> str | None:
    """None if ``node`` means the same at since-versions ``lo`` and ``hi`` (adjacent);
    else what differs. ``source`` is the side the node is read at (default ``lo``).
    ``untyped`` collects the names of values whose type the versions constrain differently
    but the model does not record (so that step could not be verified)."""
    a, b = _schema(node.op_type, lo), _schema(node.op_type, hi)
    if _slots(a.inputs) != _slots(b.inputs) or _slots(a.outputs) != _slots(b.outputs):
        return f"inputs or outputs differ between {node.op_type}-{lo} and {node.op_type}-{hi}"
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
            elif side[name][1]:
                return f"attribute '{name}' is required at one of the versions"
            elif (hi if name in fb else lo) != (source or lo) and not side[name][2]:
                # New on the target side with no default: leaving it out may not mean
                # what the source version did (Split-18 needs num_outputs or 'split').
                # Only on the source side and not set: the node never used it.
                return f"attribute '{name}' exists at only one of the versions"
    bound: dict[str, str] = {}  # type parameter (T) -> the type an input gives it
    for formals, values in ((zip(a.inputs, b.inputs, strict=True), node.inputs),
                            (zip(a.outputs, b.outputs, strict=True), node.outputs)):
        for i, (pa, pb) in enumerate(formals):
            ta, tb = _allowed(a, pa), _allowed(b, pb)
            if ta == tb:
                continue
            value = values[i] if i < len(values) else None
            t = _value_type(value) if value is not None else None
            if t is None and value is not None:
                t = bound.get(pa.type_str)  # typed T like an input whose type is known
            if t is not None:
                bound.setdefault(pa.type_str, t)
            if t is None:
                # Unknown type: reported as a warning by the caller when the target side
                # allows fewer types than the source side (going up they only widen).
                src_types, dst_types = (ta, tb) if (source or lo) == lo else (tb, ta)
                if untyped is not None and value is not None and value.name and \
                        not src_types <= dst_types:
                    untyped.append(value.name)
                continue
            if t not in ta or t not in tb:
                return f"type {t} of '{value.name}' is not allowed on both sides"
    return None


def _value_type(value: ir.Value) -> str | None:
    """``graph.elem_type``, and for an ai.onnx DequantizeLinear's output that the model does
    not declare (quantizers rarely write value_info) its output_dtype or its scale's type."""
    t = graph.elem_type(value)
    producer = value.producer()
    if t is not None or producer is None or producer.op_type != "DequantizeLinear" or \
            producer.domain not in graph.DEFAULT_DOMAINS or value.index() != 0:
        return t
    attr = producer.attributes.get("output_dtype")
    if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.INT and \
            attr.value:
        return types.name_of(ir.DataType(attr.value))
    return graph.elem_type(graph.input_value(producer, 1))


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
        if not since_versions(op):
            return Outcome.refused(f"{op} is not an ai.onnx operator that onnx "
                                   f"{onnx.__version__} knows")
        return Outcome.refused(f"{op} does not exist at opset {step.target} (it starts at "
                               f"{since_versions(op)[0]})")
    if src is None:
        return Outcome.refused(f"{op} does not exist at the source opset {source_opset}")
    if src == dst:
        return Outcome.unchanged()
    vs = [v for v in since_versions(op) if min(src, dst) <= v <= max(src, dst)]
    if dst < src:
        vs.reverse()
    # One version step at a time: a step whose schemas differ only in types leaves the
    # node as it is; only the others go through onnx's converter (which lacks adapters
    # for many type-only steps, e.g. Split 18→13).
    done: list[Outcome] = []
    if op == "Split" and dst < 18 <= src and "num_outputs" in node.attributes:
        out = _split_num_outputs_down(node, step)
        if out.status == "refused":
            return out
        done.append(out)
    untyped: list[str] = []
    for a, b in itertools.pairwise(vs):
        why = type_only_difference(node, min(a, b), max(a, b), a, untyped)
        if why is None:
            continue
        out = _with_onnx_converter(node, step, a, b, why)
        if out.status == "refused":
            return out
        done.append(out)
    if untyped:
        step.ctx.untyped.append((node.name or f"<unnamed {op}>", op, src, dst,
                                 tuple(dict.fromkeys(untyped))))
    dropped = _drop_foreign_attributes(node, src, dst)
    if dropped.status == "refused":
        return dropped
    done.append(dropped)
    # A step onnx's converter left as it was (e.g. ReduceMean without axes) is no change.
    return Outcome.merge(done)


# Attributes that only act on types the versions without them do not have (float8,
# float4): dropped whatever their value (a Cast to int8 ignores ``saturate``).
_TYPE_ONLY = {"Cast": {"saturate", "round_mode"}, "CastLike": {"saturate", "round_mode"}}


def _drop_foreign_attributes(node: ir.Node, src: int, dst: int) -> Outcome:
    """Remove the attributes ``node``'s schema at ``dst`` does not have, where the node has
    them at their default (the versions without them mean the same: Reshape-14's
    ``allowzero=0`` going to 13, where a downgrade kept it and wrote a model onnxruntime and
    the checker reject); one set otherwise has no equivalent there: refused (AveragePool's
    ``dilations`` going below 19; onnx's converter let them through)."""
    have = _schema(node.op_type, dst).attributes
    foreign = sorted(n for n in node.attributes if n not in have)
    if not foreign:
        return Outcome.unchanged()
    source = _schema(node.op_type, src).attributes
    for name in foreign:
        attr = node.attributes[name]
        default = source[name].default_value.SerializeToString() if name in source else b""
        if name not in _TYPE_ONLY.get(node.op_type, ()) and not _is_default(attr, default):
            # (a default stated in words only, as dilations' "1 along each axis", is not
            # taken as one: onnxruntime's AveragePool-19 with dilations [1, 1] sums in
            # another order than its AveragePool-11, measured)
            what = "is not at its default" if default else \
                "is set, and its schema states no default value"
            return Outcome.refused(f"attribute '{name}' {what}, and {node.op_type}-{dst} "
                                   "has no such attribute")
    for name in foreign:
        node.attributes.pop(name)
    return Outcome("changed", f"attribute {', '.join(foreign)} removed",
                   f"{node.op_type}-{dst} has no attribute {', '.join(foreign)} (at its "
                   "default it means what the version without it does)")


def _split_num_outputs_down(node: ir.Node, step: Step) -> Outcome:
    """Split-18's num_outputs (last chunk may be smaller) for Split-13 and older: nothing
    when the size divides evenly, else an explicit 'split' input."""
    n = base.attr_int(node, "num_outputs", None)
    why = "num_outputs needs Split-18"
    if graph.input_value(node, 1) is not None or n is None:
        return Outcome.refused(f"Split: {why}, and the node also has a 'split' input")
    if n != len(node.outputs):
        return Outcome.refused(f"Split: num_outputs={n} but the node has "
                               f"{len(node.outputs)} outputs")
    x = graph.input_value(node, 0)
    shape = graph.shape_of(x)
    axis = base.attr_int(node, "axis", 0) or 0
    dim = None
    if shape is not None and -len(shape) <= axis < len(shape):
        dim = shape[axis]
    if not isinstance(dim, int):
        return Outcome.refused(f"Split: {why}, and the size of axis {axis} of "
                               f"'{x.name if x is not None else 'input'}' is unknown, so the "
                               "chunk sizes cannot be written out")
    node.attributes.pop("num_outputs")
    if dim % n == 0:
        return Outcome("changed", f"num_outputs={n} removed (axis size {dim} splits evenly)",
                       why)
    chunk = -(-dim // n)
    sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    value = step.small_constant(f"{node.name or 'Split'}_split", np.asarray(sizes, np.int64))
    step.set_input(1, value)
    return Outcome("changed", f"num_outputs={n} → split input {sizes}", why)


# A constant input at most this large is handed to onnx's converter with its value (it may
# turn it into an attribute: axes, split, pads ...); larger ones go in as typed inputs.
_SMALL_CONSTANT = 4096


def _formal_name(schema: onnx.defs.OpSchema, index: int) -> str:
    formals = list(schema.inputs)
    if index < len(formals):
        return formals[index].name
    if formals and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return formals[-1].name
    return f"input{index}"


def _input_slots(schema: onnx.defs.OpSchema) -> int | None:
    """How many inputs the schema takes at most (None: variadic)."""
    formals = list(schema.inputs)
    if formals and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return None
    return len(formals)


def _small_constant(value: ir.Value) -> onnx.TensorProto | None:
    shape = graph.shape_of(value)
    n = graph.num_elements(shape)
    if n is None or n > _SMALL_CONSTANT:
        return None
    tensor = graph.constant_tensor(value)
    if tensor is None:
        return None
    proto = ir.serde.serialize_tensor(tensor)
    proto.name = value.name
    return proto


def _with_onnx_converter(node: ir.Node, step: Step, source_opset: int, target_opset: int,
                         why: str) -> Outcome:
    """Run onnx's version converter on a model holding only this node (and its small
    constant inputs, which the converter may turn into attributes), then splice the result
    back: the node keeps its name and outputs; constant inputs the converter makes from
    attributes become new uniquely named constants; constants it folds into attributes are
    dropped at the end if nothing else uses them."""
    from onnx import helper, version_converter

    op = node.op_type
    dst_schema = _schema(op, since_at(op, target_opset))
    slots = _input_slots(dst_schema)
    inputs, inits, seen = [], [], set()
    for i, v in enumerate(node.inputs):
        if v is None or v.name in seen:
            continue
        seen.add(v.name)
        const = _small_constant(v)
        if const is not None:
            inits.append(const)
            continue
        if slots is not None and i >= slots:
            formal = _formal_name(_schema(op, since_at(op, source_opset)), i)
            return Outcome.refused(
                f"{op}: {why}; its input '{formal}' ('{v.name}') is computed at run time, "
                f"and {op}-{dst_schema.since_version} needs it as an attribute")
        t = graph.elem_type(v)
        t_int = int(ir.DataType[t.upper()]) if t and t.upper() in ir.DataType.__members__ \
            else int(v.dtype or ir.DataType.FLOAT)
        inputs.append(helper.make_tensor_value_info(v.name, t_int, None))
    proto_node = ir.serde.serialize_node(node)
    outs = [helper.make_tensor_value_info(v.name, 0, None) for v in node.outputs if v.name]
    g = helper.make_graph([proto_node], "one", inputs, outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", source_opset)])
    try:
        converted = version_converter.convert_version(m, target_opset)
    except Exception as e:  # onnx raises RuntimeError / ConvertError / C++ errors
        return Outcome.refused(f"{op}: {why}, and onnx's version converter failed "
                               f"({_converter_reason(e)})")
    return _splice(node, step, converted.graph, source_opset, target_opset, why, dst_schema)


def _converter_reason(e: Exception) -> str:
    text = str(e).strip()
    if not text:
        return type(e).__name__
    line = text.splitlines()[0]
    # "/project/onnx/version_converter/...h:55: adapt: Assertion `...` failed: message"
    if "failed:" in line:
        line = line.rsplit("failed:", 1)[1].strip()
    return line.replace("$", "")


def _splice(node: ir.Node, step: Step, g: onnx.GraphProto, source_opset: int,
            target_opset: int, why: str, dst_schema: onnx.defs.OpSchema) -> Outcome:
    op = node.op_type
    main = [n for n in g.node if n.op_type == op and n.domain in ("", "ai.onnx")]
    helpers = [n for n in g.node if n not in main]
    not_splicable = Outcome.refused(f"{op}: {why}; onnx's version converter rewrites it into "
                                    "other nodes, which dqtool does not splice")
    if len(main) != 1 or any(h.op_type != "Constant" or h.domain not in ("", "ai.onnx")
                             for h in helpers):
        return not_splicable
    new = main[0]
    if list(new.output) != [v.name for v in node.outputs]:
        return not_splicable
    constants: dict[str, Any] = {t.name: t for t in g.initializer}
    for h in helpers:
        constants[h.output[0]] = h
    original = {v.name: v for v in node.inputs if v is not None}
    new_inputs: list[ir.Value | None] = []
    added: list[str] = []
    for i, name in enumerate(new.input):
        if not name:
            new_inputs.append(None)
        elif name in original:
            new_inputs.append(original[name])
        elif name in constants:
            arr = _converted_constant(constants[name])
            if arr is None:
                return not_splicable
            formal = _formal_name(dst_schema, i)
            base = f"{node.name or op}_{formal}"
            value = step.small_constant(base, arr)
            new_inputs.append(value)
            added.append(f"'{formal}' ({value.name})")
        else:
            return not_splicable
    old_attrs = set(node.attributes)
    before = sorted(a.SerializeToString() for a in ir.serde.serialize_node(node).attribute)
    if new_inputs == list(node.inputs) and \
            before == sorted(a.SerializeToString() for a in new.attribute):
        return Outcome.unchanged()
    dropped = [v for v in node.inputs if v is not None and v not in new_inputs]
    step.ctx.replaced.extend(dropped)
    node.resize_inputs(len(new_inputs))
    for i, v in enumerate(new_inputs):
        if node.inputs[i] is not v:
            node.replace_input_with(i, v)
    node.attributes.clear()
    for a in new.attribute:
        attr = ir.serde.deserialize_attribute(a)
        node.attributes[attr.name] = attr
    new_attrs = set(node.attributes)
    parts = []
    if old_attrs - new_attrs:
        parts.append("attribute " + ", ".join(sorted(old_attrs - new_attrs)) + " removed")
    if added:
        parts.append("constant input " + ", ".join(added) + " added")
    if dropped:
        parts.append("constant input " + ", ".join(f"'{v.name}'" for v in dropped)
                     + " folded into an attribute")
    if new_attrs - old_attrs:
        parts.append("attribute " + ", ".join(sorted(new_attrs - old_attrs)) + " set")
    detail = "; ".join(parts) or "attributes rewritten"
    return Outcome("changed", f"{detail} (onnx's version converter, {op}-{source_opset} → "
                   f"{op}-{target_opset})", why)


def _converted_constant(holder: Any) -> np.ndarray | None:
    """The values of a constant onnx's version converter made: an initializer, or a
    Constant node (whose value may be an attribute other than a tensor)."""
    if isinstance(holder, onnx.TensorProto):
        return graph.tensor_values(ir.serde.deserialize_tensor(holder))
    for a in holder.attribute:
        if a.name == "value":
            return graph.tensor_values(ir.serde.deserialize_tensor(a.t))
        if a.name == "value_ints":
            return np.asarray(list(a.ints), dtype=np.int64)
        if a.name == "value_int":
            return np.asarray(a.i, dtype=np.int64)
        if a.name == "value_floats":
            return np.asarray(list(a.floats), dtype=np.float32)
        if a.name == "value_float":
            return np.asarray(a.f, dtype=np.float32)
    return None


# Nodes named in one warning of a group; the rest are counted.
NAMED = 3


def untyped_warnings(untyped: list[tuple[str, str, int, int, tuple[str, ...]]]) -> list[str]:
    """One warning per version step (an LLM downgraded without value_info has a hundred
    Adds alike): a node alone with the values it lacks types for, else the nodes."""
    groups: dict[tuple[str, int, int], list[tuple[str, tuple[str, ...]]]] = {}
    for name, op, src, dst, values in untyped:
        groups.setdefault((op, src, dst), []).append((name, values))
    tail = ": not verified (a type the target version lacks makes the model invalid; --check " \
        "runs it)"
    out = []
    for (op, src, dst), nodes in groups.items():
        if len(nodes) == 1:
            name, values = nodes[0]
            listed = ", ".join(f"'{v}'" for v in values)
            out.append(f"{name}: {op}-{src} → {op}-{dst} allow different types and the model "
                       f"does not record the type of {listed}{tail}")
            continue
        shown = ", ".join(n for n, _ in nodes[:NAMED])
        more = f" and {len(nodes) - NAMED} more" if len(nodes) > NAMED else ""
        out.append(f"{len(nodes)} {op} nodes ({shown}{more}): {op}-{src} → {op}-{dst} allow "
                   "different types and the model does not record the types they read or "
                   f"make{tail}")
    return out

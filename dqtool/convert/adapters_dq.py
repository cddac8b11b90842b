"""ai.onnx DequantizeLinear / QuantizeLinear across one version step, up or down.

Down: the node is read at the upper version (its meaning) and rewritten until the lower
version expresses that meaning — float32 detour for output_dtype and scale types, exact
widening of x, blocked → per-axis — or refused with the reason (``--allow-decompose``
turns a DequantizeLinear refusal into Cast/Sub/Mul where that is exact).
Up: every older meaning is expressible by the newer versions; an invalid node that the
newer version accepts (onnxruntime's per-axis at 10/11, nncf's uint4 at 17) is repaired.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import codecs, graph, types, versions
from dqtool.codecs import base, onnx_std
from dqtool.convert import blocked, decompose, generic, outputs, widen
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome, Registry
from dqtool.spec import QuantSpec

DQ, Q = "DequantizeLinear", "QuantizeLinear"


def read(node: ir.Node, since: int) -> QuantSpec:
    return codecs.read_node(node, {"": since})


def register(reg: Registry) -> None:
    for op in (DQ, Q):
        upper = generic.since_versions(op)[1:]
        reg.register("ai.onnx", op, upper, "up", widening=True)(lift)
        reg.register("ai.onnx", op, upper, "down")(lower_dq if op == DQ else lower_q)


def lift(node: ir.Node, step: Step) -> Outcome:
    before, after = read(node, step.src), read(node, step.dst)
    if before.errors and not after.errors:
        return Outcome("repaired", f"valid at {node.op_type}-{step.dst}",
                       "; ".join(p.message for p in before.errors))
    return Outcome.unchanged()


def lower_dq(node: ir.Node, step: Step) -> Outcome:
    spec = read(node, step.src)
    if spec.errors:
        return Outcome.refused("invalid: " + "; ".join(p.message for p in spec.errors))
    sch = onnx_std.schema_facts(DQ, step.dst)
    done: list[Outcome] = []
    where = f"{DQ}-{step.dst}"

    def apply(outcome: Outcome) -> bool:
        nonlocal spec
        if outcome.status == "refused":
            return False
        done.append(outcome)
        if node.graph is not None:
            spec = read(node, step.src)
        return True

    if spec.scale_type is None and graph.input_value(node, 1) is not None:
        unknown = unknown_type(node, 1, step, sch.scale_types, "scale")
        if unknown is not None:
            return unknown
    needs_detour = (spec.output_dtype_attr and not sch.output_dtype
                    and spec.output_dtype_attr != spec.scale_type) or \
        (spec.scale_type is not None and spec.scale_type not in sch.scale_types)
    if needs_detour:
        why = (f"output_dtype needs {DQ}-23" if spec.output_dtype_attr and not sch.output_dtype
               else f"a {spec.scale_type} scale is not allowed by {where}")
        out = outputs.float32_detour(step, spec, why)
        if not apply(out):
            return _refuse_or_decompose(step, spec, [out.why], done)
    elif spec.output_dtype_attr and not sch.output_dtype:
        node.attributes.pop("output_dtype", None)
        done.append(Outcome("changed", "output_dtype removed (equals the scale type)",
                            f"output_dtype needs {DQ}-23"))
    qt = spec.quant_type
    if qt is None:
        unknown = unknown_type(node, 0, step, sch.quant_types, "quantized")
        if unknown is not None:
            return unknown
    elif qt not in sch.quant_types:
        if qt in widen.SUB_BYTE_INT:
            out = widen.widen_int(step, spec, sch.quant_types)
        elif qt in ("int16", "uint16"):
            out = widen.fold_int16(step, spec)
        elif qt in widen.SMALL_FLOAT and "float8e4m3fn" in sch.quant_types:
            out = widen.small_float_to_f8(step, spec)
        else:
            out = Outcome.refused(f"{qt} is not a quantized type of {at_target(DQ, step)}, "
                                  "and no exact rewrite gives one")
        if not apply(out):
            return _refuse_or_decompose(step, spec, [out.why], done)
    if spec.granularity == "blocked" and not sch.blocked:
        out = blocked.to_per_axis(step, spec, f"blocked needs {DQ}-21")
        if not apply(out):
            return _refuse_or_decompose(step, spec, [out.why], done)
    _drop_default_attributes(node, spec, sch.attributes)
    problems = [p.message for p in read(node, step.dst).errors]
    if problems:
        return _refuse_or_decompose(step, spec, problems, done)
    return Outcome.merge(done)


def _refuse_or_decompose(step: Step, spec: QuantSpec, reasons: list[str],
                         done: list[Outcome]) -> Outcome:
    if step.ctx.options.allow_decompose:
        out = decompose.decompose(step, read(step.node, step.src), reasons)
        if out.status != "refused":
            return Outcome.merge([*done, out])
        return out
    return Outcome.refused("; ".join(reasons) + " (--allow-decompose rewrites it as "
                           "Cast/Sub/Mul where that is exact)"
                           if _decomposable(spec, step.target) else "; ".join(reasons))


def _decomposable(spec: QuantSpec, opset: int) -> bool:
    return spec.quant_type in types.TYPES and decompose._cast_from(spec.quant_type, opset)


def _drop_default_attributes(node: ir.Node, spec: QuantSpec, allowed: frozenset[str]) -> None:
    """Attributes the lower version lacks, where their value says nothing."""
    for name in list(node.attributes):
        if name in allowed:
            continue
        value = graph_attr(node, name)
        meaningless = (
            (name in ("block_size", "output_dtype", "precision") and not value)
            or (name == "axis" and spec.granularity == "per-tensor")
            or (name == "saturate" and spec.quant_type not in types.FLOAT8)
        )
        if meaningless:
            node.attributes.pop(name)


def at_target(op: str, step: Step) -> str:
    """``QuantizeLinear at opset 20 (QuantizeLinear-19)``: the version the user asked for."""
    since = onnx_std.since_at(op, step.target)
    if since is None or since == step.target:
        return f"{op}-{step.target}"
    return f"{op} at opset {step.target} ({op}-{since})"


def _function_of(node: ir.Node, model: ir.Model) -> ir.Function | None:
    for fn in model.functions.values():
        if fn.graph is node.graph:
            return fn
    return None


def call_site_types(fn: ir.Function, index: int, model: ir.Model) -> list[str | None]:
    """The element type each call of ``fn`` passes as its ``index``-th input."""
    key = fn.identifier()
    found: list[str | None] = []
    for g in (model.graph, *model.functions.values()):
        for call in ir.traversal.RecursiveGraphIterator(g):
            if (call.domain, call.op_type, call.overload) == key:
                found.append(graph.elem_type(graph.input_value(call, index)))
    return found


def unknown_type(node: ir.Node, index: int, step: Step, allowed: frozenset[str],
                 kind: str) -> Outcome | None:
    """A node input whose type the model does not say. Inside a function, the call sites
    may still say it: when every call passes a type ``allowed`` at the lower version, the
    node needs no rewrite (None). Otherwise a refusal that says what is unknown."""
    value = graph.input_value(node, index)
    name = value.name if value is not None else f"input {index}"
    fn = _function_of(node, step.ctx.model) if value is not None else None
    if fn is not None and value in list(fn.inputs):
        where = fn.name if not fn.domain else f"{fn.domain}.{fn.name}"
        types_seen = call_site_types(fn, list(fn.inputs).index(value), step.ctx.model)
        if types_seen and all(t in allowed for t in types_seen):
            return None
        known = sorted({t for t in types_seen if t is not None})
        bad = [t for t in known if t not in allowed]
        if bad:
            return Outcome.refused(
                f"'{name}' (function input of {where}) is {', '.join(bad)} at some call "
                f"site, which is not a {kind} type of {at_target(node.op_type, step)}; a "
                "function body is shared by all its call sites, so it is not rewritten")
        return Outcome.refused(f"the type of {name} is unknown (function input '{name}' of "
                               f"{where}; its call sites disagree or are untyped)")
    return Outcome.refused(f"the type of {name} is unknown (the model declares no type for "
                           f"'{name}' and it is not a constant)")


def graph_attr(node: ir.Node, name: str) -> int | None:
    return base.attr_int(node, name, None)


def lower_q(node: ir.Node, step: Step) -> Outcome:
    spec = read(node, step.src)
    if spec.errors:
        return Outcome.refused("invalid: " + "; ".join(p.message for p in spec.errors))
    sch = onnx_std.schema_facts(Q, step.dst)
    done: list[Outcome] = []
    if spec.output_dtype_attr and "output_dtype" not in sch.attributes:
        if graph.input_value(node, 2) is None:
            qt = types.by_name(spec.quant_type)
            shape = tuple(d for d in (spec.scale_shape or ()) if isinstance(d, int))
            zp = step.small_constant(f"{node.name}_zero_point",
                                     np.zeros(shape, qt.dtype), qt.ir_type)
            step.set_input(2, zp)
            done.append(Outcome("changed", f"output_dtype → explicit zero {qt.name} zero point",
                                f"output_dtype needs {Q}-21"))
        node.attributes.pop("output_dtype", None)
    if spec.quant_type is None:
        unknown = unknown_type(node, 2, step, sch.quant_types, "quantized") \
            if graph.input_value(node, 2) is not None else None
        if unknown is not None:
            return unknown
    reasons = versions.why_not(spec, step.dst)
    if reasons:
        # Types only grow with versions: say what the target version itself lacks.
        target_since = onnx_std.since_at(Q, step.target) or step.dst
        at_final = versions.why_not(spec, target_since)
        if at_final:
            reasons = [r.replace(f"{Q}-{target_since}", at_target(Q, step)) for r in at_final]
        return Outcome.refused("; ".join(reasons) + " (a QuantizeLinear's input is computed "
                               "at run time, so it has no exact rewrite)")
    _drop_default_attributes(node, spec, sch.attributes)
    problems = [p.message for p in read(node, step.dst).errors]
    if problems:
        return Outcome.refused("; ".join(problems))
    return Outcome.merge(done)

"""``rewrite``: every hand-written dequantization into an ai.onnx DequantizeLinear that
computes the same bits (``forms``), all or nothing, on a copy of the model."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph, storage, types
from dqtool.building import Builder
from dqtool.errors import UsageError
from dqtool.handwritten import forms
from dqtool.handwritten.recognize import Found, found
from dqtool.handwritten.report import PatternReport, RewriteReport
from dqtool.names import Names


def _ai_onnx(imports: dict[str, int]) -> int | None:
    return imports.get("", imports.get("ai.onnx"))


def _since(op: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset, "").since_version
    except onnx.defs.SchemaError:
        return None


def changed_by_raise(model: ir.Model, src: int, dst: int,
                     written: frozenset[int] = frozenset()) -> list[str]:
    """The ai.onnx operators of ``model`` whose definition differs between opsets ``src``
    and ``dst`` (the nodes whose ``id`` is in ``written`` aside: made for ``dst``):
    raising the import alone would change (or break) their meaning."""
    seen: dict[str, str] = {}
    for site in graph.walk(model):
        n = site.node
        if id(n) not in written and n.domain in graph.DEFAULT_DOMAINS and n.op_type not in seen:
            a, b = _since(n.op_type, src), _since(n.op_type, dst)
            if a != b:
                seen[n.op_type] = f"{n.op_type} ({a}→{b})"
    return sorted(seen.values())


class _PatternBuilder(Builder):
    """The DequantizeLinear (and Cast) replacing one pattern, before its last node; a
    constant is an initializer of the Mul's graph, or in a function an unnamed Constant
    node."""

    def __init__(self, f: Found, last: ir.Node, names: Names) -> None:
        super().__init__(last, names, in_function=f.match.site.function is not None,
                         home=f.match.mul.graph)

    def constant_node_name(self, name: str, role: str) -> str | None:
        return None

    def constant(self, arr: np.ndarray, name: str, role: str) -> ir.Value:
        return self.place(self.array(name, arr), name, role)


def _codes_value(f: Found, form: forms.Form, x: np.ndarray, name: str,
                 b: _PatternBuilder) -> ir.Value:
    """The stored codes themselves where they already are the DequantizeLinear's (same
    type and shape: no copy, external data stays where it is), else a new constant."""
    src = f.match.codes.source
    if not f.match.codes.nodes and graph.elem_type(src) == form.codes_type \
            and graph.shape_of(src) == form.layout.shape:
        return src
    return b.constant(x, name, "codes")


def _dq_nodes(f: Found, form: forms.Form, b: _PatternBuilder) -> ir.Value:
    """The new nodes (in ``b``); returns the value that replaces the pattern's output."""
    names, out_name = b.names, f.record.output
    x, scale, zp = forms.operands(f.match, form)
    inputs = [_codes_value(f, form, x, names(f"{out_name}_codes"), b),
              b.constant(scale, names(f"{out_name}_scale"), "scale")]
    if zp is not None:
        inputs.append(b.constant(zp, names(f"{out_name}_zero_point"), "zero_point"))
    attrs = []
    if form.layout.granularity != "per-tensor":
        attrs.append(ir.AttrInt64("axis", int(form.layout.axis or 0)))
    if form.layout.granularity == "blocked":
        attrs.append(ir.AttrInt64("block_size", int(form.layout.block_size or 0)))
    if form.wide_output:
        attrs.append(ir.AttrInt64("output_dtype", int(ir.DataType.FLOAT)))
    dq_out = ir.Value(name=names(f"{out_name}_dequantized"))
    b.add_node(ir.Node("", "DequantizeLinear", inputs, attributes=attrs, outputs=[dq_out],
                       name=names(f"{out_name}_DequantizeLinear")))
    if not form.wide_output:
        return dq_out
    to = types.by_name(form.float_type).ir_type
    cast_out = ir.Value(name=names(f"{out_name}_cast"))
    b.add_node(ir.Node("", "Cast", [dq_out], attributes=[ir.AttrInt64("to", int(to))],
                       outputs=[cast_out], name=names(f"{out_name}_Cast")))
    return cast_out


def _remove_dead(nodes: tuple[ir.Node, ...]) -> None:
    """Remove the pattern's nodes (last first) and the constants only they read."""
    inputs: list[ir.Value] = []
    for node in reversed(nodes):
        if node.graph is None or any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        inputs.extend(v for v in node.inputs if v is not None)
        node.graph.remove(node, safe=True)
    for v in inputs:
        if v.uses() or v.is_graph_output() or v.is_graph_input():
            continue
        if v.is_initializer() and v.graph is not None:
            v.graph.initializers.pop(v.name or "", None)
            continue
        p = v.producer()
        if p is not None and p.op_type == "Constant" and p.graph is not None \
                and not any(o.uses() for o in p.outputs):
            p.graph.remove(p, safe=True)


def _apply(f: Found, form: forms.Form, names: Names) -> list[ir.Node]:
    m = f.match
    last = m.after if form.absorbs_after and m.after is not None else m.mul
    old = last.outputs[0]
    assert last.graph is not None
    b = _PatternBuilder(f, last, names)
    new = _dq_nodes(f, form, b)
    new_nodes = list(b.nodes)
    b.insert()
    new.shape, new.type = old.shape, old.type
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    name = old.name
    old.name = names(f"{name}_handwritten")
    new.name = name
    chain = m.nodes if form.absorbs_after or m.after is None else m.nodes[:-1]
    _remove_dead(chain)
    return new_nodes


def _plan(items: list[Found], target: int, report: RewriteReport) -> list[Found]:
    todo = []
    for f in items:
        r, form = f.record, f.decision.form
        if not r.rewritable:
            report.left.append(PatternReport(r, "; ".join(r.reasons)))
        elif form is None:
            report.refused.append(PatternReport(r, "; ".join(r.reasons)))
        elif form.min_opset > target:
            report.refused.append(PatternReport(r, f"{form.describe()} needs opset "
                                          f"{form.min_opset}; the target is {target}"))
        else:
            todo.append(f)
    return todo


def rewrite(model: ir.Model, opset: int | None = None) -> RewriteReport:
    """Every hand-written dequantization of ``model`` rewritten into ai.onnx
    DequantizeLinear, bit-identical on onnxruntime (ORT_DISABLE_ALL) and on the reference
    evaluator; ``report.model`` is the result, a copy (the model handed in is not touched).

    ``opset``: the ai.onnx opset of the result (default: the model's). A higher one is
    reached by raising the import only where no remaining operator's definition changes
    between the two (else refused: run ``upgrade`` first); a lower one is ``downgrade``'s
    job (UsageError). All or nothing: any refusal leaves ``report.model`` None.
    """
    src = _ai_onnx(model.opset_imports)
    target = opset if opset is not None else src
    if target is None:
        raise UsageError("the model imports no ai.onnx opset; name one")
    if src is not None and target < src:
        raise UsageError(f"opset {target} is below the model's {src}: lower it with "
                         "`dqtool downgrade` first")
    report = RewriteReport(src, target)
    work = model.clone()
    work.meta.update(model.meta)
    todo = _plan(found(work), target, report)
    if report.refused:
        return report
    names = Names(work)
    written: set[int] = set()
    for f in todo:
        assert f.decision.form is not None
        written.update(id(n) for n in _apply(f, f.decision.form, names))
        report.changed.append(PatternReport(f.record, f"{' → '.join(f.record.ops)} → "
                                      f"{f.decision.form.describe()}"))
    if src is not None and target > src:
        moved = changed_by_raise(work, src, target, frozenset(written))
        if moved:
            why = (f"raising ai.onnx {src} → {target} changes {', '.join(moved)}: run "
                   f"`dqtool upgrade --opset {target}` first")
            report.refused = [PatternReport(o.record, why) for o in report.changed]
            report.changed = []
            return report
        _raise(work, target)
    work.ir_version = max(work.ir_version or 0, storage.lowest_ir_version(work))
    report.model = work
    return report


def _raise(model: ir.Model, target: int) -> None:
    for imports in [model.opset_imports, *(fn.opset_imports for fn in model.functions.values())]:
        key = "ai.onnx" if "ai.onnx" in imports and "" not in imports else ""
        if key in imports or imports is model.opset_imports:
            imports[key] = target




def insert_in_place(model: ir.Model, keep: Callable[[ir.Node], str | None]
                    ) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """For ``dqtool fold``: each constant hand-written dequantization of ``model`` that has
    an exact form becomes that form in place, so that the fold pass folds its
    DequantizeLinear like any other. ``keep(dq)`` is asked of the DequantizeLinear each
    would become (built on a clone first, so the model is changed only for those it keeps):
    None to rewrite it, else the reason to leave it. A DequantizeLinear whose form needs a
    newer ai.onnx version than the model imports carries that version itself
    (``node.version``), as the fold removes it. Returns the patterns rewritten (the name
    of their last node), those left with why, and the outputs of the DequantizeLinear nodes
    made (which the fold must fold whatever their names)."""
    opset = _ai_onnx(model.opset_imports) or 0
    left: list[tuple[str, str]] = []
    if not found(model):
        return [], left, []
    graph.sort_if_needed(model)  # a copy needs its graphs in order (a cycle is refused)
    chosen = _chosen_in_clone(model, keep, left)
    names = Names(model)
    done: list[str] = []
    made: list[str] = []
    for f in found(model):
        if f.record.output not in chosen:
            continue
        form = f.decision.form
        assert form is not None
        for n in _apply(f, form, names):
            if n.op_type == "DequantizeLinear":
                if form.min_opset > opset:
                    n.version = form.min_opset
                made.append(n.outputs[0].name or "")
        done.append(f.record.nodes[-1])
    return done, left, made


def _chosen_in_clone(model: ir.Model, keep: Callable[[ir.Node], str | None],
                     left: list[tuple[str, str]]) -> set[str]:
    """The outputs of the patterns ``keep`` picks, asked of the DequantizeLinear each
    becomes in a clone of ``model``; the others join ``left`` with why."""
    work = model.clone()
    names = Names(work)
    chosen: set[str] = set()
    for f in found(work):
        r, form = f.record, f.decision.form
        if not r.rewritable or form is None:
            left.append((r.nodes[-1], "; ".join(r.reasons) or "not constant"))
            continue
        dq = next(n for n in _apply(f, form, names) if n.op_type == "DequantizeLinear")
        dq.version = max(form.min_opset, _ai_onnx(work.opset_imports) or 0)
        why = keep(dq)
        if why is None:
            chosen.add(r.output)
        else:
            left.append((r.nodes[-1], why))
    return chosen

"""``find``: every hand-written dequantization of a model (main graph, subgraphs,
model-local functions), as ``Handwritten`` records."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from dqtool import graph
from dqtool.handwritten import chains, forms
from dqtool.handwritten.records import Handwritten


@dataclass(frozen=True)
class Found:
    """A match, its decision and its record (what ``rewrite`` and ``fold`` work from)."""

    match: chains.Match
    decision: forms.Decision
    record: Handwritten


def node_label(node: ir.Node) -> str:
    if node.name:
        return node.name
    owner = node.graph
    index = next((i for i, n in enumerate(owner) if n is node), -1) if owner is not None else -1
    return f"{node.op_type}#{index}"


def _record(m: chains.Match, d: forms.Decision) -> Handwritten:
    zp_constant = m.zero_point is None or graph.constant_tensor(m.zero_point) is not None
    scale_constant = graph.constant_tensor(m.scale) is not None
    form = d.form
    layout = form.layout if form is not None else d.layout
    nodes = m.nodes if form is None or form.absorbs_after or m.after is None \
        else m.nodes[:-1]
    out = nodes[-1].outputs[0]
    return Handwritten(
        graph=m.site.graph, nodes=tuple(node_label(n) for n in nodes),
        ops=tuple(n.op_type for n in nodes), output=out.name or "",
        consumers=tuple(sorted({u.node.op_type for u in out.uses()})),
        codes=m.codes.source.name or "", stored_type=graph.elem_type(m.codes.source) or "",
        codes_type=d.codes_type or "", unpacked=m.codes.unpacked, float_type=m.float_type,
        scale=m.scale.name or "", scale_type=graph.elem_type(m.scale),
        granularity=None if layout is None else layout.granularity,
        axis=None if layout is None else layout.axis,
        block_size=None if layout is None else layout.block_size,
        shape=None if layout is None else layout.shape,
        scale_shape=None if layout is None else layout.param_shape,
        zero_point=d.zero_point, zero_point_where=d.zero_point_where,
        scale_constant=scale_constant, zero_point_constant=zp_constant,
        rewritable=scale_constant and zp_constant, exact=form is not None,
        min_opset=None if form is None else form.min_opset,
        form=None if form is None else form.describe(), reasons=d.reasons, notes=d.notes)


def found(model: ir.Model) -> list[Found]:
    """Every match of ``model`` with its decision and record, in graph order."""
    out = []
    for site in graph.walk(model):
        m = chains.match(site)
        if m is None:
            continue
        d = forms.decide(m)
        if d is not None:
            out.append(Found(m, d, _record(m, d)))
    return out


def find(model: ir.Model) -> tuple[Handwritten, ...]:
    """Every hand-written dequantization of ``model``: ``Cast(codes) → [Sub zero point] →
    Mul(scale)`` with constant integer codes, in any of the forms
    ``docs/handwritten.md`` lists. Reads the data of zero points, of codes computed by
    integer operators (unpacking) and of 16/32-bit codes whose exactness depends on
    their values; never modifies the model."""
    return tuple(f.record for f in found(model))

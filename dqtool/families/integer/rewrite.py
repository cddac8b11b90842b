"""What both directions of the integer ⇄ QDQ rewrite share: fresh names, the
report of what changed and what was refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from dqtool import graph
from dqtool.convert.report import NodeRefusal as Refusal  # one refusal record for every rewrite


@dataclass(frozen=True)
class Change:
    node: str
    graph: str
    op: str  # "ai.onnx:QLinearConv"
    into: str  # "DequantizeLinear ×3 → Conv → QuantizeLinear"

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "graph": self.graph, "op": self.op, "into": self.into}


@dataclass
class IntegerRewrites:
    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    # the ai.onnx opset some refused node needs (the highest), where that alone refused it
    needs_opset: int | None = None


class Refused(Exception):
    """One node cannot be rewritten; the message is the reason. ``needs_opset``: the
    ai.onnx opset that would express it, when the model's is too old."""

    def __init__(self, reason: str, needs_opset: int | None = None) -> None:
        super().__init__(reason)
        self.needs_opset = needs_opset


def node_label(node: ir.Node) -> str:
    return node.name or f"<unnamed {node.op_type}>"


def drop_if_unused(values: list[ir.Value | None]) -> None:
    """Remove what a rewrite left without a use: initializers, and the producers (a scale
    product ``Mul``, a ``Cast``, a ``Constant``) of values nothing reads any more; then
    their inputs in turn. Values the input model already left unused are not touched."""
    todo = [v for v in values if v is not None]
    while todo:
        v = todo.pop()
        if v.uses() or v.is_graph_output() or v.is_graph_input():
            continue
        g = v.graph
        if v.is_initializer() and g is not None and v.name in g.initializers:
            del g.initializers[v.name]
            continue
        p = v.producer()
        if p is None or p.graph is None or p.op_type not in _DROPPABLE:
            continue
        if any(o.uses() or o.is_graph_output() for o in p.outputs):
            continue
        inputs = list(p.inputs)
        p.graph.remove(p, safe=True)
        todo += [i for i in inputs if i is not None]


# Producers the rewrites detach: ORT's dynamic pattern (scale product Mul, Cast), constants.
_DROPPABLE = frozenset({"Mul", "Cast", "Constant", "DequantizeLinear", "QuantizeLinear"})


def prune_opset_imports(model: ir.Model, domain: str) -> None:
    """Drop ``domain`` from the opset imports once no node uses it."""
    if any(s.node.domain == domain for s in graph.walk(model)):
        return
    model.opset_imports.pop(domain, None)
    model.graph.opset_imports.pop(domain, None)

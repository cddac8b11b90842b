"""``FusionBuilder``: the new nodes and constants of one fusion into an integer operator,
put in the graph in one step in place of the float op (and the QuantizeLinear after it)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.building import Builder
from dqtool.families.integer.rewrite import drop_if_unused
from dqtool.integer.to_qoperator_match import Dq
from dqtool.names import Names


class FusionBuilder(Builder):
    """New nodes for one fusion, inserted before the float op; nothing changes before
    ``replace``."""

    def __init__(self, node: ir.Node, names: Names) -> None:
        """Nothing made yet: ``node`` is the float op being fused."""
        super().__init__(node, names, defer=True)
        self.base = node.name or node.op_type

    def add(self, domain: str, op: str, inputs: list[ir.Value | None], attrs=(),
            name: str | None = None, n_out: int = 1) -> ir.Node:
        """A new node (not yet in the graph), named ``name`` or afresh."""
        n = ir.Node(domain, op, inputs, list(attrs), num_outputs=n_out,
                    name=name if name is not None else self.names.fresh(f"{self.base}/{op}"))
        for o in n.outputs:
            o.name = self.names.fresh(f"{self.base}/{op}_output")
        return self.add_node(n)

    def zero(self, like: ir.Value) -> ir.Value:
        """A new zero-point constant 0 of ``like``'s element type (uint8 when unknown)."""
        t = graph.elem_type(like) or "uint8"
        name = self.names.fresh(f"{self.base}/zero_point")
        return self.place(ir.tensor(np.zeros((), types.by_name(t).dtype), name=name), name,
                          "zero_point")

    def constant_node_name(self, name: str, role: str) -> str | None:
        return name  # (a Constant node is named as its output)

    def replace(self, old: ir.Value, new: ir.Value, removed: list[ir.Node]) -> None:
        """Put the new nodes in, move every use of ``old`` to ``new`` (keeping a graph
        output's name), remove ``removed`` and the constants only they read."""
        self.insert()
        new.type, new.shape = old.type, old.shape  # (unknown ones too)
        self.take_over(old, new)
        detached: list[ir.Value | None] = []
        for n in removed:
            detached += list(n.inputs)
        for n in removed:
            self.graph.remove(n, safe=True)
        drop_if_unused(detached)


def name_of(node: ir.Node, names: Names) -> str:
    """The fused op takes the float op's name (the integer op's, after a round trip)."""
    name = node.name or names.fresh(node.op_type)
    node.name = names.fresh(f"{name}_fused")
    return name


def zp_or_zero(e: FusionBuilder, d: Dq) -> ir.Value:
    """``d``'s zero point, or a new 0 of its type: the integer operators' zero points are
    not optional everywhere the DequantizeLinear's is."""
    return d.zp if d.zp is not None else e.zero(d.x)

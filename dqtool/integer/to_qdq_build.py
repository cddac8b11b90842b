"""The building blocks of the rewrite to QDQ: ``QdqBuilder``, which makes the new nodes and
constants of one rewritten integer operator and puts them in its graph in one step."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.building import Builder
from dqtool.families.integer.rewrite import Refused, drop_if_unused
from dqtool.names import Names

FLOAT = ir.DataType.FLOAT


class QdqBuilder(Builder):
    """New nodes for one rewritten node, inserted before it in its graph; nothing is
    changed before ``commit`` (a ``Refused`` half way leaves the graph as it was)."""

    def __init__(self, node: ir.Node, names: Names, opsets: dict[str, int]) -> None:
        """Nothing is made yet: ``node`` is the integer operator being rewritten."""
        super().__init__(node, names, defer=True)
        self.opsets = opsets
        self.base = node.name or node.op_type

    def add(self, op: str, inputs: list[ir.Value | None], attrs: list[ir.Attr] | None = None,
            suffix: str = "", n_out: int = 1, out_type: ir.DataType | None = FLOAT,
            name: str | None = None, domain: str = "") -> ir.Node:
        """A new node (not yet in the graph) with fresh names; its first output typed
        ``out_type``."""
        n = ir.Node(domain, op, trim(inputs), attrs or [], num_outputs=n_out,
                    name=name or self.names.fresh(f"{self.base}/{suffix or op}"))
        for i, o in enumerate(n.outputs):
            o.name = self.names.fresh(f"{self.base}/{suffix or op}_output_{i}")
        if out_type is not None:
            n.outputs[0].dtype = out_type
        return self.add_node(n)

    def dequantize(self, value: ir.Value, scale: ir.Value | None, zp: ir.Value | None,
                   axis: int | None, role: str) -> ir.Value:
        """The float value of ``value``: a new DequantizeLinear (per-axis along ``axis``
        unless it is None); ``Refused`` when the model's opset or the parameters cannot
        express it."""
        if scale is None:
            raise Refused(f"input '{role}' has no scale")
        attrs = []
        if axis is not None:
            if (graph.opset_of(self.opsets, "") or 0) < 13:
                raise Refused(f"'{role}' is per-axis, which DequantizeLinear takes from "
                              "ai.onnx opset 13", needs_opset=13)
            attrs.append(ir.AttrInt64("axis", axis))
            scale, zp = self._matched(scale, zp, role)
        return self.add("DequantizeLinear", [value, scale, zp], attrs,
                        suffix=f"DequantizeLinear_{role}").outputs[0]

    def _matched(self, scale: ir.Value, zp: ir.Value | None, role: str
                 ) -> tuple[ir.Value, ir.Value | None]:
        """A per-axis scale and zero point of one length, as DequantizeLinear takes them:
        the single-element one of the two (a per-column zero point beside one scale, which
        onnxruntime's MatMulInteger takes) becomes a constant of the other's length, the
        same value in every place (so the same products)."""
        if zp is None:
            return scale, zp
        ns, nz = (graph.num_elements(graph.shape_of(v)) for v in (scale, zp))
        if ns is None or nz is None or ns == nz:
            return scale, zp
        if 1 not in (ns, nz):
            raise Refused(f"'{role}' has {ns} scales and {nz} zero points")
        one, n, what = (scale, nz, "scale") if ns == 1 else (zp, ns, "zero point")
        arr = graph.constant_array(one)
        if arr is None:
            raise Refused(f"'{role}' is per-axis in its {'zero point' if ns == 1 else 'scale'}"
                          f" but its one {what} is computed at run time: DequantizeLinear "
                          "takes a scale and a zero point of one shape")
        wide = self.constant(f"{what.replace(' ', '_')}_per_axis",
                             np.full((n,), arr.reshape(-1)[0], arr.dtype))
        return (wide, zp) if ns == 1 else (scale, wide)

    def constant(self, base: str, arr: np.ndarray) -> ir.Value:
        """A new constant holding ``arr`` (an initializer, registered by ``commit``)."""
        name = self.names.fresh(f"{self.base}/{base}")
        return self.place(ir.tensor(arr, name=name), name, base)

    def constant_node_name(self, name: str, role: str) -> str | None:
        return name  # (a Constant node is named as its output)

    def commit(self) -> None:
        """Insert the new nodes and constants (nothing is changed before this)."""
        self.insert()

    def finish(self, old: list[ir.Value], new: list[ir.Value],
               detached: list[ir.Value | None] = ()) -> None:
        """Put the new nodes in, move every use of ``old`` to ``new``, drop the node."""
        self.commit()
        for o, n in zip(old, new, strict=True):
            self.take_over(o, n)
        inputs = list(self.node.inputs)
        self.graph.remove(self.node, safe=True)
        drop_if_unused([*inputs, *detached])


def trim(inputs: list[ir.Value | None]) -> list[ir.Value | None]:
    """``inputs`` without its trailing absent ones (an ONNX node's optional inputs)."""
    out = list(inputs)
    while out and out[-1] is None:
        out.pop()
    return out

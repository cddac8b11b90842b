"""Finding the operators of a hand-written dequantization around one Mul.

``Cast(codes → float) [→ Reshape] [→ Sub/Add zero point] [→ Reshape] → Mul(scale)
[→ Reshape]``, with the Mul's operands in either order, and before the Cast any constant
integer computation (``integers.trace``). Only the structure is read here; what it means,
and whether a DequantizeLinear says the same, is ``forms``.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from dqtool import graph, types
from dqtool.handwritten import integers

FLOAT_TYPES = frozenset({"float", "float16", "bfloat16", "double"})
# The codes types a DequantizeLinear can read (int64 is not one: a Cast of an int64
# constant is shape arithmetic, not dequantization).
CODES_TYPES = frozenset({"int2", "uint2", "int4", "uint4", "int8", "uint8", "int16",
                         "uint16", "int32"})
MAX_FLOAT_STEPS = 6  # Reshapes and one Sub between the Cast and the Mul


@dataclass(frozen=True)
class Match:
    """One hand-written dequantization, as operators."""

    site: graph.Site  # the Mul's
    mul: ir.Node
    cast: ir.Node  # codes → float
    codes: integers.Codes
    between: tuple[ir.Node, ...]  # Reshape / Sub / Add from the Cast to the Mul, in order
    zero_point: ir.Value | None  # the Sub's (or Add's) other operand
    zp_added: bool  # an Add: the zero point is the negated operand
    zp_reshaped: bool  # a Reshape lies between the Sub and the Mul
    scale: ir.Value
    after: ir.Node | None  # a Reshape reading only the Mul's output (blocks merged back)

    @property
    def float_type(self) -> str:
        t = types.from_onnx_int(int(self.cast.attributes["to"].value))
        assert t is not None
        return t.name

    @property
    def nodes(self) -> tuple[ir.Node, ...]:
        tail = (self.after,) if self.after is not None else ()
        return (*self.codes.nodes, self.cast, *self.between, self.mul, *tail)


def _default(node: ir.Node | None) -> bool:
    return node is not None and node.domain in graph.DEFAULT_DOMAINS


def _constant_shape(node: ir.Node) -> bool:
    return graph.constant_tensor(graph.input_value(node, 1)) is not None


def _float_cast(node: ir.Node) -> bool:
    to = node.attributes.get("to")
    t = types.from_onnx_int(int(to.value)) if to is not None and isinstance(to.value, int) \
        else None
    return t is not None and t.name in FLOAT_TYPES


def _zp_operand(node: ir.Node) -> tuple[ir.Value, ir.Value, bool] | None:
    """(the chain's operand, the zero point's, added?) of a Sub or Add; the chain is the
    operand that is not a constant (a Sub's first: ``zp - x`` is no dequantization)."""
    a, b = graph.input_value(node, 0), graph.input_value(node, 1)
    if a is None or b is None:
        return None
    if node.op_type == "Sub":
        return a, b, False
    if graph.constant_tensor(a) is not None and graph.constant_tensor(b) is None:
        return b, a, True
    return a, b, True


def _walk(v: ir.Value) -> tuple[ir.Node, tuple[ir.Node, ...], tuple | None, bool] | None:
    """From a Mul operand back to its Cast: (cast, the nodes between in order, the zero
    point (value, added) or None, a Reshape lies between the Sub and the Mul)."""
    between: list[ir.Node] = []
    zp: tuple[ir.Value, bool] | None = None
    reshaped_after_zp = False
    for _ in range(MAX_FLOAT_STEPS):
        p = v.producer()
        if not _default(p):
            return None
        assert p is not None
        if p.op_type == "Cast":
            if not _float_cast(p) or graph.input_value(p, 0) is None:
                return None
            return p, tuple(reversed(between)), zp, reshaped_after_zp
        if p.op_type == "Reshape" and _constant_shape(p):
            between.append(p)
            if zp is None:
                reshaped_after_zp = True
            nxt = graph.input_value(p, 0)
        elif p.op_type in ("Sub", "Add") and zp is None:
            parts = _zp_operand(p)
            if parts is None:
                return None
            between.append(p)
            nxt, zp = parts[0], (parts[1], parts[2])
        else:
            return None
        if nxt is None:
            return None
        v = nxt
    return None


def _after(mul: ir.Node) -> ir.Node | None:
    out = mul.outputs[0]
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    user = uses[0].node
    if user.op_type == "Reshape" and _default(user) and uses[0].idx == 0 \
            and _constant_shape(user):
        return user
    return None


def match(site: graph.Site) -> Match | None:
    """The hand-written dequantization whose Mul is ``site.node``, or None."""
    mul = site.node
    if mul.op_type != "Mul" or not _default(mul) or len(mul.inputs) != 2:
        return None
    for i in (0, 1):
        codes_side, scale = mul.inputs[i], mul.inputs[1 - i]
        if codes_side is None or scale is None:
            continue
        found = _walk(codes_side)
        if found is None:
            continue
        cast, between, zp, zp_reshaped = found
        x = graph.input_value(cast, 0)
        assert x is not None
        codes = integers.trace(x)
        if codes is None or graph.elem_type(codes.source) not in CODES_TYPES:
            continue
        return Match(site, mul, cast, codes, between, None if zp is None else zp[0],
                     bool(zp and zp[1]), bool(zp) and zp_reshaped, scale, _after(mul))
    return None

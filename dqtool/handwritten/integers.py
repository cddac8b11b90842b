"""The integer side of a hand-written dequantization: the constant codes, and whatever
integer operators compute them before the Cast to float (a widening Cast, a Sub of a zero
point, a BitShift/BitwiseAnd unpacking of packed int4, Reshape/Concat/Unsqueeze …).

Those operators only move or combine integers, so their result is a constant this module
computes with NumPy in the operator's own type: integer arithmetic wraps in both runtimes
alike (measured, ``docs/handwritten.md#measured``), and so does NumPy's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.handwritten.layout import reshape_target

# Operators whose output is an exact function of integer inputs; a chain of anything else
# before the Cast is not read as codes.
INTEGER_OPS = frozenset({"Cast", "Sub", "Add", "BitwiseAnd", "BitwiseOr", "BitShift",
                         "Unsqueeze", "Squeeze", "Concat", "Reshape", "Transpose", "Identity",
                         "Flatten"})
UNPACKING = frozenset({"BitShift", "BitwiseAnd", "BitwiseOr"})
MAX_NODES = 32  # a longer integer computation is not a dequantization's codes
_INT_NAMES = frozenset(t.name for t in types.TYPES.values() if t.is_integer)


def is_integer(value: ir.Value | None) -> bool:
    return graph.elem_type(value) in _INT_NAMES


@dataclass(frozen=True)
class Codes:
    """The integer constant computation a Cast to float reads: ``nodes`` in topological
    order (empty when the Cast reads a constant directly), ``source`` the constant its
    first inputs lead back to (the stored codes)."""

    value: ir.Value  # what the Cast reads
    nodes: tuple[ir.Node, ...]
    source: ir.Value

    @property
    def unpacked(self) -> bool:
        return any(n.op_type in UNPACKING for n in self.nodes)

    def array(self) -> np.ndarray:
        """The codes' values, as the model computes them (reads tensor data)."""
        return evaluate(self.value, self.nodes)


def trace(value: ir.Value) -> Codes | None:
    """The constant integer computation behind ``value``, or None when any of it is
    computed at run time or by an operator outside ``INTEGER_OPS``."""
    nodes: list[ir.Node] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if graph.constant_tensor(v) is not None:
            continue
        p = v.producer()
        if p is None or p.op_type not in INTEGER_OPS or p.domain not in graph.DEFAULT_DOMAINS:
            return None
        if p.op_type == "Cast" and not _to_integer(p):
            return None
        if id(p) in seen:
            continue
        seen.add(id(p))
        nodes.append(p)
        if len(nodes) > MAX_NODES:
            return None
        stack.extend(i for i in p.inputs if i is not None)
    source = value
    while graph.constant_tensor(source) is None:
        producer = source.producer()
        assert producer is not None and producer.inputs and producer.inputs[0] is not None
        source = producer.inputs[0]
    order = {id(n): i for i, n in enumerate(_graph_nodes(nodes))}
    return Codes(value, tuple(sorted(nodes, key=lambda n: order[id(n)])), source)


def _to_integer(cast: ir.Node) -> bool:
    to = _attr(cast, "to")
    t = types.from_onnx_int(int(to)) if isinstance(to, int) else None  # type: ignore[arg-type]
    return t is not None and t.is_integer


def _graph_nodes(nodes: list[ir.Node]) -> list[ir.Node]:
    if not nodes or nodes[0].graph is None:
        return nodes
    wanted = {id(n) for n in nodes}
    return [n for n in nodes[0].graph if id(n) in wanted]


def _attr(node: ir.Node, name: str, default: object = None) -> object:
    a = node.attributes.get(name)
    return default if a is None else a.value


def _axes(node: ir.Node, env: dict[int, np.ndarray]) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return [int(a) for a in env[id(node.inputs[1])].reshape(-1)]
    axes = _attr(node, "axes")
    return None if axes is None else [int(a) for a in axes]  # type: ignore[union-attr]


def _unsqueeze(node: ir.Node, a: np.ndarray, env: dict[int, np.ndarray]) -> np.ndarray:
    axes = _axes(node, env) or []
    rank = a.ndim + len(axes)
    for ax in sorted(x % rank for x in axes):
        a = np.expand_dims(a, ax)
    return a


def _squeeze(node: ir.Node, a: np.ndarray, env: dict[int, np.ndarray]) -> np.ndarray:
    axes = _axes(node, env)
    return np.squeeze(a) if axes is None else np.squeeze(a, tuple(x % a.ndim for x in axes))


def _reshape(node: ir.Node, a: np.ndarray, env: dict[int, np.ndarray]) -> np.ndarray:
    target = reshape_target(a.shape, [int(d) for d in env[id(node.inputs[1])].reshape(-1)],
                            bool(_attr(node, "allowzero", 0)))
    if target is None:
        raise ValueError(f"Reshape '{node.name}' cannot give that shape")
    return a.reshape(target)


def _shift(node: ir.Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    if np.any(b >= bits):  # the C++ shift is undefined there: not read as codes
        raise ValueError(f"BitShift '{node.name}' shifts by {bits} bits or more")
    right = _attr(node, "direction") == "RIGHT"
    return (np.right_shift if right else np.left_shift)(a, b.astype(a.dtype)).astype(a.dtype)


def _flatten(node: ir.Node, a: np.ndarray) -> np.ndarray:
    axis = int(_attr(node, "axis", 1)) % (a.ndim + 1)  # type: ignore[arg-type]
    return a.reshape(int(np.prod(a.shape[:axis])), -1)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Sub": np.subtract, "Add": np.add, "BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or,
}


def _step(node: ir.Node, env: dict[int, np.ndarray]) -> np.ndarray:
    ins = [None if v is None else env[id(v)] for v in node.inputs]
    a = ins[0]
    assert a is not None
    op = node.op_type
    if op in _BINARY:
        b = ins[1]
        assert b is not None
        with np.errstate(over="ignore"):  # wraps in the operator's type, as both runtimes do
            return _BINARY[op](a, b, dtype=a.dtype)
    if op == "BitShift":
        assert ins[1] is not None
        return _shift(node, a, ins[1])
    if op == "Cast":
        t = types.from_onnx_int(int(_attr(node, "to")))  # type: ignore[arg-type]
        assert t is not None and t.is_integer
        return a.astype(t.dtype)
    if op == "Concat":
        return np.concatenate([i for i in ins if i is not None],
                              axis=int(_attr(node, "axis")))  # type: ignore[arg-type]
    if op == "Transpose":
        perm = _attr(node, "perm")
        return np.transpose(a, None if perm is None else [int(p) for p in perm])  # type: ignore[union-attr]
    if op == "Unsqueeze":
        return _unsqueeze(node, a, env)
    if op == "Squeeze":
        return _squeeze(node, a, env)
    if op == "Reshape":
        return _reshape(node, a, env)
    if op == "Flatten":
        return _flatten(node, a)
    return a  # Identity


def evaluate(value: ir.Value, nodes: tuple[ir.Node, ...]) -> np.ndarray:
    """``value`` computed from constants through ``nodes`` (topologically ordered)."""
    env: dict[int, np.ndarray] = {}
    for node in nodes:
        for v in node.inputs:
            if v is not None and id(v) not in env:
                arr = graph.constant_array(v)
                if arr is None:
                    raise ValueError(f"'{v.name}' is not constant")
                env[id(v)] = arr
        env[id(node.outputs[0])] = np.asarray(_step(node, env))
    if id(value) in env:
        return env[id(value)]
    arr = graph.constant_array(value)
    assert arr is not None
    return arr

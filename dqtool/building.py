"""New nodes and constants next to one node being rewritten: the one builder every rewrite
builds with (the conversion adapters' ``convert.context.Step``, the fused rewrites and
pack's ``families.fused.surgery.FusedBuilder``, the integer rewrites, the hand-written
rewrite).

- Where new nodes go: into ``nodes``, until ``insert()`` puts them before the node (in
  its graph, or its function's), or the caller places them itself.
- How a constant is made: an initializer of ``home`` (the node's graph unless told) in a
  graph; in a function, which has no initializers, a Constant node among ``nodes``. Its
  tensor is computed when the model is saved where the caller gives a compute function
  (``lazy``), or handed to the save's ``EarlyWriter`` where one is given (``early``).
- Fresh names through ``dqtool.names.Names``; each user keeps its own naming scheme (the
  names are part of what a rewrite promises: tests and docs check them).
- What it made: ``created`` (the constants' names, for reports and clean-up).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from dqtool import types
from dqtool.names import Names

if TYPE_CHECKING:
    from dqtool.storage import EarlyWriter

Made = ir.TensorProtocol | np.ndarray


class Builder:
    """The new nodes and constants of one rewrite of ``node`` (see the module docstring)."""

    def __init__(self, node: ir.Node, names: Names, *, in_function: bool = False,
                 home: ir.Graph | None = None, early: EarlyWriter | None = None,
                 defer: bool = False) -> None:
        """``in_function``: ``node`` is in a function (constants are Constant nodes).
        ``home``: the graph new initializers go to (default: ``node``'s). ``early``: the
        save's writer when it writes the data file while the model is rewritten.
        ``defer``: initializers are registered by ``insert()`` rather than as they are
        made, so a rewrite that gives up half way leaves the graph as it was."""
        self.node = node
        self.graph = node.graph
        self.names = names
        self.in_function = in_function or names.in_function(node)
        self.home = home if home is not None else node.graph
        self.early = early
        self.defer = defer
        self.nodes: list[ir.Node] = []  # made, not yet in the graph
        self.initializers: list[ir.Value] = []  # made, not yet registered (``defer``)
        self.created: set[str] = set()  # the names of the constants made

    # --- constants ---------------------------------------------------------------------

    def lazy(self, name: str, dtype: ir.DataType, shape: Sequence[int],
             compute: Callable[[], Made]) -> ir.TensorProtocol:
        """A tensor computed only when it is needed (``LazyTensor``), so a rewrite never
        holds every weight in memory at once; ``compute`` gives an array or a tensor."""
        return ir.LazyTensor(checked(compute, dtype, shape, name), dtype=dtype,
                             shape=ir.Shape(shape), name=name)

    def array(self, name: str, arr: np.ndarray, dtype: ir.DataType | None = None
              ) -> ir.TensorProtocol:
        """A tensor holding ``arr`` now (of ``dtype``, else ``arr``'s type)."""
        arr = np.asarray(arr)
        return ir.Tensor(arr, dtype=dtype or types.from_dtype(arr.dtype).ir_type, name=name)

    def place(self, tensor: ir.TensorProtocol, name: str, role: str) -> ir.Value:
        """A constant value ``name`` holding ``tensor``: an initializer of ``home``, or in a
        function the output of a new Constant node (named by ``constant_node_name``)."""
        dtype, shape = tensor.dtype, ir.Shape([int(d) for d in tensor.shape])
        tensor.name = name
        self.created.add(name)
        if self.in_function:
            cnode = ir.node("Constant", [], {"value": tensor},
                            name=self.constant_node_name(name, role))
            out = cnode.outputs[0]
            out.name, out.dtype, out.shape = name, dtype, shape
            self.nodes.append(cnode)
            return out
        value = ir.Value(name=name, const_value=tensor, type=ir.TensorType(dtype), shape=shape)
        if self.defer:
            self.initializers.append(value)
        else:
            self.home.register_initializer(value)
        return value

    def constant_node_name(self, name: str, role: str) -> str | None:
        """The name of the Constant node holding constant ``name`` in a function (asked only
        there: a node name taken costs the names after it)."""
        return self.names.node(f"{self.node.name}/{role}")

    def drop_constant(self, value: ir.Value) -> None:
        """Take back constant ``value``, made here and no longer read."""
        made = value.producer()
        if made is not None and any(n is made for n in self.nodes):
            self.nodes.remove(made)
        elif value in self.initializers:
            self.initializers.remove(value)
        else:
            self.home.initializers.pop(value.name or "", None)

    # --- nodes -------------------------------------------------------------------------

    def add_node(self, node: ir.Node) -> ir.Node:
        """``node`` made for the rewrite, put in with the others by ``insert()``."""
        self.nodes.append(node)
        return node

    def insert(self) -> None:
        """Register the pending initializers and put the new nodes before ``node``."""
        for v in self.initializers:
            self.home.register_initializer(v)
        self.graph.insert_before(self.node, self.nodes)
        self.nodes, self.initializers = [], []

    def take_over(self, old: ir.Value, new: ir.Value) -> None:
        """``new`` takes ``old``'s place: its type, shape, consumers and graph outputs; a
        graph output keeps its name (``old`` is renamed ``<name>_replaced``)."""
        new.shape = old.shape if old.shape is not None else new.shape
        if old.type is not None:
            new.type = old.type
        was_output, name = old.is_graph_output(), old.name
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        if was_output:  # keep the model's output names
            old.name = self.names.fresh(f"{name}_replaced")
            new.name = name


def checked(compute: Callable[[], Made], dtype: ir.DataType, shape: Sequence[int],
            name: str) -> Callable[[], ir.TensorProtocol]:
    """``compute`` giving a tensor (an array becomes one), its shape checked."""
    want = tuple(int(d) for d in shape)

    def tensor() -> ir.TensorProtocol:
        t = compute()
        assert tuple(int(d) for d in t.shape) == want, (name, tuple(t.shape), want)
        if isinstance(t, np.ndarray):  # (a scalar's array is 1-D: the declared shape holds)
            t = ir.Tensor(np.ascontiguousarray(t), dtype=dtype, name=name)
        return t

    return tensor

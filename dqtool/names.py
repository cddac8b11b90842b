"""Names for what a rewrite adds to a model: the one allocator every transform uses
(conversion adapters, the fold pass, pack, the integer rewrites).

A model is read once (``Names(model)``); then each name handed out is recorded, so a rewrite
adding thousands of values never scans the graph again. Value names are unique across the
whole model, every graph, subgraph and function, because a helper value may be read from
any scope below its graph; node names are kept apart (onnxruntime refuses two nodes of one
name). A name is ``base``, or ``base_1``, ``base_2``, ... (deterministic).
"""

from __future__ import annotations

import onnx_ir as ir

from dqtool import graph


class Names:
    """Fresh value and node names for one model (see the module docstring).

    ``avoid_node_names``: value names also stay clear of node names (the integer rewrites
    name a node and its output alike).
    """

    def __init__(self, model: ir.Model, *, avoid_node_names: bool = False) -> None:
        self._taken: set[str] = set()  # value names, anywhere in the model
        self._nodes: set[str] = set()
        # value names per scope: the main graph with its subgraphs (None), each function
        # with its subgraphs (two functions may both have a value named ``B``)
        self._scopes: dict[int | None, set[str]] = {None: set()}
        self._in_functions: set[int] = set()  # the graphs of functions and their subgraphs
        for site in graph.walk(model):
            scope = self._scopes.setdefault(_scope(site.function), set())
            if site.function is not None and site.node.graph is not None:
                self._in_functions.add(id(site.node.graph))
            if site.node.name:
                self._nodes.add(site.node.name)
            for v in (*site.node.inputs, *site.node.outputs):
                if v is not None and v.name:
                    scope.add(v.name)
        for g in model.graphs():
            self._scopes[None].update(v.name for v in (*g.inputs, *g.outputs) if v.name)
            self._scopes[None].update(g.initializers)
        for f in model.functions.values():
            self._scopes.setdefault(id(f), set()).update(
                v.name for v in (*f.inputs, *f.outputs) if v.name)
        for names in self._scopes.values():
            self._taken |= names
        if avoid_node_names:
            self._taken |= self._nodes

    def __call__(self, base: str) -> str:
        """A value name nothing in the model has."""
        name, i = base, 1
        while name in self._taken:
            name, i = f"{base}_{i}", i + 1
        self._taken.add(name)
        return name

    fresh = __call__

    def node(self, base: str) -> str:
        """A node name no node of the model has: a new node named after the one it
        replaces may meet a name the model already uses."""
        name, i = base, 1
        while name in self._nodes:
            name, i = f"{base}_{i}", i + 1
        self._nodes.add(name)
        return name

    def in_function(self, node: ir.Node) -> bool:
        """Whether ``node`` is in a function (or a subgraph of one), where a constant is a
        Constant node: a function has no initializers."""
        return node.graph is not None and id(node.graph) in self._in_functions

    def claim(self, name: str, function: ir.Function | None = None) -> bool:
        """Take ``name`` itself for a value of ``function``'s scope (None: the main
        graph's) if nothing in that scope has it; whether it was free. (A name given back,
        as pack gives the original's names back, need only be unique where it is read.)"""
        scope = self._scopes.setdefault(_scope(function), set())
        if name in scope:
            return False
        scope.add(name)
        self._taken.add(name)
        return True


def _scope(function: ir.Function | None) -> int | None:
    return None if function is None else id(function)

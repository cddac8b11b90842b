"""After a rewrite (a fold, a conversion): drop constants nothing uses, drop opset imports
nothing needs, hand out fresh value names. One module for every transform, so they clean
up alike."""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from dqtool import graph, registry


def _used(v: ir.Value) -> bool:
    return bool(v.uses()) or v.is_graph_output() or v.is_graph_input()


def _remove(v: ir.Value, producers: frozenset[str]) -> list[ir.Value] | None:
    """Remove what holds ``v`` (an initializer, or a node of ``producers``); None if it is
    held by anything else. Returns the removed producer's inputs."""
    owner = v.graph
    if v.is_initializer() and owner is not None:
        owner.initializers.pop(v.name or "", None)
        return []
    producer = v.producer()
    if producer is None or producer.op_type not in producers:
        return None
    if any(_used(o) for o in producer.outputs):
        return None
    assert producer.graph is not None
    inputs = [i for i in producer.inputs if i is not None]  # removal detaches them
    producer.graph.remove(producer, safe=True)
    return inputs


FOLD_PRODUCERS = frozenset({"Constant", "QuantizeLinear"})


def remove_unused(values: Iterable[ir.Value], producers: frozenset[str] = FOLD_PRODUCERS
                  ) -> tuple[list[str], list[str]]:
    """Remove the initializers and the ``producers`` nodes (by default Constant and
    QuantizeLinear: a fold computes the Q of a Q→DQ pair) of ``values`` that nothing uses,
    following producers upwards. Returns the (removed, kept) constant names."""
    pending = {id(v): v for v in values}
    removed: list[str] = []
    changed = True
    while changed:  # until nothing more frees up: a Q's removal frees its scale, ...
        changed = False
        for key, v in list(pending.items()):
            if _used(v):
                continue
            constant = graph.constant_tensor(v) is not None
            freed = _remove(v, producers)
            del pending[key]
            if freed is None:
                continue
            changed = True
            if constant:
                removed.append(v.name or "")
            pending.update((id(i), i) for i in freed)
    kept = [v.name or "" for v in pending.values() if graph.constant_tensor(v) is not None]
    return sorted(set(removed)), sorted(set(kept))


def _domains(nodes: Iterable[graph.Site]) -> set[str]:
    return {s.node.domain for s in nodes}


def used_domains(model: ir.Model) -> dict[str | None, set[str]]:
    """Node domains used per scope: None for the model, a function's identifier else."""
    sites = list(graph.walk(model))
    out: dict[str | None, set[str]] = {None: _domains(sites)}
    for key, fn in model.functions.items():
        out[str(key)] = _domains(s for s in sites if s.function is fn)
    return out


def prune_opsets(model: ir.Model, before: dict[str | None, set[str]] | None = None) -> None:
    """Drop imports of domains no node uses any more, scope by scope: with ``before``
    (``used_domains`` before the rewrite), only those whose nodes the rewrite removed;
    without, every one no node uses. The model keeps an import while any node anywhere
    (functions included) uses it. Only the families' prunable domains are dropped; any
    other import (a function's domain, ...) stays."""
    after = used_domains(model)
    prunable = registry.prunable_domains()
    for key, holder in [(None, model), *((str(k), fn) for k, fn in model.functions.items())]:
        had = holder.opset_imports if before is None else before.get(key, set())
        for domain in prunable:
            if domain in had and domain not in after[key]:
                holder.opset_imports.pop(domain, None)


def _value_names(owner: ir.Graph | ir.Function) -> set[str]:
    taken = {v.name for v in owner.inputs} | {v.name for v in owner.outputs}
    if isinstance(owner, ir.Graph):
        taken |= set(owner.initializers)
    for node in owner:
        taken |= {v.name for v in node.outputs}
    return taken


class UniqueNames:
    """Fresh value names: ``name``, or ``name_2``, ``name_3``, ... if the graph has it.

    Each graph's names are collected once (a fold names a value per folded weight; scanning
    the graph each time was quadratic), then kept up to date with the names handed out.
    """

    def __init__(self) -> None:
        self._taken: dict[int, set[str]] = {}

    def __call__(self, owner: ir.Graph | ir.Function, name: str) -> str:
        taken = self._taken.get(id(owner))
        if taken is None:
            taken = self._taken[id(owner)] = _value_names(owner)
        candidate, i = name, 1
        while candidate in taken:
            i += 1
            candidate = f"{name}_{i}"
        taken.add(candidate)
        return candidate


class ScopedNames:
    """Value names taken, scope by scope: the main graph with its subgraphs, and each
    model-local function with its subgraphs (a function's names are its own: two functions
    may both have a value named ``B``). ``claim(name, function)``."""

    def __init__(self, model: ir.Model) -> None:
        self._taken: dict[int | None, set[str]] = {None: set()}
        for site in graph.walk(model):
            names = self._taken.setdefault(_scope(site.function), set())
            for v in (*site.node.inputs, *site.node.outputs):
                if v is not None and v.name:
                    names.add(v.name)
        for g in model.graphs():
            self._taken[None].update(v.name for v in (*g.inputs, *g.outputs) if v.name)
            self._taken[None].update(g.initializers)
        for f in model.functions.values():
            self._taken.setdefault(id(f), set()).update(
                v.name for v in (*f.inputs, *f.outputs) if v.name)

    def claim(self, name: str, function: ir.Function | None = None) -> bool:
        """Take ``name`` in ``function``'s scope (None: the main graph's) if nothing there
        has it; whether it was free."""
        names = self._taken.setdefault(_scope(function), set())
        if name in names:
            return False
        names.add(name)
        return True


def _scope(function: ir.Function | None) -> int | None:
    return None if function is None else id(function)


class ModelNames:
    """Fresh value names unique across the whole model (every graph, subgraph and
    function): ``name``, or ``name_1``, ``name_2``, ... (deterministic). A conversion names
    helper values so; they may be read from any scope below their graph."""

    def __init__(self, model: ir.Model) -> None:
        self._taken: set[str] = set()
        self._nodes: set[str] = set()  # node names: onnxruntime refuses two alike
        for site in graph.walk(model):
            if site.node.name:
                self._nodes.add(site.node.name)
            for v in (*site.node.inputs, *site.node.outputs):
                if v is not None and v.name:
                    self._taken.add(v.name)
        for g in model.graphs():
            self._taken.update(v.name for v in (*g.inputs, *g.outputs) if v.name)
            self._taken.update(g.initializers)

    def node(self, base: str) -> str:
        """A node name no node of the model has (``base``, or ``base_1``, ...): a new
        node named after the one it replaces may meet a name the model already uses,
        and onnxruntime refuses a graph with two nodes of one name."""
        name, i = base, 1
        while name in self._nodes:
            name, i = f"{base}_{i}", i + 1
        self._nodes.add(name)
        return name

    def claim(self, name: str) -> bool:
        """Take ``name`` itself if nothing has it; whether it was free."""
        if name in self._taken:
            return False
        self._taken.add(name)
        return True

    def __call__(self, base: str) -> str:
        name, i = base, 1
        while name in self._taken:
            name, i = f"{base}_{i}", i + 1
        self._taken.add(name)
        return name

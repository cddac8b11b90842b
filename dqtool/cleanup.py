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
    return _remove_node(producer)


def _remove_node(node: ir.Node) -> list[ir.Value] | None:
    """Remove ``node`` if nothing uses its outputs: its inputs, else None."""
    if node.graph is None or any(_used(o) for o in node.outputs):
        return None
    inputs = [i for i in node.inputs if i is not None]  # removal detaches them
    node.graph.remove(node, safe=True)
    return inputs


def remove_unused_nodes(nodes: list[ir.Node]) -> list[ir.Value]:
    """Remove those of ``nodes`` whose outputs nothing uses (repeatedly, so a chain goes
    consumer first), whatever their operator; returns the inputs they had. What those
    inputs leave unused is for ``remove_unused``."""
    inputs: list[ir.Value] = []
    changed = True
    while changed:
        changed = False
        for node in nodes:
            freed = _remove_node(node)
            if freed is not None:
                inputs.extend(freed)
                changed = True
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

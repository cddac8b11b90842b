"""After folding: drop quantized constants nothing uses, and opset imports nothing needs."""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from dqtool import families, graph


def _used(v: ir.Value) -> bool:
    return bool(v.uses()) or v.is_graph_output() or v.is_graph_input()


def _remove(v: ir.Value) -> list[ir.Value] | None:
    """Remove what holds ``v`` (initializer, Constant or QuantizeLinear node); None if it
    is held by anything else. Returns the removed producer's inputs."""
    owner = v.graph
    if v.is_initializer() and owner is not None:
        owner.initializers.pop(v.name or "", None)
        return []
    producer = v.producer()
    if producer is None or producer.op_type not in ("Constant", "QuantizeLinear"):
        return None
    if any(_used(o) for o in producer.outputs):
        return None
    assert producer.graph is not None
    inputs = [i for i in producer.inputs if i is not None]  # removal detaches them
    producer.graph.remove(producer, safe=True)
    return inputs


def remove_unused(values: Iterable[ir.Value]) -> tuple[list[str], list[str]]:
    """Remove initializers, Constant and QuantizeLinear nodes whose outputs nothing uses,
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
            freed = _remove(v)
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


def prune_opsets(model: ir.Model, before: dict[str | None, set[str]]) -> None:
    """Drop imports of domains whose nodes the fold removed, scope by scope; the model
    keeps an import while any node anywhere (functions included) uses it."""
    after = used_domains(model)
    # Only domains a family lets go of; any other import (a function's domain, ...) stays.
    prunable = families.prunable_domains()
    for domain in prunable:
        if domain in before[None] and domain not in after[None]:
            model.opset_imports.pop(domain, None)
    for key, fn in model.functions.items():
        for domain in prunable:
            if domain in before.get(str(key), set()) and domain not in after[str(key)]:
                fn.opset_imports.pop(domain, None)


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

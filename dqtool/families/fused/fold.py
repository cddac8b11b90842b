"""Folding MatMulNBits / GatherBlockQuantized: each is first rewritten exactly into its
ai.onnx form (``to_onnx``), then the fold pass folds the new DequantizeLinear like any
other (streamed in row chunks, ``--dtype`` applied), so the weights become float
initializers of a MatMul / Gather.

The new DequantizeLinear nodes carry the opset that defines them (``node.version``), so
they are read correctly in a model whose ai.onnx import is older; the fold removes them.
A float-zero-point weight keeps its small ``Add(-(zp·s))`` chain, computed at run time.

The fold's selection (``--op-types``, ``--include``/``--exclude``, ``--x-types``,
``--min-elements``) picks fused nodes too: a node it leaves is not rewritten at all. A fused
node "feeds" the float op it becomes (``MatMul`` / ``Gather``) and also answers to its own
op type; the new DequantizeLinear nodes of a selected node are folded whatever their names.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import onnx_ir as ir

from dqtool import graph
from dqtool.cleanup import ModelNames
from dqtool.families.fused import read, to_onnx

# The float op each fused op becomes once folded: what ``--op-types`` matches it by.
_BECOMES = {"MatMulNBits": "MatMul", "GatherBlockQuantized": "Gather"}


def why_not(selection: Any, node: ir.Node, spec: object) -> str | None:
    """None if the fold's ``selection`` (``dqtool.folding.selection.Selection``) picks this
    fused node, else the rule that leaves it (the fold's own wording)."""
    if selection is None:
        return None
    if selection.op_types:
        becomes = _BECOMES[node.op_type]
        if not {becomes, node.op_type} & set(selection.op_types):
            return (f"not selected: becomes {becomes}, not --op-types "
                    f"{','.join(selection.op_types)}")
    return replace(selection, op_types=()).why_not(node, spec)


def unfuse(model: ir.Model, selection: Any = None
           ) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Rewrite every fused node with a constant weight that ``selection`` picks; returns
    (names rewritten, (name, reason) of those left, output names of the DequantizeLinear
    nodes made, which the fold must fold)."""
    fresh = ModelNames(model)
    done: list[str] = []
    left: list[tuple[str, str]] = []
    made: list[str] = []
    for site in list(graph.walk(model)):
        node = site.node
        if node.graph is None or not read.is_fused(node):
            continue
        spec = read.read(node, site.opsets)
        name = node.name or f"<unnamed {node.op_type}>"
        why = why_not(selection, node, spec)
        if why is not None:
            left.append((name, why))
            continue
        version = max(to_onnx.needed_opset(spec), 21)
        try:
            # x unpacked: the fold reads codes, and x itself is never written
            old, _, _, new = to_onnx.rewrite(node, site.opsets, version, fresh,
                                             site.function is not None, unpacked=True)
        except to_onnx.Refusal as e:
            left.append((name, str(e)))
            continue
        for n in new:
            if n.op_type == "DequantizeLinear":
                n.version = version
                made.append(n.outputs[0].name)  # unique, unlike node names
        _drop(old)
        done.append(name)
    if not any(graph.domain_name(s.node.domain) == "com.microsoft" for s in graph.walk(model)):
        for holder in (model, *model.functions.values()):
            holder.opset_imports.pop("com.microsoft", None)
    return done, left, made


def _drop(values: list[ir.Value]) -> None:
    for v in values:
        if v.uses() or v.is_graph_output() or v.is_graph_input():
            continue
        if v.is_initializer() and v.graph is not None:
            v.graph.initializers.pop(v.name, None)

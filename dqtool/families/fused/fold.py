"""Folding MatMulNBits / GatherBlockQuantized: each is first rewritten exactly into its
ai.onnx form (``to_onnx``), then the fold pass folds the new DequantizeLinear like any
other (streamed in row chunks, ``--dtype`` applied), so the weights become float
initializers of a MatMul / Gather.

The new DequantizeLinear nodes carry the opset that defines them (``node.version``), so
they are read correctly in a model whose ai.onnx import is older; the fold removes them.
A float-zero-point weight keeps its small ``Add(-(zp·s))`` chain, computed at run time.
"""

from __future__ import annotations

import onnx_ir as ir

from dqtool import graph
from dqtool.cleanup import ModelNames
from dqtool.families.fused import read, to_onnx


def unfuse(model: ir.Model) -> tuple[list[str], list[tuple[str, str]]]:
    """Rewrite every fused node with a constant weight; returns (names rewritten,
    (name, reason) of those left)."""
    fresh = ModelNames(model)
    done: list[str] = []
    left: list[tuple[str, str]] = []
    for site in list(graph.walk(model)):
        node = site.node
        if node.graph is None or not read.is_fused(node):
            continue
        spec = read.read(node, site.opsets)
        name = node.name or f"<unnamed {node.op_type}>"
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
        _drop(old)
        done.append(name)
    if not any(graph.domain_name(s.node.domain) == "com.microsoft" for s in graph.walk(model)):
        for holder in (model, *model.functions.values()):
            holder.opset_imports.pop("com.microsoft", None)
    return done, left


def _drop(values: list[ir.Value]) -> None:
    for v in values:
        if v.uses() or v.is_graph_output() or v.is_graph_input():
            continue
        if v.is_initializer() and v.graph is not None:
            v.graph.initializers.pop(v.name, None)

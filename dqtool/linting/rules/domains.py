"""DQ020: a node whose domain the model (or its function) does not import.

nncf writes com.microsoft MatMulNBits into models that import no com.microsoft opset;
onnxruntime then refuses the model. Every node is checked, not only Q/DQ.
"""

from __future__ import annotations

from collections.abc import Iterator

from dqtool import graph
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import check, define

define("DQ020", "domain-not-imported", "error",
       "a node's domain has no opset import in the model (or its function)",
       "node 'MatMulNBits_0': domain com.microsoft (MatMulNBits) is used without an opset "
       "import; add opset_import com.microsoft 1")


@check("DQ020")
def domains_imported(ctx: ModelContext) -> Iterator[Finding]:
    for site in ctx.sites:
        node = site.node
        if node.domain in graph.DEFAULT_DOMAINS or node.domain in site.opsets:
            continue
        yield ctx.finding(
            "DQ020", "error",
            f"domain {node.domain} ({node.op_type}) is used without an opset import; add "
            f"opset_import {node.domain} {node.version or 1}",
            node=node.name or f"<unnamed {node.op_type}>", where=site.graph)

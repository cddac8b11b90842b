"""What ``dqtool inspect`` says about fused nodes: each one a ``NodeReport`` of kind
"fused" among the Q/DQ nodes, its own summary fields, and its summary line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dqtool.families.fused import read, reporting
from dqtool.inspection import NodeReport, consumers
from dqtool.registry.family import InspectSupport

if TYPE_CHECKING:
    import onnx_ir as ir

    from dqtool.inspection import NodeReport


def node(n: ir.Node, opsets: Mapping[str, int], graph_name: str) -> NodeReport | None:
    if not read.is_fused(n):
        return None
    spec = read.read(n, dict(opsets))
    stored, folded = reporting.bytes_of(spec)
    return NodeReport(name=n.name or "", graph=graph_name, spec=spec, consumers=consumers(n),
                      bytes_stored=stored, bytes_folded=folded,
                      lowest_onnx_opset=reporting.lowest_onnx_opset(spec), kind="fused",
                      extras=tuple(reporting.json_extras(spec).items()))


def summary(nodes: Sequence[NodeReport]) -> dict[str, Any]:
    return {
        "fused_nodes": len(nodes),
        "by_fused_op": dict(sorted(Counter(f"{n.spec.op}:{n.spec.quant_type}"
                                           for n in nodes).items())),
        "fused_constant": sum(n.spec.constant for n in nodes),
        "fused_with_problems": sum(bool(n.spec.errors) for n in nodes),
    }


def summary_lines(sm: Mapping[str, Any]) -> list[str]:
    if not sm.get("fused_nodes"):
        return []
    return [f"{sm['fused_nodes']} fused (dequantization inside com.microsoft operators; "
            f"{sm['fused_constant']} constant, {sm['fused_with_problems']} with errors): "
            + ", ".join(f"{k} ×{v}" for k, v in sm["by_fused_op"].items())]


SUPPORT = InspectSupport(node=node, summary=summary, summary_lines=summary_lines,
                         short_ops={"GatherBlockQuantized": "GatherBQ"})

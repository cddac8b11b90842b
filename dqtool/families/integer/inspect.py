"""What ``dqtool inspect`` says about integer operators: a report each under
"integer_nodes", their summary fields, and their own table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dqtool.families.integer import describe
from dqtool.inspection import consumers
from dqtool.registry.family import InspectSupport, InspectTable

if TYPE_CHECKING:
    import onnx_ir as ir

    from dqtool.families.integer.describe import IntegerOpSpec

_SHORT = {"com.microsoft": "ms"}


@dataclass(frozen=True)
class IntegerNodeReport:
    """An integer operator (QLinear*, MatMulInteger, dynamic quantization) and its use."""

    name: str
    graph: str
    spec: IntegerOpSpec
    consumers: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "graph": self.graph, **self.spec.to_json(),
                "consumers": list(self.consumers)}


def node(n: ir.Node, opsets: Mapping[str, int], graph_name: str) -> IntegerNodeReport | None:
    spec = describe.read(n, dict(opsets))
    if spec is None:
        return None
    return IntegerNodeReport(name=n.name or "", graph=graph_name, spec=spec,
                             consumers=consumers(n))


def summary(nodes: Sequence[IntegerNodeReport]) -> dict[str, Any]:
    def count(key) -> dict[str, int]:
        return dict(sorted(Counter(key(n) for n in nodes).items()))

    return {
        "integer_nodes": len(nodes),
        "integer_by_op": count(lambda n: f"{n.spec.domain}:{n.spec.op}"),
        "integer_by_kind": count(lambda n: n.spec.kind),
        # An unnamed node is still one entry a reader can tell apart from a named "".
        "integer_without_qdq_form": [n.name or f"<unnamed {n.spec.op}>" for n in nodes
                                     if not n.spec.qdq_form],
    }


def _operand(o) -> str:
    """``int8 axis 0 const`` for one quantized tensor of an integer operator."""
    gran = {"per-tensor": "tensor", "per-axis": f"axis {o.axis}"}.get(o.granularity or "", "?")
    text = f"{o.type or '?'} {gran}"
    if o.constant:
        text += " const"
    elif o.scale_type is not None and not o.scale_constant:
        text += " dyn"
    return text


def _row(n: IntegerNodeReport) -> list[str]:
    """The table's cells for one integer operator (plain text)."""
    s = n.spec
    dom = "" if s.domain == "ai.onnx" else f"{_SHORT.get(s.domain, s.domain)}:"
    where = n.name or "<unnamed>"
    if n.graph != "main":
        where += f" [{n.graph}]"
    ins = "; ".join(f"{o.role} {_operand(o)}" for o in s.inputs) or "-"
    out = _operand(s.output) if s.output else (s.output_type or "?")
    flags = "E" if s.errors else ("W" if any(p.severity == "warning" for p in s.problems)
                                  else "")
    return [where, f"{dom}{s.op}-{s.version}", s.kind, ins, out, s.bias_type or "-",
            "yes" if s.qdq_form else "no", flags]


def table(report) -> InspectTable | None:
    """The integer operators, one row each, then their counts (None when there are none)."""
    nodes = report.sections.get("integer_nodes", ())
    if not nodes:
        return None
    sm = report.summary
    lines = [f"{sm['integer_nodes']} integer operators: "
             + ", ".join(f"{k} ×{v}" for k, v in sm["integer_by_op"].items())]
    if sm["integer_without_qdq_form"]:
        lines.append(f"without a QDQ form: {len(sm['integer_without_qdq_form'])}")
    return InspectTable(
        f"{len(nodes)} integer operators",
        ("node", "op", "kind", "inputs", "output", "bias", "qdq", "!"),
        [_row(n) for n in nodes],
        problems=[f"  {p.severity} {p.code} {n.name or '<unnamed>'}: {p.message}"
                  for n in nodes for p in n.spec.problems],
        lines=lines)


SUPPORT = InspectSupport(node=node, section="integer_nodes", summary=summary, table=table)

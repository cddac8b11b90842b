"""``dqtool.inspect``: what (de)quantization a model holds, and what is wrong with it."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir

from dqtool import codecs, graph, handwritten, registry, storage, versions
from dqtool.spec import QuantSpec


@dataclass(frozen=True)
class NodeReport:
    name: str
    graph: str
    spec: QuantSpec  # or a family's spec with the same fields (a fused operator's)
    consumers: tuple[str, ...]
    bytes_stored: int | None
    bytes_folded: int | None
    lowest_onnx_opset: int | None
    # "qdq" for a Q/DQ node; a family's nodes whose dequantization lives inside another
    # operator say which (their family's inspect hook builds them), with the JSON fields
    # only they have in ``extras``.
    kind: str = "qdq"
    extras: tuple[tuple[str, Any], ...] = ()

    @property
    def inside_operator(self) -> bool:
        """The dequantization lives inside another operator (not a Q/DQ node)."""
        return self.kind != "qdq"

    def to_json(self) -> dict[str, Any]:
        s = self.spec
        doc = {
            "name": self.name,
            "kind": self.kind,
            "op_type": s.op,
            "domain": s.domain,
            "version": s.version,
            "since_version": s.since_version,
            "graph": self.graph,
            "x_type": s.quant_type,
            "scale_type": s.scale_type,
            "output_type": s.float_type if s.is_dequantize else s.quant_type,
            "input_type": None if s.is_dequantize else s.float_type,
            "granularity": s.granularity,
            "axis": s.axis,
            "block_size": s.block_size,
            "has_zero_point": s.zero_point != "none",
            "zero_point": s.zero_point,
            "zero_point_type": s.zero_point_type,
            "packing": s.packing,
            "constant": s.constant,
            "x_shape": _dims(s.x_shape),
            "scale_shape": _dims(s.scale_shape),
            "bytes_stored": self.bytes_stored,
            "bytes_folded": self.bytes_folded,
            "consumers": list(self.consumers),
            "lowest_onnx_opset": self.lowest_onnx_opset,
            "attributes": {k: v for k, v in s.attributes},
            "problems": [p.message for p in s.problems],
            "problem_details": [
                {"code": p.code, "severity": p.severity, "message": p.message}
                for p in s.problems
            ],
        }
        doc.update(self.extras)
        return doc


def _dims(shape) -> list | None:
    return None if shape is None else list(shape)


@dataclass(frozen=True)
class InspectReport:
    input: str  # the path read, "<memory>" for a model object
    ir_version: int
    opset_imports: dict[str, int]
    nodes: tuple[NodeReport, ...]
    functions: int = 0
    external_data: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    # A family's reports that are not Q/DQ-like, under the family's section name (the
    # integer operators' "integer_nodes"); each also reads as an attribute.
    sections: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> tuple[Any, ...]:
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        raise AttributeError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "ir_version": self.ir_version,
            "opset_imports": self.opset_imports,
            "external_data": self.external_data,
            "nodes": [n.to_json() for n in self.nodes],
            **{key: [n.to_json() for n in reports] for key, reports in self.sections.items()},
            "summary": self.summary,
        }


def _bytes(spec: QuantSpec) -> tuple[int | None, int | None]:
    """Bytes of a stored quantized tensor (plus scale and zero point) vs once folded to
    float; None for activations, which are not stored."""
    if not spec.is_dequantize or not (spec.x_constant or spec.x_from_quantize):
        return None, None
    x = graph.stored_bytes(spec.quant_type, spec.x_shape)
    if spec.packing != "none" and x is not None:
        x = graph.stored_bytes("int16", (graph.num_elements(spec.x_shape) // 4,))
    s = graph.stored_bytes(spec.scale_type, spec.scale_shape)
    z = 0 if spec.zero_point == "none" else graph.stored_bytes(
        spec.zero_point_type, spec.scale_shape)
    stored = None if None in (x, s, z) else x + s + z
    folded = graph.stored_bytes(spec.float_type, spec.x_shape)
    return stored, folded


def consumers(node: ir.Node) -> tuple[str, ...]:
    """The op types reading ``node``'s first output."""
    return tuple(u.node.op_type for u in node.outputs[0].uses()) if node.outputs else ()


def _qdq_report(node: ir.Node, opsets: dict[str, int], graph_name: str) -> NodeReport | None:
    if not codecs.is_quant_node(node):
        return None
    spec = codecs.read_node(node, opsets)
    stored, folded = _bytes(spec)
    return NodeReport(
        name=node.name or "", graph=graph_name, spec=spec, consumers=consumers(node),
        bytes_stored=stored, bytes_folded=folded,
        lowest_onnx_opset=versions.lowest_version(spec) if spec.op in
        ("DequantizeLinear", "QuantizeLinear") else None,
    )


def _reports(model: ir.Model) -> tuple[list[NodeReport], list[list[Any]]]:
    """The Q/DQ-like reports (Q/DQ nodes and the families' ``kind`` nodes, in walk order),
    and each inspecting family's own reports (``registry.inspect_supports()`` order)."""
    supports = registry.inspect_supports()
    nodes: list[NodeReport] = []
    own: list[list[Any]] = [[] for _ in supports]
    for site in graph.walk(model):
        claimed = False  # a family's Q/DQ-like report replaces the Q/DQ reading
        for i, support in enumerate(supports):
            if claimed and not support.section:
                continue
            report = support.node(site.node, site.opsets, site.graph)
            if report is None:
                continue
            own[i].append(report)
            if not support.section:
                nodes.append(report)
                claimed = True
        if not claimed:
            report = _qdq_report(site.node, site.opsets, site.graph)
            if report is not None:
                nodes.append(report)
    return nodes, own


def _opsets(model: ir.Model) -> dict[str, int]:
    return {graph.domain_name(d): v for d, v in sorted(model.opset_imports.items())}


def summarize(model: ir.Model, nodes: list[NodeReport]) -> dict[str, Any]:
    """The shared summary fields; a family's nodes (``fused``) count in the types, the
    lowest opset and the bytes, and its own fields come from its ``summary`` hook."""
    inside = [n for n in nodes if n.inside_operator]
    every = nodes
    nodes = [n for n in nodes if not n.inside_operator]

    def count(key, among=None) -> dict[str, int]:
        return dict(sorted(Counter(key(n) for n in (nodes if among is None else among)
                                   ).items()))

    dq = [n for n in nodes if n.spec.is_dequantize]
    typed = [n for n in every if n.spec.quant_type and n.spec.scale_type]
    not_expressible = [n.name for n in typed if n.lowest_onnx_opset is None]
    lowest = None if not_expressible else max(
        (n.lowest_onnx_opset for n in typed), default=None)
    weights = [n for n in dq if n.spec.x_constant or n.spec.x_from_quantize]
    weights += [n for n in inside if n.spec.x_constant]
    stored = [n.bytes_stored for n in weights]
    folded = [n.bytes_folded for n in weights]
    return {
        "dequantize_nodes": len(dq),
        "quantize_nodes": len(nodes) - len(dq),
        "by_domain_version": count(lambda n: n.spec.op_id),
        "by_quant_type": count(lambda n: f"{n.spec.op}:{n.spec.quant_type}"),
        "by_granularity": count(lambda n: f"{n.spec.op}:{n.spec.granularity}"),
        "constant_dequantize": sum(n.spec.constant for n in dq),
        "nodes_with_problems": sum(bool(n.spec.errors) for n in nodes),
        "bytes_stored": sum(b for b in stored if b is not None),
        "bytes_folded": sum(b for b in folded if b is not None),
        "bytes_unknown": sum(b is None for b in stored),
        "lowest_onnx_opset": lowest,
        "not_expressible_in_onnx": not_expressible,
        # By the same test as ``typed``, not ``n not in typed``: a list membership compares
        # NodeReports field by field, which made inspect quadratic (docs/benchmarks.md).
        "types_unknown": [n.name for n in every
                          if not (n.spec.quant_type and n.spec.scale_type)],
        "functions": len(model.functions),
    }


def inspect(model: str | os.PathLike | ir.Model) -> InspectReport:
    """Every DequantizeLinear / QuantizeLinear in the model (main graph, subgraphs,
    functions), and every com.microsoft MatMulNBits / GatherBlockQuantized (``kind``
    "fused"), read into its meaning, with the rules each breaks and a summary.

    Reads no tensor data but zero points where a rule needs their values.
    """
    name = "<memory>"
    if not isinstance(model, ir.Model):
        name = str(model)
        model = storage.load(Path(model))
    nodes, own = _reports(model)
    summary = summarize(model, nodes)
    # Dequantization written by hand (Cast → Sub → Mul): its own kind, not a node's.
    hand = handwritten.find(model)
    sections: dict[str, tuple[Any, ...]] = {"handwritten": hand}
    summary["handwritten"] = len(hand)
    summary["handwritten_exact"] = sum(h.exact and h.rewritable for h in hand)
    for support, reports in zip(registry.inspect_supports(), own, strict=True):
        if support.summary is not None:
            summary.update(support.summary(reports))
        if support.section:
            sections[support.section] = tuple(reports)
    return InspectReport(
        input=name,
        ir_version=model.ir_version,
        opset_imports=_opsets(model),
        nodes=tuple(nodes),
        functions=len(model.functions),
        external_data=storage.uses_external_data(model),
        summary=summary,
        sections=sections,
    )


__all__ = ["InspectReport", "NodeReport", "consumers", "inspect"]

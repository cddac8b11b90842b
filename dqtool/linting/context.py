"""One model as the rules see it: its Q/DQ nodes read once into QuantSpecs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import onnx_ir as ir

from dqtool import codecs, graph
from dqtool.graph import Site
from dqtool.linting.finding import Finding
from dqtool.spec import QuantSpec, Severity


@dataclass
class QuantSite:
    site: Site
    spec: QuantSpec

    @property
    def node(self) -> ir.Node:
        return self.site.node

    @property
    def label(self) -> str:
        """How a message names the node: ``node 'W_DQ' (ai.onnx DequantizeLinear-13)``."""
        s = self.spec
        text = f"node '{self.node.name or '<unnamed>'}' ({s.domain} {s.op}-{s.version})"
        return text if self.site.graph == "main" else f"{text} in {self.site.graph}"


@dataclass
class ModelContext:
    path: str
    model: ir.Model

    @cached_property
    def sites(self) -> list[Site]:
        return list(graph.walk(self.model))

    @cached_property
    def quant(self) -> list[QuantSite]:
        return [QuantSite(s, codecs.read_node(s.node, s.opsets)) for s in self.sites
                if codecs.is_quant_node(s.node)]

    @cached_property
    def spec_of(self) -> dict[int, QuantSpec]:
        """Each Q/DQ node's spec by ``id(node)``, read once."""
        return {id(q.node): q.spec for q in self.quant}

    @property
    def dequantize(self) -> list[QuantSite]:
        return [q for q in self.quant if q.spec.is_dequantize]

    @property
    def onnx_opset(self) -> int | None:
        return graph.opset_of(dict(self.model.opset_imports), "")

    def finding(self, code: str, severity: Severity, text: str, q: QuantSite | None = None,
                *, target: str | None = None, fix: str | None = None,
                node: str | None = None, where: str | None = None,
                op: str | None = None) -> Finding:
        """A finding whose message is one line naming the model and the node (``op``: how
        reports name its operator, ``spec.op_id``)."""
        if q is not None:
            node, where = q.node.name or "<unnamed>", q.site.graph
            op = q.spec.op_id
            subject = q.label
        else:
            subject = f"node '{node}'" if node else "model"
            if node and where and where != "main":
                subject += f" in {where}"
        message = f"{self.path}: {subject}: {text}"
        if fix:
            message += f"; fix: {fix}"
        return Finding(code, severity, " ".join(message.split()), self.path, node, where, op,
                       target, fix)

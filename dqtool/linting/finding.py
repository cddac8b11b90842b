"""What lint reports: rules (stable code, severity, meaning) and the findings they make."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dqtool.spec import Severity

SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Rule:
    code: str  # stable: "DQ001"
    name: str  # kebab-case slug: "scale-value"
    severity: Severity  # the usual severity; a finding may state its own
    summary: str  # one line: what the rule means
    example: str  # one finding it makes, for the docs' rule table

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "name": self.name, "severity": self.severity,
                "summary": self.summary}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str  # one line, naming node and model
    input: str  # the path of the model the finding is in
    node: str | None = None
    graph: str | None = None
    op: str | None = None  # "ai.onnx:DequantizeLinear-21" (spec.op_id)
    target: str | None = None
    fix: str | None = None  # the dqtool command that would make a target run it

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "input": self.input, "node": self.node, "graph": self.graph, "op": self.op,
                "target": self.target, "fix": self.fix}

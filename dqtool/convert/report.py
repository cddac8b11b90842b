"""What a conversion did to each node, and what it refused, as data.

A refusal is never a log line: it is kept here with its reason, the CLI shows it, and any
refusal means nothing is written (exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dqtool.errors import RefusedError

if TYPE_CHECKING:
    from dqtool.checking.conversion import ConversionCheck

Status = Literal["changed", "repaired", "kept"]


@dataclass(frozen=True)
class NodeChange:
    """One node rewritten (``changed``), fixed (``repaired``), or deliberately left in its
    own domain (``kept``: e.g. a com.microsoft node whose types the target cannot hold)."""

    node: str
    graph: str
    op: str  # "ai.onnx:DequantizeLinear", "com.microsoft:QuantizeLinear", ...
    status: Status
    how: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "graph": self.graph, "op": self.op, "status": self.status,
                "how": self.how, "why": self.why}


@dataclass(frozen=True)
class NodeRefusal:
    node: str
    graph: str
    op: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "graph": self.graph, "op": self.op, "reason": self.reason}


@dataclass
class ConvertReport:
    """Everything one ``upgrade``/``downgrade`` did. ``model`` is the converted model when
    nothing was refused (None otherwise); ``written`` lists the files saved."""

    input: str  # the path read, "<model>" for a model object
    direction: Literal["upgrade", "downgrade"]
    from_opset: int | None
    to_opset: int
    from_ir_version: int = 0
    to_ir_version: int = 0
    changes: list[NodeChange] = field(default_factory=list)
    refusals: list[NodeRefusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    opset_imports: dict[str, int] = field(default_factory=dict)
    check: ConversionCheck | None = None
    files: list[str] = field(default_factory=list)  # every file written
    external_data: bool = False  # the output was written with external data
    model: Any = None  # the converted ir.Model; not part of the JSON

    @property
    def ok(self) -> bool:
        return not self.refusals

    def to_json(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "direction": self.direction,
            "from_opset": self.from_opset,
            "to_opset": self.to_opset,
            "from_ir_version": self.from_ir_version,
            "to_ir_version": self.to_ir_version,
            "ok": self.ok,
            "opset_imports": dict(self.opset_imports),
            "changed": [c.to_json() for c in self.changes if c.status != "kept"],
            "kept": [c.to_json() for c in self.changes if c.status == "kept"],
            "refused": [r.to_json() for r in self.refusals],
            "warnings": list(self.warnings),
            "check": None if self.check is None else self.check.to_json(),
            "files": list(self.files),
            "external_data": self.external_data,
        }


class ConversionRefused(RefusedError):
    """Some node cannot be converted exactly; nothing was written. ``report`` says which
    and why."""

    def __init__(self, report: ConvertReport) -> None:
        first = report.refusals[0]
        more = f" (and {len(report.refusals) - 1} more)" if len(report.refusals) > 1 else ""
        super().__init__(f"cannot convert {report.input} to opset {report.to_opset}: node "
                         f"'{first.node}' ({first.op}): {first.reason}{more}; nothing written")
        self.report = report


class CheckFailed(RefusedError):
    """``--check`` found a difference (or nothing could compare); nothing was written.
    ``report.check`` has one line per runtime."""

    def __init__(self, report: ConvertReport) -> None:
        why = report.check.failures() if report.check else "not checked"
        super().__init__(f"--check failed for {report.input} at opset {report.to_opset}: "
                         f"{why}; nothing written")
        self.report = report

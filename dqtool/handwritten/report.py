"""What ``rewrite`` did: each hand-written dequantization rewritten, refused (with the
reason; then nothing is changed), or left (its scale or zero point is computed at run
time: listed, never rewritten)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dqtool.handwritten.records import Handwritten


@dataclass(frozen=True)
class PatternReport:
    record: Handwritten
    how: str  # what replaced it, or why not

    def to_json(self) -> dict[str, Any]:
        return {**self.record.to_json(), "how": self.how}


@dataclass
class RewriteReport:
    """``model`` is the rewritten copy when nothing was refused (else None); the model
    handed in is never modified."""

    from_opset: int | None
    to_opset: int
    changed: list[PatternReport] = field(default_factory=list)
    refused: list[PatternReport] = field(default_factory=list)
    left: list[PatternReport] = field(default_factory=list)
    model: Any = None  # the rewritten ir.Model; not part of the JSON

    @property
    def ok(self) -> bool:
        return not self.refused

    def to_json(self) -> dict[str, Any]:
        return {"from_opset": self.from_opset, "to_opset": self.to_opset, "ok": self.ok,
                "changed": [o.to_json() for o in self.changed],
                "refused": [o.to_json() for o in self.refused],
                "left": [o.to_json() for o in self.left]}

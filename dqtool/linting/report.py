"""What lint found, over every model given."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from dqtool.linting.finding import Finding, Rule


@dataclass(frozen=True)
class LintReport:
    inputs: tuple[str, ...]  # the paths read
    findings: tuple[Finding, ...]
    rules: tuple[Rule, ...]  # the rules that were run (after select/ignore)
    target: str | None = None
    config: str | None = None  # the pyproject.toml whose [tool.dqtool.lint] applied

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def passed(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def counts(self) -> dict[str, int]:
        c = Counter(f.severity for f in self.findings)
        return {s: c.get(s, 0) for s in ("error", "warning", "info")}

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": list(self.inputs), "target": self.target, "config": self.config,
            "passed": self.passed, "counts": self.counts(),
            "rules": [r.to_json() for r in self.rules],
            "findings": [f.to_json() for f in self.findings],
        }

"""Lint output formats: text (rich), json (one document), github (Actions annotations),
sarif (SARIF 2.1.0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from dqtool import __version__
from dqtool.linting.report import LintReport
from dqtool.printable import shown

FORMATS = ("text", "json", "github", "sarif")
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def text(report: LintReport, console: Console) -> None:
    for f in report.findings:
        console.print(f"[{_STYLE[f.severity]}]{f.code}[/] {f.severity}: {escape(f.message)}",
                      markup=True, highlight=False, soft_wrap=True)
    c = report.counts()
    target = f" (target {report.target})" if report.target else ""
    console.print(f"{len(report.inputs)} model(s){target}: {c['error']} errors, "
                  f"{c['warning']} warnings, {c['info']} info", soft_wrap=True)


def as_json(report: LintReport) -> str:
    return json.dumps(report.to_json(), indent=2)


def _escape_data(s: str) -> str:
    # A name's control characters are escaped first (``printable``): a workflow command
    # is one line, and the log shows what it is given.
    return shown(s).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def github(report: LintReport) -> str:
    """One workflow command per finding: ``::error file=m.onnx,title=DQ001::message``."""
    lines = [
        f"::{_GITHUB_LEVEL[f.severity]} file={_escape_property(f.input)},"
        f"title={_escape_property(f.code)}::{_escape_data(f.message)}"
        for f in report.findings
    ]
    return "\n".join(lines)


def _uri(path: str) -> str:
    p = Path(path)
    return p.as_posix() if not p.is_absolute() else p.as_uri()


def sarif(report: LintReport) -> dict[str, Any]:
    rules = list(report.rules)
    index = {r.code: i for i, r in enumerate(rules)}
    results = []
    for f in report.findings:
        result: dict[str, Any] = {
            "ruleId": f.code, "ruleIndex": index[f.code], "level": _SARIF_LEVEL[f.severity],
            "message": {"text": f.message},
            "locations": [{
                "physicalLocation": {"artifactLocation": {"uri": _uri(f.input)}},
                **({"logicalLocations": [{"name": f.node, "kind": "member",
                                          "fullyQualifiedName": f"{f.graph}/{f.node}"}]}
                   if f.node else {}),
            }],
        }
        if f.fix:
            result["properties"] = {"fix": f.fix}
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "dqtool", "version": __version__,
                "rules": [{
                    "id": r.code, "name": r.name,
                    "shortDescription": {"text": r.summary},
                    "fullDescription": {"text": f"{r.summary}. Example: {r.example}"},
                    "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]},
                } for r in rules],
            }},
            "results": results,
            "artifacts": [{"location": {"uri": _uri(m)}} for m in report.inputs],
        }],
    }

"""``dqtool.lint``: rules with stable codes over the Q/DQ nodes of models, optionally
against a target profile (an opset, onnxruntime, DirectML, oneDNN, opmx)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from dqtool import io
from dqtool.linting import registry, targets
from dqtool.linting.config import LintConfig
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding, Rule
from dqtool.linting.report import LintReport

_ORDER = {"error": 0, "warning": 1, "info": 2}


def _codes(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(c.strip().upper() for c in items if c.strip())


def rules() -> dict[str, Rule]:
    """Every rule lint knows, by code."""
    return dict(sorted(registry.load().items()))


def lint(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    target: str | None = None,
    select: str | Iterable[str] | None = None,
    ignore: str | Iterable[str] | None = None,
    config: LintConfig | None = None,
) -> LintReport:
    """Lint every model in ``paths``. ``select``/``ignore`` are code prefixes ("DQ0",
    "DQ101"); arguments override ``config`` (the [tool.dqtool.lint] table, if passed).
    Unreadable models raise ``InputError``; an unknown target ``UsageError``."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    cfg = config or LintConfig()
    target = target if target is not None else cfg.target
    sel = _codes(select) if select is not None else cfg.select
    ign = _codes(ignore) if ignore is not None else cfg.ignore
    known = registry.load()
    profile = targets.parse(target) if target else None
    active = tuple(r for c, r in sorted(known.items()) if registry.selected(c, sel, ign)
                   and (profile is not None or not c.startswith("DQ1")))
    codes = {r.code for r in active}
    findings: list[Finding] = []
    names = [str(p) for p in paths]
    for path in names:
        ctx = ModelContext(path, io.load(Path(path)))
        for emits, fn in registry.CHECKS:
            if codes.intersection(emits):
                findings += [f for f in fn(ctx) if f.code in codes]
        if profile is not None:
            findings += [f for f in targets.run(ctx, profile) if f.code in codes]
    findings.sort(key=lambda f: (names.index(f.model), _ORDER[f.severity], f.code,
                                 f.graph or "", f.node or ""))
    return LintReport(tuple(names), tuple(findings), active, profile.name if profile else None,
                      cfg.source)


__all__ = ["LintReport", "lint", "rules"]

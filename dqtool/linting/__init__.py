"""``dqtool.lint``: rules with stable codes over the Q/DQ nodes of models, optionally
against a target profile (an opset, onnxruntime, DirectML, oneDNN, opmx)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from dqtool import storage
from dqtool.errors import InputError, UsageError
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


def all_rules() -> dict[str, Rule]:
    """Every rule lint knows, by code. (Not ``rules``: importing the ``rules`` subpackage
    sets that attribute of this package to the subpackage.)"""
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
    Unreadable models raise ``InputError``; an unknown target, or a code or prefix that
    matches no rule, ``UsageError``. Every path is checked before any model is linted."""
    if isinstance(paths, (str, os.PathLike)) or not isinstance(paths, Iterable):
        paths = [paths]  # type: ignore[list-item]
    paths = list(paths)  # a generator (Path.glob) is read once
    for p in paths:  # a model object (or a list of them) fails clearly, not on its repr
        if not isinstance(p, (str, os.PathLike)):
            raise UsageError(f"lint takes model paths, got {type(p).__name__}: save the "
                             "model first (dqtool.save)")
    cfg = config or LintConfig()
    known = registry.load()
    where = f"{cfg.source}: [tool.dqtool.lint] " if cfg.source else "[tool.dqtool.lint] "
    # A typo in the configuration is reported even when an option overrides it.
    _check_codes(cfg.select, known, f"{where}select")
    _check_codes(cfg.ignore, known, f"{where}ignore")
    sel = _codes(select) if select is not None else cfg.select
    ign = _codes(ignore) if ignore is not None else cfg.ignore
    sel_label = "--select" if select is not None else f"{where}select"
    _check_codes(sel, known, sel_label)
    _check_codes(ign, known, "--ignore" if ignore is not None else f"{where}ignore")
    profile = targets.parse(target) if target is not None else _config_target(cfg, where)
    active = tuple(r for c, r in sorted(known.items()) if registry.selected(c, sel, ign)
                   and (profile is not None or not c.startswith("DQ1")))
    if profile is None and sel:
        # Asked for here (or all the configuration selects): target rules would not run.
        only_target = [p for p in sel if all(c.startswith("DQ1") for c in known
                                             if c.startswith(p))]
        if only_target and (select is not None or not active):
            raise UsageError(f"{sel_label} {', '.join(only_target)}: target rules (DQ1xx) "
                             "run only with a --target (or target in [tool.dqtool.lint])")
    if not active:
        raise UsageError("--select/--ignore leave no rule to run (select: "
                         f"{', '.join(sel or ('all',))}; ignore: {', '.join(ign or ('none',))})")
    codes = {r.code for r in active}
    findings: list[Finding] = []
    names = [str(p) for p in paths]
    for path in names:  # refuse a missing path before spending time on the others
        p = Path(path)
        if not p.exists():
            raise InputError(f"{path}: no such file")
        if p.is_dir():
            raise InputError(f"{path}: is a directory, not an ONNX model file (pass the "
                             "files, e.g. dir/*.onnx)")
    for path in names:
        ctx = ModelContext(path, storage.load(Path(path)))
        for emits, fn in registry.CHECKS:
            if codes.intersection(emits):
                findings += [f for f in fn(ctx) if f.code in codes]
        if profile is not None:
            findings += [f for f in targets.run(ctx, profile) if f.code in codes]
    findings.sort(key=lambda f: (names.index(f.input), _ORDER[f.severity], f.code,
                                 f.graph or "", f.node or ""))
    return LintReport(tuple(names), tuple(findings), active, profile.name if profile else None,
                      cfg.source)


def _check_codes(codes: tuple[str, ...] | None, known: dict[str, Rule], label: str) -> None:
    """Each code or prefix must match at least one rule: a typo would silently run
    nothing (``--select``) or skip nothing (``--ignore``)."""
    unknown = [c for c in codes or () if not any(k.startswith(c) for k in known)]
    if unknown:
        raise UsageError(f"{label}: unknown rule code(s) {', '.join(unknown)} (valid codes, "
                         f"or prefixes of them such as DQ0: {', '.join(sorted(known))})")


def _config_target(cfg: LintConfig, where: str) -> targets.Profile | None:
    if not cfg.target:
        return None
    try:
        return targets.parse(cfg.target)
    except UsageError as e:
        raise UsageError(f"{where}target: {e}") from None


__all__ = ["LintReport", "all_rules", "lint"]

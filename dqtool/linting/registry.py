"""The rule registry: every code lint knows, and the checks of the model-level families.

Each family is one small module that registers its rules with ``@rule``; target profiles
(DQ1xx) register their codes here too but run through ``dqtool.linting.targets``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dqtool import registry
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding, Rule
from dqtool.spec import Severity

Check = Callable[[ModelContext], Iterable[Finding]]

RULES: dict[str, Rule] = {}
CHECKS: list[tuple[tuple[str, ...], Check]] = []  # (codes a check can emit, check)


def define(code: str, name: str, severity: Severity, summary: str, example: str) -> Rule:
    if code in RULES:
        raise ValueError(f"rule {code} defined twice")
    RULES[code] = Rule(code, name, severity, summary, example)
    return RULES[code]


def check(*codes: str) -> Callable[[Check], Check]:
    """Register a function that finds problems for the already-defined ``codes``."""
    def deco(fn: Check) -> Check:
        CHECKS.append((codes, fn))
        return fn

    return deco


def load() -> dict[str, Rule]:
    """Import every rule module once, so that the registry is complete: each module of
    ``dqtool.linting.rules``, the target codes, and the operator families'
    ``lint_modules`` (``dqtool.families``). A new rule module is found, not listed here."""
    import importlib
    import pkgutil


    rules = importlib.import_module("dqtool.linting.rules")
    modules = [f"{rules.__name__}.{m.name}" for m in pkgutil.iter_modules(rules.__path__)]
    for module in [*sorted(modules), "dqtool.linting.targets.codes",
                   "dqtool.linting.targets.deploy_codes",
                   *registry.lint_modules()]:
        importlib.import_module(module)
    return RULES


def selected(code: str, select: Iterable[str] | None, ignore: Iterable[str] | None) -> bool:
    """Prefix matching, as ruff does: ``DQ0`` selects DQ001..DQ099; ``ignore`` wins."""
    if ignore and any(code.startswith(p) for p in ignore):
        return False
    return not select or any(code.startswith(p) for p in select)

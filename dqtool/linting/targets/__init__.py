"""Target profiles (``--target``): what a runtime or opset can run, from ``docs/semantics.md``.

Each profile module says, for one DequantizeLinear, which operators of the target could run
it and why each cannot; ``run`` turns the best candidate's issues into DQ1xx findings, each
with the dqtool command that would make the node run.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

from dqtool import registry
from dqtool.errors import UsageError
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.rules import handwritten
from dqtool.linting.targets import deploy
from dqtool.linting.targets.base import Profile, Target, best

# Modules of this package that hold no target.
_NOT_TARGETS = frozenset({"base", "codes", "deploy", "deploy_codes", "units"})
_TABLE: list[Target] = []
_TABLE_GENERATION = -1  # registry.generation() the table was built at


def table() -> list[Target]:
    """Every target: the ``TARGETS`` of each module of this package and of the families'
    ``lint_modules``, by ``Target.order``. ``--target`` help, the error
    for an unknown name and the docs' table all come from here."""
    global _TABLE_GENERATION
    if registry.generation() != _TABLE_GENERATION:
        _TABLE.clear()
        _TABLE_GENERATION = registry.generation()
        names = sorted(m.name for m in pkgutil.iter_modules(__path__)
                       if m.name not in _NOT_TARGETS)
        modules = [f"{__name__}.{n}" for n in names] + registry.lint_modules()
        for module in modules:
            _TABLE.extend(getattr(importlib.import_module(module), "TARGETS", ()))
        _TABLE.sort(key=lambda t: t.order)
    return list(_TABLE)


def names() -> tuple[str, ...]:
    return tuple(t.name for t in table())


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "NAMES":  # computed: targets come from modules found at run time
        return names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse(target: str) -> Profile:
    for entry in table():
        profile = entry.parse(target)
        if profile is not None:
            return profile
    raise UsageError(f"unknown --target {target!r} (known: {', '.join(names())})")


def run(ctx: ModelContext, profile: Profile) -> Iterator[Finding]:
    opset = ctx.onnx_opset or 0
    if profile.max_opset is not None and opset > profile.max_opset:
        fix = f"{profile.opset_fix} would lower it" if profile.opset_fix else None
        who = "" if profile.name.startswith("onnx-opset-") else f" ({profile.description})"
        yield ctx.finding("DQ100", "error", f"the model's ai.onnx opset {opset} is above the "
                          f"target's {profile.max_opset}{who}",
                          target=profile.name, fix=fix)
    for module in registry.lint_modules():  # a family's nodes that are not Q/DQ
        hook = getattr(importlib.import_module(module), "target_findings", None)
        if hook is not None:
            yield from hook(ctx, profile.name)

    yield from handwritten.target_findings(ctx, profile.name)
    sites = getattr(profile, "site_candidates", None)  # a check that reads the node
    for q in ctx.dequantize:
        worst = best(sites(q, opset) if sites is not None else
                     profile.candidates(q.spec, opset))
        if worst is None:
            continue
        for issue in worst.issues:
            yield ctx.finding(issue.code, "error", f"{profile.name} cannot run it "
                              f"({worst.name}): {issue.reason}", q, target=profile.name,
                              fix=issue.fix)
    if getattr(profile, "judge", None) is not None:  # a deployment target's node units

        yield from deploy.findings(ctx, profile)  # type: ignore[arg-type]

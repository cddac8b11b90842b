"""The operator-family registry: every operator dqtool understands, one ``Family`` each.

    from dqtool import registry
    registry.owner("com.microsoft", "DequantizeLinear").name   # "qdq_microsoft"
    registry.prunable_domains()                                 # {"com.microsoft", "opmx", ...}

A new family is one folder ``dqtool/families/<name>/`` whose ``__init__.py`` defines
``FAMILY`` (a ``dqtool.registry.family.Family``), plus one line in ``BUILTIN`` below; its
code (codec, kernel, adapters, lint rules) lives in that folder. Code outside dqtool may
call ``register(family)`` (and ``unregister``); whatever derives from the registry
(``dqtool.codecs``, the evaluator, lint's targets) follows. The protocol (what a family may
offer) is documented in ``dqtool.registry.family``; ``qdq_onnx``, ``qdq_microsoft`` and
``qdq_opmx`` are worked examples (their code predates the registry and stays in
``dqtool/codecs``, ``dqtool/kernel`` and ``dqtool/convert``; the folders name it).

The registry is filled on first use, not at import: low layers (the codecs, the kernel's
evaluator) read it, and the family modules import those layers only inside their hooks.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

from dqtool.registry.family import (
    CheckSupport,
    ConverterTable,
    Family,
    FoldKernel,
    FoldPrepare,
    FoldPrepared,
    FoldSupport,
    InspectSupport,
    InspectTable,
    Kernel,
    Key,
)
from dqtool.spec import Codec

__all__ = [
    "BUILTIN",
    "Family",
    "FoldKernel",
    "FoldPrepare",
    "FoldPrepared",
    "FoldSupport",
    "InspectSupport",
    "InspectTable",
    "Kernel",
    "Key",
    "all_families",
    "codecs",
    "evaluator_ops",
    "fill_converters",
    "fold_kernel",
    "fold_prepares",
    "fold_support",
    "generation",
    "inspect_supports",
    "is_fold_root",
    "lint_fact",
    "lint_modules",
    "owner",
    "prunable_domains",
    "register",
    "unregister",
]

# One line per family dqtool ships; each module defines FAMILY.
BUILTIN = (
    "dqtool.families.qdq_onnx",
    "dqtool.families.qdq_microsoft",
    "dqtool.families.qdq_opmx",
    "dqtool.families.fused",
    "dqtool.families.integer",
)

_FAMILIES: dict[str, Family] = {}
_OWNER: dict[tuple[str, str], Family] = {}
_loaded = False
_generation = 0  # changes whenever the set of families does (derived tables rebuild)


def generation() -> int:
    """A number that changes whenever a family is registered or removed: a table derived
    from the families (the codecs', the evaluator's, lint's targets) rebuilds when it
    differs from the one it was built at."""
    _load()
    return _generation


def register(family: Family) -> Family:
    """Add ``family``; an operator owned twice is an error (one home per operator)."""
    global _generation
    _load()
    _add(family)
    _generation += 1
    return family


def unregister(name: str) -> Family:
    """Remove the family called ``name`` (a plugin unloaded, a test's own family)."""
    global _generation
    _load()
    family = _FAMILIES.pop(name)
    for op in family.ops:
        del _OWNER[op]
    _FOLD.pop(name, None)
    _INSPECT.pop(name, None)
    _CHECK.pop(name, None)
    _KERNELS.clear()
    _generation += 1
    return family


def _add(family: Family) -> None:
    if family.name in _FAMILIES:
        raise ValueError(f"family {family.name} registered twice")
    for op in family.ops:
        if op in _OWNER:
            raise ValueError(f"{op[0]}:{op[1]} belongs to {_OWNER[op].name} already, not "
                             f"also to {family.name}")
    _FAMILIES[family.name] = family
    for op in family.ops:
        _OWNER[op] = family


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN:
        _add(importlib.import_module(module).FAMILY)


def all_families() -> list[Family]:
    """Every registered family, in registration order."""
    _load()
    return list(_FAMILIES.values())


def owner(domain: str, op_type: str) -> Family | None:
    """The family that owns ``op_type`` of ``domain`` ("" and "ai.onnx" are one domain)."""
    _load()
    return _OWNER.get(("ai.onnx" if domain in ("", "ai.onnx") else domain, op_type))


def codecs() -> Iterator[Codec]:
    for family in all_families():
        if family.codecs is not None:
            yield from family.codecs()


def evaluator_ops() -> list[type[Any]]:
    """The ReferenceEvaluator operators of every family."""
    return [op for f in all_families() if f.evaluator_ops is not None
            for op in f.evaluator_ops()]


def fill_converters(reg: ConverterTable) -> ConverterTable:
    """Register every family's adapters into ``reg``."""
    for family in all_families():
        if family.converters is not None:
            family.converters(reg)
    return reg


_FOLD: dict[str, FoldSupport] = {}  # family name -> its fold support, built once
_KERNELS: dict[str, FoldKernel] = {}


def _fold_of(family: Family) -> FoldSupport | None:
    if family.fold is None:
        return None
    if family.name not in _FOLD:
        _FOLD[family.name] = family.fold()
    return _FOLD[family.name]


def fold_support(domain: str, op_type: str) -> FoldSupport | None:
    """How the fold pass folds this operator, or None if its family does not fold."""
    family = owner(domain, op_type)
    return None if family is None else _fold_of(family)


def fold_prepares() -> list[tuple[Family, FoldPrepare]]:
    """The families that fold by rewriting their nodes first, with that rewrite."""
    return [(f, support.prepare) for f in all_families()
            if (support := _fold_of(f)) is not None and support.prepare is not None]


def is_fold_root(domain: str, op_type: str) -> bool:
    """Whether the fold pass starts from this operator (its output becomes a constant)."""
    support = fold_support(domain, op_type)
    return support is not None and op_type in support.roots


def fold_kernel(name: str) -> FoldKernel:
    """The fold kernel called ``name`` (``folding.kernel_call.KernelCall.kind``)."""
    kernel = _KERNELS.get(name)
    if kernel is None:
        for family in all_families():
            support = _fold_of(family)
            if support is not None and name in support.kernels:
                kernel = _KERNELS[name] = support.kernels[name]
                break
        else:
            raise KeyError(f"no family has a fold kernel {name!r}")
    return kernel


def prunable_domains() -> frozenset[str]:
    """Domains whose opset import may be dropped once no node uses them."""
    return frozenset(d for f in all_families() for d in f.prunable)


def lint_fact(domain: str, target: str) -> str | None:
    """What the family of ``domain`` says about ``target`` (see ``Family.lint_facts``)."""
    domain = "ai.onnx" if domain in ("", "ai.onnx") else domain
    for family in all_families():
        if domain in family.domains and target in family.lint_facts:
            return family.lint_facts[target].format(domain=domain)
    return None


_INSPECT: dict[str, InspectSupport] = {}


def inspect_supports() -> list[InspectSupport]:
    """How each family that reports nodes to ``dqtool.inspect`` does, in registration order."""
    out = []
    for family in all_families():
        if family.inspect is None:
            continue
        if family.name not in _INSPECT:
            _INSPECT[family.name] = family.inspect()
        out.append(_INSPECT[family.name])
    return out


_CHECK: dict[str, CheckSupport] = {}


def check_supports() -> list[CheckSupport]:
    """What each family adds to checking, in registration order."""
    out = []
    for family in all_families():
        if family.check is None:
            continue
        if family.name not in _CHECK:
            _CHECK[family.name] = family.check()
        out.append(_CHECK[family.name])
    return out


def lint_modules() -> list[str]:
    return [m for f in all_families() for m in f.lint_modules]

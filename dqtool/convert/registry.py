"""Adapters, keyed by (domain, op, version, direction), held in a registry object.

An ai.onnx adapter converts one node across *one* version step: ``version`` is the
since-version on the upper side of the step, ``direction`` says which way ("up": from the
previous since-version to ``version``; "down": from ``version`` to the previous one).
Cross-domain adapters (com.microsoft, opmx → ai.onnx) use direction "onnx", with
``version`` the since-version of the family's op they read. ``find`` resolves a node's
domain version to the adapter registered for the since-version in force, so an op with
several versions needs one adapter per version.

The adapters dqtool ships come from the operator families (``dqtool.families``), each of
which fills a registry with its own.

Each ``Registry`` is its own table: tests build private ones and nothing leaks between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import onnx_ir as ir

from dqtool import registry

if TYPE_CHECKING:
    from dqtool.convert.context import Options, Step

Direction = Literal["up", "down", "onnx"]


@dataclass(frozen=True)
class Outcome:
    """What an adapter did to a node. ``refused`` carries the reason; ``kept`` means the
    node stays as it is on purpose (and says why)."""

    status: Literal["unchanged", "changed", "repaired", "kept", "refused"]
    how: str = ""
    why: str = ""

    @classmethod
    def unchanged(cls) -> Outcome:
        return cls("unchanged")

    @classmethod
    def refused(cls, reason: str) -> Outcome:
        return cls("refused", why=reason)

    @classmethod
    def merge(cls, outcomes: Iterable[Outcome]) -> Outcome:
        """Several steps done to one node, as one outcome (a refusal is returned on its own,
        never merged): ``unchanged`` steps drop out; ``changed`` if any step changed the
        node, else the first step's status; every step's how in order, each why once."""
        real = [o for o in outcomes if o.status != "unchanged"]
        if not real:
            return cls.unchanged()
        status = "changed" if any(o.status == "changed" for o in real) else real[0].status
        return cls(status, "; ".join(o.how for o in real),
                   "; ".join(dict.fromkeys(o.why for o in real)))


Adapter = Callable[[ir.Node, "Step"], Outcome]
Key = tuple[str, str, int, Direction]
# (node, options, target opset) → bytes of the node's constant inputs its adapter replaces
# with tensors it makes (0 when it keeps them): what a copy of the input's data file, made
# ahead of the conversion, would waste.
Replaces = Callable[[ir.Node, "Options", int], int]


class Registry:
    def __init__(self) -> None:
        self._table: dict[Key, Adapter] = {}
        self._widening: set[Key] = set()
        self._stepped: set[tuple[str, str]] = set()  # (domain, op) with "up"/"down" steps
        self._optional: set[tuple[str, str]] = set()
        self._replaces: dict[tuple[str, str], Replaces] = {}

    def register(self, domain: str, op: str, versions: int | Iterable[int],
                 direction: Direction, *, widening: bool = False, optional: bool = False,
                 replaces: Replaces | None = None) -> Callable[[Adapter], Adapter]:
        """Decorator: register ``func`` for every version given. ``widening`` says that the
        step only widens what is allowed (every later version accepts what an earlier one
        did), so the driver may skip it for a node valid at its source. ``optional``: an
        "onnx" rewrite of a working operator, which ``keep_contrib`` declines (the node
        stays in its domain). ``replaces``: see ``Replaces``."""
        vs = [versions] if isinstance(versions, int) else list(versions)
        if optional:
            self._optional.add((domain, op))
        if replaces is not None:
            self._replaces[(domain, op)] = replaces

        def deco(func: Adapter) -> Adapter:
            for v in vs:
                key = (domain, op, v, direction)
                if key in self._table:
                    raise ValueError(f"adapter for {key} registered twice")
                self._table[key] = func
                if direction in ("up", "down"):
                    self._stepped.add((domain, op))
                if widening:
                    self._widening.add(key)
            return func

        return deco

    def get(self, domain: str, op: str, version: int, direction: Direction) -> Adapter | None:
        return self._table.get((domain, op, version, direction))

    def find(self, domain: str, op: str, version: int, direction: Direction
             ) -> Adapter | None:
        """The adapter for the newest registered since-version not above ``version``."""
        since = [v for d, o, v, r in self._table if (d, o, r) == (domain, op, direction)
                 and v <= version]
        return self._table[(domain, op, max(since), direction)] if since else None

    def steps(self, domain: str, op: str) -> bool:
        """Whether ``op`` has version-step adapters ("up"/"down") here."""
        return (domain, op) in self._stepped

    def optional(self, domain: str, op: str) -> bool:
        """Whether the "onnx" rewrite of ``op`` is one ``keep_contrib`` declines."""
        return (domain, op) in self._optional

    def replaced_bytes(self, node: ir.Node, options: Options, target: int) -> int:
        """Bytes of ``node``'s constant inputs its adapter replaces (see ``Replaces``)."""
        key = (node.domain, node.op_type)
        fn = self._replaces.get(key)
        if fn is None or (options.keep_contrib and key in self._optional):
            return 0
        return fn(node, options, target)

    def widening(self, domain: str, op: str, version: int, direction: Direction) -> bool:
        return (domain, op, version, direction) in self._widening

    def keys(self) -> list[Key]:
        return sorted(self._table)

    def __contains__(self, key: Key) -> bool:
        return key in self._table


def default_registry() -> Registry:
    """A fresh registry holding every registered family's adapters."""
    return registry.fill_converters(Registry())

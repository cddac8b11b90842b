"""Which constant DequantizeLinear nodes a fold touches (``--op-types``, ``--include``, ...).

A node not selected is left and listed with the rule that left it, as data.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

import onnx_ir as ir

from dqtool import graph, types
from dqtool.errors import UsageError
from dqtool.spec import QuantSpec


def split_list(items: Iterable[str] | str | None) -> tuple[str, ...]:
    """``"a,b"`` or ``["a", "b,c"]`` → ``("a", "b", "c")``: options may repeat or use commas."""
    if items is None:
        return ()
    if isinstance(items, str):
        items = [items]
    return tuple(p.strip() for item in items for p in item.split(",") if p.strip())


@dataclass(frozen=True)
class Selection:
    op_types: tuple[str, ...] = ()  # fold only DQs feeding one of these ops
    include: tuple[str, ...] = ()  # name globs (node name or output name)
    exclude: tuple[str, ...] = ()
    x_types: tuple[str, ...] = ()  # quantized types, ONNX spelling
    min_elements: int = 0
    # Output names of DequantizeLinear nodes a family's fold preparation
    # (``FoldSupport.prepare``) made from nodes this selection picked: selected whatever
    # their names (the user named the original node).
    made: frozenset[str] = frozenset()

    @classmethod
    def from_options(cls, *, op_types=None, include=None, exclude=None, x_types=None,
                     min_elements: int = 0) -> Selection:
        xs = split_list(x_types)
        unknown = [t for t in xs if t not in types.TYPES]
        if unknown:
            raise UsageError(f"unknown element type(s) for --x-types: {', '.join(unknown)} "
                             f"(ONNX spellings, e.g. int8, uint4, int32, float8e4m3fn)")
        if min_elements < 0:
            raise UsageError(f"--min-elements must be >= 0, got {min_elements}")
        return cls(split_list(op_types), split_list(include), split_list(exclude), xs,
                   int(min_elements))

    def why_not(self, node: ir.Node, spec: QuantSpec) -> str | None:
        """None if the node is selected, else the rule that leaves it."""
        names = [n for n in (node.name, node.outputs[0].name) if n]
        if node.outputs[0].name in self.made:
            return None
        if self.include and not any(fnmatch.fnmatchcase(n, p) for n in names
                                    for p in self.include):
            return f"not selected: name matches no --include {','.join(self.include)}"
        if any(fnmatch.fnmatchcase(n, p) for n in names for p in self.exclude):
            return "not selected: name matches --exclude"
        if self.x_types and spec.quant_type not in self.x_types:
            return f"not selected: x type {spec.quant_type} not in --x-types"
        if self.op_types:
            feeds = {use.node.op_type for use in node.outputs[0].uses()}
            if not feeds & set(self.op_types):
                fed = ",".join(sorted(feeds)) or "nothing"
                return f"not selected: feeds {fed}, not --op-types {','.join(self.op_types)}"
        if self.min_elements:
            n = graph.num_elements(spec.x_shape)
            if n is not None and n < self.min_elements:
                return f"not selected: {n} elements < --min-elements {self.min_elements}"
        return None

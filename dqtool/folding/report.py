"""What a fold did, as data: the CLI renders it, ``--json`` prints ``to_json()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

if TYPE_CHECKING:
    from dqtool import types


def rounding(out: types.ElemType, store: types.ElemType) -> str | None:
    """``FoldedNode.rounding``: "float→float16" when ``--dtype`` stores a type that cannot
    hold every value of the node's own type, else None."""
    narrowing = store.bits < out.bits or (store.name != out.name and store.bits == out.bits)
    return f"{out.name}→{store.name}" if narrowing else None


@dataclass(frozen=True)
class FoldedNode:
    """A DequantizeLinear (or a weight Q→DQ pair) replaced by a constant."""

    name: str
    graph: str  # "main", "main/If_0/then_branch", "function:pkg.F"
    output: str  # the value name the constant keeps
    op: str  # "ai.onnx:DequantizeLinear-21", "com.microsoft:DequantizeLinear-1", ...
    quant_type: str | None
    output_type: str  # the node's own output type
    stored_type: str  # the type written (differs with --dtype)
    shape: tuple[int, ...]
    bytes_quantized: int | None  # the quantized input's stored size
    bytes_folded: int
    pair: bool = False  # x came from a QuantizeLinear of a constant
    rounding: str | None = None  # "float→float16" when --dtype narrows
    # x was gathered rows of a constant table: the node was moved before the Gather and
    # the table folded (``folding.commute``)
    before_gather: bool = False

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "graph": self.graph, "output": self.output, "op": self.op,
            "quant_type": self.quant_type, "output_type": self.output_type,
            "stored_type": self.stored_type, "shape": list(self.shape),
            "elements": self.elements, "bytes_quantized": self.bytes_quantized,
            "bytes_folded": self.bytes_folded, "pair": self.pair, "rounding": self.rounding,
            "before_gather": self.before_gather,
        }


@dataclass(frozen=True)
class LeftNode:
    """A DequantizeLinear left in the model, and why.

    ``refused`` marks a constant node the selection picked that cannot be folded exactly
    (the node breaks a rule of its operator); those make the CLI exit 1.
    """

    name: str
    graph: str
    reason: str
    refused: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "graph": self.graph, "reason": self.reason,
                "refused": self.refused}


@dataclass
class FoldReport:
    input: str | None  # the path read, None for an in-memory model
    output: str | None  # None for a dry run or an in-memory fold
    dry_run: bool
    dtype: str
    folded: list[FoldedNode] = field(default_factory=list)
    left: list[LeftNode] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # quantized constants nothing uses now
    kept: list[str] = field(default_factory=list)  # quantized constants still used elsewhere
    guarded: int = 0  # folded weights routed through an Identity (prepack guard)
    fed_op_types: set[str] = field(default_factory=set)  # op types DQs fed before folding
    bytes_before: int = 0  # initializer bytes of the input
    bytes_after: int = 0  # ... and of the result
    ir_version: int | None = None
    opset_imports: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    external_data: bool = False
    seconds: float = 0.0
    model: ir.Model | None = field(default=None, repr=False)  # the folded model
    # nodes a family rewrote into DequantizeLinear form first (``FoldSupport.prepare``: a
    # fused MatMul), and those it left, with why (JSON: "fused", "fused_left")
    prepared: list[str] = field(default_factory=list)
    prepared_left: list[tuple[str, str]] = field(default_factory=list)
    # hand-written dequantization (Cast → Sub → Mul) rewritten into DQ form first (the name
    # of each pattern's last node), and those left, with why
    handwritten: list[str] = field(default_factory=list)
    handwritten_left: list[tuple[str, str]] = field(default_factory=list)

    @property
    def refused(self) -> list[LeftNode]:
        return [n for n in self.left if n.refused]

    @property
    def exit_code(self) -> int:
        return 1 if self.refused else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "input": self.input, "output": self.output, "dry_run": self.dry_run,
            "dtype": self.dtype,
            "summary": {
                "folded": len(self.folded),
                "pairs": sum(n.pair for n in self.folded),
                "rounded": sum(n.rounding is not None for n in self.folded),
                "left": len(self.left), "refused": len(self.refused),
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
                "removed_initializers": len(self.removed),
                "kept_initializers": len(self.kept), "prepack_guarded": self.guarded,
                "fused_unfused": len(self.prepared), "fused_left": len(self.prepared_left),
                "handwritten": len(self.handwritten),
                "handwritten_left": len(self.handwritten_left),
            },
            "fused": list(self.prepared),
            "fused_left": [{"name": n, "reason": r} for n, r in self.prepared_left],
            "handwritten": list(self.handwritten),
            "handwritten_left": [{"name": n, "reason": r} for n, r in self.handwritten_left],
            "folded": [n.to_json() for n in self.folded],
            "left": [n.to_json() for n in self.left],
            "removed": list(self.removed), "kept": list(self.kept),
            "ir_version": self.ir_version, "opset_imports": dict(self.opset_imports),
            "files": list(self.files), "external_data": self.external_data,
            "seconds": round(self.seconds, 3), "exit_code": self.exit_code,
        }

"""The meaning of a dequantization that lives inside a com.microsoft fused operator.

``FusedSpec`` is the sibling of ``dqtool.spec.QuantSpec`` for MatMulNBits and
GatherBlockQuantized: small immutable data, read without touching tensor data, with what is
wrong kept in ``problems`` (codes ``FU...``). Field names match QuantSpec's where they mean
the same thing, so reports treat both alike.

The *logical weight* is the float tensor the operator dequantizes:
- MatMulNBits: ``W`` of shape ``(K, N)`` with ``Y = A @ W (+ bias)``; the stored B is
  ``(N, k_blocks, blob)`` uint8, codes packed low bits first along K. In ai.onnx terms
  ``W = DequantizeLinear(x (K, N), scale (k_blocks, N), zp)`` blocked along axis 0.
- GatherBlockQuantized: the whole table ``data`` dequantized blocked along
  ``quantize_axis``; the operator gathers from it along ``gather_axis``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from dqtool.spec import Dim, Granularity, HasProblems, Problem

FusedOp = Literal["MatMulNBits", "GatherBlockQuantized"]
DOMAIN = "com.microsoft"
OPS: tuple[str, ...] = ("MatMulNBits", "GatherBlockQuantized")

# Stable problem codes (lint reuses them).
P_FUSED_INPUTS = "FU001"  # inputs missing / too many, or required attributes missing
P_FUSED_ATTR = "FU002"  # an attribute out of its allowed range (bits, block_size, axes)
P_FUSED_TYPE = "FU003"  # an input type the operator does not take
P_FUSED_SHAPE = "FU004"  # B / scales / zero points / data shapes disagree with K, N, blocks
P_FUSED_G_IDX = "FU005"  # g_idx present: act-order, computed, or run by onnxruntime its own way
P_FUSED_ACCURACY = "FU006"  # accuracy_level > 0: the runtime may quantize A
P_FUSED_RUNTIME = "FU007"  # a combination onnxruntime's CPU kernel rejects


@dataclass(frozen=True)
class FusedSpec(HasProblems):
    """One MatMulNBits or GatherBlockQuantized node, by the meaning of its weight."""

    op: FusedOp
    domain: str
    version: int
    since_version: int
    quant_type: str | None  # the codes as ai.onnx would type them: uint2/uint4/uint8/int4
    scale_type: str | None
    float_type: str | None  # the dequantized weight's (and the output's) type
    granularity: Granularity | None
    bits: int | None
    axis: int | None  # the blocked axis of the logical weight (MatMulNBits: 0, along K)
    block_size: int | None
    zero_point: Literal["none", "integer", "float"] = "none"
    zero_point_type: str | None = None
    zero_point_packed: bool = False  # uint8 bytes holding several codes each
    default_zero_point: int | None = None  # what a missing zero point means
    packing: str = "none"  # how the stored codes are packed
    x_shape: tuple[Dim, ...] | None = None  # the logical weight's shape
    stored_shape: tuple[Dim, ...] | None = None  # the stored tensor's shape
    scale_shape: tuple[Dim, ...] | None = None
    x_constant: bool = False
    scale_constant: bool = False
    zero_point_constant: bool = False
    g_idx: Literal["none", "trivial", "act-order", "unknown"] = "none"
    has_bias: bool = False
    accuracy_level: int = 0
    gather_axis: int | None = None
    attributes: tuple[tuple[str, object], ...] = ()
    problems: tuple[Problem, ...] = field(default=())

    kind = "fused"

    @property
    def is_dequantize(self) -> bool:
        return True

    @property
    def x_from_quantize(self) -> bool:
        return False

    @property
    def constant(self) -> bool:
        """The weight is known at load time (it can be folded or converted offline)."""
        zp_ok = self.zero_point == "none" or self.zero_point_constant
        return self.x_constant and self.scale_constant and zp_ok

    @property
    def k_blocks(self) -> int | None:
        if self.x_shape is None or self.axis is None or self.block_size is None:
            return None
        # MatMulNBits blocks run along K (axis 0) even when one block makes it per-axis.
        d = self.x_shape[0 if self.op == "MatMulNBits" else self.axis]
        return -(-d // self.block_size) if isinstance(d, int) else None

    def with_problems(self, *more: Problem) -> FusedSpec:
        return replace(self, problems=self.problems + tuple(more))

    def attribute(self, name: str, default: object = None) -> object:
        return dict(self.attributes).get(name, default)

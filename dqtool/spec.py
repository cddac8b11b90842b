"""The meaning of one (de)quantization node, independent of how it is encoded.

A ``QuantSpec`` is small immutable data: every codec (ai.onnx versions, com.microsoft,
opmx) reads a node into one, and every converter, fold, check and lint works from it.
Reading never raises for a broken node: what is wrong is kept in ``problems``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import onnx_ir as ir


def op_id(domain: str, op_type: str, version: int | None) -> str:
    """How every report names an operator: ``ai.onnx:DequantizeLinear-21`` (the domain as
    reports spell it, the op type, the version in force; no version when none is known)."""
    domain = "ai.onnx" if domain in ("", "ai.onnx") else domain
    return f"{domain}:{op_type}" if version is None else f"{domain}:{op_type}-{version}"

Granularity = Literal["per-tensor", "per-axis", "blocked"]
ZeroPointKind = Literal["none", "integer", "float"]
Severity = Literal["error", "warning", "info"]
Dim = int | str | None  # a fixed size, a symbolic name, or unknown


@dataclass(frozen=True)
class Problem:
    """A rule a node breaks (or a caution about it), with a stable code for lint."""

    code: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return self.message


# Stable problem codes; lint's rule codes reuse them (``docs/commands/lint.md`` lists each).
P_TYPE = "DQ010"  # quantized / scale / output type not allowed at the version in force
P_ATTR = "DQ011"  # attribute unknown at the version in force
P_SHAPE = "DQ012"  # scale / zero-point shape rules
P_AXIS = "DQ013"  # axis out of range
P_BLOCK = "DQ014"  # bad block size
P_ZP = "DQ015"  # zero point rules (type, float8/float4 non-zero)
P_INT32_ZP = "DQ016"  # int32 with a non-zero zero point: spec says none, runtimes apply it
P_VERSION = "DQ017"  # op does not exist at the version in force / unknown version
P_INPUTS = "DQ018"  # wrong number of inputs or attributes missing
P_PRECISION = "DQ019"  # spec-literal precision could differ from what runtimes compute
P_ZP_VALUE = "DQ002"  # zero-point values: outside the type's range, non-zero for float types
P_NO_IMPORT = "DQ020"  # a domain used without an opset import


class HasProblems:
    """What every description derives from its ``problems``: the errors among them, and
    whether there are none."""

    problems: tuple[Problem, ...]

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def valid(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class QuantSpec(HasProblems):
    """One DequantizeLinear or QuantizeLinear node, by meaning.

    ``quant_type`` is the quantized type (DQ's input, Q's output); ``float_type`` is the
    full-precision side (DQ's output, Q's input). Type names are ONNX's (``int4``,
    ``float``); None where the model does not say.
    """

    op: Literal["DequantizeLinear", "QuantizeLinear"]
    domain: str  # "ai.onnx", "com.microsoft", "opmx", "pmx"
    version: int  # the version in force for this node's domain
    since_version: int  # the schema version that version resolves to
    quant_type: str | None
    scale_type: str | None
    float_type: str | None
    granularity: Granularity | None
    axis: int | None = None  # normalized (non-negative) when the rank is known
    block_size: int | None = None
    zero_point: ZeroPointKind = "none"
    zero_point_type: str | None = None
    packing: str = "none"  # "none", or how the quantized values are packed (opmx int4x4)
    x_shape: tuple[Dim, ...] | None = None  # the unpacked (logical) shape
    scale_shape: tuple[Dim, ...] | None = None
    x_constant: bool = False
    scale_constant: bool = False
    zero_point_constant: bool = False
    x_from_quantize: bool = False  # x is a QuantizeLinear of constants (a weight Q→DQ pair)
    output_dtype_attr: str | None = None  # DQ 23+/Q 21+ output_dtype, when set
    saturate: bool | None = None  # QuantizeLinear float8 only
    attributes: tuple[tuple[str, object], ...] = ()  # dialect extras (opmx), name-sorted
    problems: tuple[Problem, ...] = field(default=())

    @property
    def op_id(self) -> str:
        return op_id(self.domain, self.op, self.version)

    @property
    def is_dequantize(self) -> bool:
        return self.op == "DequantizeLinear"

    @property
    def constant(self) -> bool:
        """All inputs are known at load time, so the node can be folded."""
        x_ok = self.x_constant or self.x_from_quantize
        zp_ok = self.zero_point == "none" or self.zero_point_constant
        return x_ok and self.scale_constant and zp_ok

    def with_problems(self, *more: Problem) -> QuantSpec:
        return replace(self, problems=self.problems + tuple(more))

    def attribute(self, name: str, default: object = None) -> object:
        return dict(self.attributes).get(name, default)


class Codec(Protocol):
    """Reads one encoding of a (de)quantization node into a ``QuantSpec`` (the codecs are
    in ``dqtool.codecs``; operator families name theirs to the registry)."""

    domain: str  # as reports spell it: "ai.onnx", "com.microsoft", "opmx", "pmx"
    op: str
    since_version: int

    def read(self, node: ir.Node, version: int) -> QuantSpec: ...

"""What a target profile is: for each DequantizeLinear, the operators the target could run
it with, and why each cannot. The node runs if one candidate has no issue; otherwise the
candidate with the fewest issues is reported, each issue as one finding."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dqtool import versions
from dqtool.spec import QuantSpec


@dataclass(frozen=True)
class Issue:
    code: str  # DQ101..DQ108
    reason: str
    fix: str | None = None


@dataclass
class Candidate:
    """One operator of the target that might run the node, and why it cannot."""

    name: str
    issues: list[Issue] = field(default_factory=list)

    def add(self, code: str, reason: str, fix: str | None = None) -> None:
        self.issues.append(Issue(code, reason, fix))


@dataclass(frozen=True)
class Profile:
    name: str  # as given to --target
    description: str
    candidates: Callable[[QuantSpec, int], list[Candidate]]  # (spec, model ai.onnx opset)
    max_opset: int | None = None  # ai.onnx opset above which the target runs nothing
    opset_fix: str | None = None


def best(candidates: list[Candidate]) -> Candidate | None:
    """None when some candidate runs the node."""
    if not candidates or any(not c.issues for c in candidates):
        return None
    return min(candidates, key=lambda c: len(c.issues))


def rank_of(spec: QuantSpec) -> int | None:
    return None if spec.x_shape is None else len(spec.x_shape)


def ragged(spec: QuantSpec) -> bool:
    """A blocked node whose last block is shorter (the dimension is known)."""
    if spec.granularity != "blocked" or spec.x_shape is None or not spec.block_size:
        return False
    if spec.axis is None or spec.axis >= len(spec.x_shape):
        return False
    dim = spec.x_shape[spec.axis]
    return isinstance(dim, int) and dim % spec.block_size != 0


def or_fold(spec: QuantSpec, fix: str | None) -> str | None:
    """Add folding as a way out when the node is constant."""
    if not spec.constant:
        return fix
    fold = "`dqtool fold` (the node is constant)"
    return fold if fix is None else f"{fix}, or {fold}"


def to_ai_onnx_fix(spec: QuantSpec, opset: int) -> str:
    lowest = versions.lowest_version(spec)
    if lowest is None:
        return or_fold(spec, None) or "none: no ai.onnx DequantizeLinear expresses it"
    return f"`dqtool upgrade --opset {max(lowest, opset)}` (to ai.onnx DequantizeLinear)"


@dataclass(frozen=True)
class Target:
    """One entry of the ``--target`` table: the name(s) it answers to and how a name becomes
    a ``Profile``. A target module lists its entries in a module-level ``TARGETS``;
    ``dqtool.linting.targets`` collects them from every module of its package and from the
    families' ``lint_modules``, so adding a target is adding a module (or a line there).

    - ``name``: as ``--target`` help, error messages and the docs show it
      (``"onnx-opset-N"``, ``"directml-fl6.3"``).
    - ``summary``: one line for the docs' target table.
    - ``parse``: the profile for a ``--target`` value, or None when the value is not this
      target's; may raise ``UsageError`` for a value that is its but wrong (opset 9).
    - ``order``: where it stands in the table (lower first; ties keep module order).
    """

    name: str
    summary: str
    parse: Callable[[str], Profile | None]
    order: int = 50


def fixed(profile: Profile, order: int = 50) -> Target:
    """A target that answers to exactly its profile's name."""
    return Target(profile.name, profile.description,
                  lambda value: profile if value == profile.name else None, order)

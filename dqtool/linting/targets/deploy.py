"""Deployment targets (``qnn-htp``, ``openvino``, ``tensorrt``): whether each QDQ node unit
runs quantized on the target, and why not.

A deployment runtime does not fail on a node it cannot run quantized: it runs it in float,
or on the CPU. So beside the DequantizeLinear checks every profile has (``candidates``), a
``DeployProfile`` judges each node unit (``units``) and reports, per operator type, how many
run quantized and which fall back: the question a team shipping to a device asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dqtool.linting.context import ModelContext, QuantSite
from dqtool.linting.finding import Finding
from dqtool.linting.targets.base import Candidate, Issue, Profile
from dqtool.linting.targets.units import NodeUnit, units
from dqtool.spec import QuantSpec, op_id

PLACEMENT = "DQ112"
_LISTED = 6  # fallback names a summary lists before "and N more"


def no_candidates(spec: QuantSpec, opset: int) -> list[Candidate]:
    """For targets that judge node units only: no DequantizeLinear finding of its own."""
    return []


@dataclass(frozen=True)
class DeployProfile(Profile):
    """A ``Profile`` that also judges node units. ``judge`` lists what stops a unit from
    running quantized (empty: it runs quantized; None: a unit the profile does not judge,
    an operator its rules were not measured for); ``where`` ends the summary ("on HTP");
    ``unit_codes`` the codes reported on the unit (None: all of them; TensorRT reports the
    Q/DQ rules on the DequantizeLinear nodes, which it refuses themselves)."""

    judge: Callable[[NodeUnit], list[Issue] | None] | None = None
    where: str = ""
    fallback: str = "falls back to float"
    unit_codes: frozenset[str] | None = None
    refusals: frozenset[str] = frozenset()  # codes for which the runtime refuses the model
    # Per DequantizeLinear, with the node (TensorRT reads zero-point values); else
    # ``candidates`` of the spec alone.
    site_candidates: Callable[[QuantSite, int], list[Candidate]] | None = None


@dataclass(frozen=True)
class Verdict:
    """One node unit on one target."""

    unit: NodeUnit
    issues: tuple[Issue, ...]

    @property
    def quantized(self) -> bool:
        return not self.issues

    def to_json(self) -> dict[str, object]:
        return {"node": self.unit.name, "op_type": self.unit.op_type,
                "graph": self.unit.graph, "quantized": self.quantized,
                "issues": [{"code": i.code, "reason": i.reason, "fix": i.fix}
                           for i in self.issues]}


def placement(ctx: ModelContext, profile: DeployProfile) -> list[Verdict]:
    """Each node unit of the model, in graph order, with what stops it running quantized."""
    judge = profile.judge
    assert judge is not None, f"{profile.name} judges no node units"
    # A unit with an invalid DequantizeLinear is the model rules' (DQ010–DQ019): no runtime
    # loads the model, so there is no placement to tell.
    valid = (u for u in units(ctx) if all(o.spec is None or o.spec.valid for o in u.operands))
    found = ((u, judge(u)) for u in valid)
    return [Verdict(u, tuple(issues)) for u, issues in found if issues is not None]


def _unit_op(unit: NodeUnit) -> str:
    node = unit.site.node
    return op_id(node.domain, node.op_type, None)


def summary(profile: DeployProfile, op_type: str, verdicts: list[Verdict]) -> str:
    """``qnn-htp: 12 of 14 Conv run quantized on HTP; 2 fall back: c3, c7``."""
    ran = sum(v.quantized for v in verdicts)
    text = f"{profile.name}: {ran} of {len(verdicts)} {op_type} run quantized {profile.where}"
    failed = [v.unit.name for v in verdicts if not v.quantized]
    if failed:
        shown = ", ".join(failed[:_LISTED])
        more = f" and {len(failed) - _LISTED} more" if len(failed) > _LISTED else ""
        text += f"; {len(failed)} fall back: {shown}{more}"
    return text.rstrip()


def findings(ctx: ModelContext, profile: DeployProfile) -> Iterator[Finding]:
    """One error per issue of each unit that falls back (those of ``unit_codes``), then
    one summary per operator type."""
    verdicts = placement(ctx, profile)
    for v in verdicts:
        u = v.unit
        for issue in v.issues:
            if profile.unit_codes is None or issue.code in profile.unit_codes:
                verb = "refuses the model" if issue.code in profile.refusals else \
                    profile.fallback
                yield ctx.finding(issue.code, "error", f"({u.op_type}) {profile.name} "
                                  f"{verb}: {issue.reason}", node=u.name, where=u.graph,
                                  op=_unit_op(u), target=profile.name, fix=issue.fix)
    by_type: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by_type.setdefault(v.unit.op_type, []).append(v)
    for op_type, group in by_type.items():
        yield ctx.finding(PLACEMENT, "info", summary(profile, op_type, group),
                          target=profile.name)

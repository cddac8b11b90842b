"""``dqtool.to_qdq`` / ``dqtool.to_qoperator``: integer operators ⇄ QDQ, on paths or models.

    report = to_qdq("m.onnx", "m.qdq.onnx")            # writes m.qdq.onnx
    report = to_qdq("m.onnx", "m.qdq.onnx", check=True)
    report = to_qoperator("m.qdq.onnx", "m.qop.onnx")

The converted model is ``report.model``; a model object passed in is not changed.
A node that cannot be rewritten is refused with its reason; any refusal means nothing is
written (``IntegerConversionRefused``, exit 1) unless ``keep_unconvertible`` leaves those
nodes as they are. ``check`` runs both models and fails (``IntegerCheckFailed``, nothing
written) when a converted operator, fed the original's inputs, is more than one
quantization step from the original (or, when no operator can be measured alone, an
output is); outputs end to end are reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import onnx_ir as ir

from dqtool import graph, storage
from dqtool.checking.models import load as load_for_check
from dqtool.convert import pipeline
from dqtool.convert.context import Options
from dqtool.errors import RefusedError
from dqtool.families.integer import local_error
from dqtool.families.integer.rewrite import Change, Refusal
from dqtool.integer import numerics
from dqtool.integer.numerics import NumericsCheck
from dqtool.integer.to_qdq import IntegerToQdqPass
from dqtool.integer.to_qoperator import QdqToIntegerPass

Direction = Literal["to-qdq", "to-qoperator"]


@dataclass
class IntegerReport:
    input: str  # the path read, "<model>" for a model object
    direction: Direction
    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    kept: bool = False  # refused nodes were left as they are (keep_unconvertible)
    model: ir.Model | None = None
    check: NumericsCheck | None = None
    files: list[str] = field(default_factory=list)  # every file written
    # the exact opset upgrade made first, where a rewritten node needs a newer
    # DequantizeLinear (a ``dqtool.convert.ConvertReport``)
    upgrade: Any = None

    @property
    def ok(self) -> bool:
        return (not self.refusals or self.kept) and (self.check is None or self.check.ok)

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "direction": self.direction, "ok": self.ok,
                "changed": [c.to_json() for c in self.changes],
                "refused": [r.to_json() for r in self.refusals], "kept_refused": self.kept,
                "check": None if self.check is None else self.check.to_json(),
                "upgrade": None if self.upgrade is None else self.upgrade.to_json(),
                "files": self.files}


class IntegerConversionRefused(RefusedError):
    def __init__(self, report: IntegerReport) -> None:
        self.report = report
        first = report.refusals[0]
        super().__init__(f"{report.input}: {len(report.refusals)} node(s) refused, nothing "
                         f"written; first: {first.node} ({first.op}): {first.reason} "
                         "(--keep-unconvertible writes the rest, leaving these as they are)")


class IntegerCheckFailed(RefusedError):
    def __init__(self, report: IntegerReport) -> None:
        self.report = report
        c = report.check
        if c is None or not c.outputs:
            what = "no runtime ran both models, so nothing was compared"
        elif c.measured_locally:
            beyond = local_error_summary(c)["beyond_one_step"]
            what = (f"{len(beyond)} converted operator(s) more than one quantization step "
                    f"from the original on the original's inputs (first: {beyond[0]})")
        else:
            what = "an output moved by more than one quantization step"
        super().__init__(f"{report.input}: --check: {what}; nothing written")


def local_error_summary(check: NumericsCheck) -> dict[str, Any]:
    return local_error.summary(check.local)


ModelArg = ir.Model | str | os.PathLike


def default_output(path: str | os.PathLike, direction: Direction) -> Path:
    p = Path(path)
    return p.with_name(f"{p.stem}.{'qdq' if direction == 'to-qdq' else 'qop'}.onnx")


def to_qdq(model_or_path: ModelArg, out: str | os.PathLike | None = None, *,
           keep_unconvertible: bool = False, check: bool = False, in_place: bool = False,
           exact_dynamic: bool = False, **writing: Any) -> IntegerReport:
    """Every integer operator with a faithful QDQ form becomes DequantizeLinear → float op
    → QuantizeLinear (``to_qdq.IntegerToQdqPass``). ``exact_dynamic``: MatMulInteger /
    ConvInteger take the exact form (DequantizeLinear with scale 1, the scale product
    applied after the float op), equal to the integer original within 2**24."""
    return _run(model_or_path, out, "to-qdq", lambda: IntegerToQdqPass(exact_dynamic),
                keep_unconvertible, check, in_place, **writing)


def to_qoperator(model_or_path: ModelArg, out: str | os.PathLike | None = None, *,
                 check: bool = False, in_place: bool = False, **writing: Any
                 ) -> IntegerReport:
    """The QDQ patterns onnxruntime fuses become integer operators
    (``to_qoperator.QdqToIntegerPass``); other QDQ nodes stay as they are."""
    return _run(model_or_path, out, "to-qoperator", QdqToIntegerPass, True, check, in_place,
                **writing)


def _run(model_or_path: ModelArg, out, direction: Direction, make: Any, keep: bool,
         check: bool, in_place: bool, external_data: bool | None = None,
         shard_size: int | None = None, progress: Any = None) -> IntegerReport:
    """``external_data``, ``shard_size``, ``progress``: how the output is written
    (``dqtool.storage.Writing``)."""
    req = storage.request(model_or_path, out, in_place=in_place)

    def transform(model: ir.Model, _early: Any) -> tuple[IntegerReport, ir.Model]:
        # A model object is left as it was: the rewrite works on a copy (``report.model``),
        # so a refused conversion cannot leave the caller's model half-rewritten.
        if req.path is None:
            model = ir.serde.deserialize_model(ir.serde.serialize_model(model))
        model, rewrite, upgrade = _rewritten(model, make, req)
        outcome = rewrite.outcome
        report = IntegerReport(req.source, direction, outcome.changes, outcome.refusals,
                               kept=keep, upgrade=upgrade)
        if outcome.refusals and not keep:
            raise IntegerConversionRefused(report)
        report.model = model
        return report, model

    def checker(model: ir.Model) -> storage.Verifier:
        original = load_for_check(model).proto

        def verify(made: Any, report: IntegerReport) -> None:
            report.check = numerics.judge(original, load_for_check(made).proto,
                                          fused=direction == "to-qdq")
            if not report.check.ok:
                raise IntegerCheckFailed(report)

        return storage.Verifier(verify)

    job = storage.Job(transform, storage.Writing(external_data, shard_size, progress),
                      check=checker if check else None)
    report, _, written = job.run(model_or_path, req)
    report.files = [str(p) for p in written]
    return report


def _rewritten(model: ir.Model, make: Any, req: Any) -> tuple[ir.Model, Any, Any]:
    """The model rewritten by a new pass from ``make()``, that pass, and the exact opset
    upgrade made first (None if none was needed): where a node is refused only because
    the model's ai.onnx opset cannot express its DequantizeLinear, the model is upgraded
    as ``dqtool upgrade`` does (refused where it would refuse), then rewritten."""
    trial = make()
    graph.sort_if_needed(model)  # a copy needs its graphs in order (a cycle is refused)
    work = model.clone()  # the model's tensors are shared, not copied
    work.meta.update(model.meta)  # what was loaded from where: the save's guards read it
    trial(work)
    needed = getattr(trial.outcome, "needs_opset", None)
    if needed is None:
        return work, trial, None

    upgrade = pipeline.run(model, needed, "upgrade", Options(), path=req.path, copy=False)
    upgraded = upgrade.model
    assert upgraded is not None
    rewrite = make()
    rewrite(upgraded)
    return upgraded, rewrite, upgrade

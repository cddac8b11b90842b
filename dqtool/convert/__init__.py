"""``dqtool.upgrade`` / ``dqtool.downgrade``: exact conversion between opsets and domains.

    report = dqtool.upgrade("m.onnx", 21, "m21.onnx")        # writes m21.onnx
    report = dqtool.upgrade("m.onnx", 21)                     # report.model, nothing written
    report = dqtool.downgrade("m.onnx", 13, "m13.onnx", allow_decompose=True)

Raises ``ConversionRefused`` (a ``RefusedError``, exit 1; ``.report`` says which nodes and
why) when any node cannot be converted exactly, and writes nothing then. All or nothing: a
model object passed in is never changed (``report.model`` is the converted copy, sharing
the input's tensors), whether the conversion succeeds or is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import onnx_ir as ir

from dqtool import graph, storage
from dqtool.convert import handwritten_step, pipeline
from dqtool.convert.context import Options
from dqtool.convert.pipeline import default_output
from dqtool.convert.registry import Registry, default_registry
from dqtool.convert.report import CheckFailed, ConversionRefused, ConvertReport
from dqtool.errors import InputError, UsageError


def _rewrites_most(model: ir.Model, options: Options, target: int, reg: Registry) -> bool:
    """Whether the adapters replace more than half of the model's tensor bytes (reading no
    tensor data)."""
    replaced = sum(reg.replaced_bytes(s.node, options, target) for s in graph.walk(model))
    return replaced > storage.tensor_bytes(model) // 2


__all__ = ["CheckFailed", "ConversionRefused", "ConvertReport", "Registry", "default_output",
           "default_registry", "downgrade", "upgrade"]

ModelArg = ir.Model | str | os.PathLike


def upgrade(model_or_path: ModelArg, opset: int, out: str | os.PathLike | None = None, *,
            per_axis: bool = False, check: bool = False, in_place: bool = False,
            registry: Registry | None = None, external_data: bool | None = None,
            shard_size: int | None = None, progress: Callable | None = None,
            keep_contrib: bool = False, handwritten: bool = False,
            while_writing: Callable[[ConvertReport], None] | None = None,
            started_copy: storage.EarlyCopy | None = None) -> ConvertReport:
    """Move the model's ai.onnx opset up to ``opset``; com.microsoft / opmx Q/DQ become
    ai.onnx where ``opset`` expresses them; invalid Q/DQ that ``opset`` accepts are repaired.
    ``per_axis`` also rewrites every blocked DequantizeLinear to per-axis. com.microsoft
    MatMulNBits / GatherBlockQuantized become DequantizeLinear + MatMul / Gather (exact),
    unless ``keep_contrib``. ``handwritten`` then rewrites dequantization written by hand
    (Cast → Sub → Mul) into DequantizeLinear, exactly (``dqtool.handwritten``).
    ``registry``: the adapters to use (default: every registered family's).
    ``external_data``, ``shard_size``, ``progress``, ``while_writing``: how the output is
    written (``dqtool.storage.Writing``, and ``Job.while_writing``); ``started_copy``: a
    copy of the input started ahead (``dqtool.storage.start_early_copy``), which the caller
    discards when done."""
    return _convert(model_or_path, opset, out, "upgrade",
                    Options(per_axis=per_axis, keep_contrib=keep_contrib,
                            handwritten=handwritten),
                    check, in_place, registry,
                    storage.Writing(external_data, shard_size, progress, started_copy),
                    while_writing)


def downgrade(model_or_path: ModelArg, opset: int, out: str | os.PathLike | None = None, *,
              per_axis: bool = False, allow_decompose: bool = False, check: bool = False,
              in_place: bool = False, registry: Registry | None = None,
              external_data: bool | None = None, shard_size: int | None = None,
              progress: Callable | None = None, keep_contrib: bool = False,
              while_writing: Callable[[ConvertReport], None] | None = None,
              started_copy: storage.EarlyCopy | None = None) -> ConvertReport:
    """Lower the model to ``opset`` by exact rewrites, or refuse with the reason;
    ``allow_decompose`` turns a DequantizeLinear no version at ``opset`` expresses into
    Cast/Sub/Mul (exact, but no longer a QDQ pattern). Other options as ``upgrade``."""
    return _convert(model_or_path, opset, out, "downgrade",
                    Options(per_axis=per_axis, allow_decompose=allow_decompose,
                            keep_contrib=keep_contrib), check,
                    in_place, registry,
                    storage.Writing(external_data, shard_size, progress, started_copy),
                    while_writing)


def _early(options: Options, opset: int, reg: Registry) -> Callable[[ir.Model], str]:
    """What the output's data file does during the conversion: the input's data file
    copies to the output, overlapping it; but when a family's nodes, which the conversion
    rewrites, hold most of the bytes (the copy would be dropped), the data file is written
    as the conversion makes the new weights."""
    return lambda model: "write" if _rewrites_most(model, options, opset, reg) else "copy"


def _checker(path: Path | None, out: Path | None) -> Callable[[ir.Model], Any]:
    """``--check``: the converted model against the model as loaded. A model with external
    data is checked from its files, the converted one as written (before it is renamed
    into place): no tensor is copied into a protobuf, so any size works. Otherwise both are
    checked in memory, which protobuf limits to 2 GB."""
    # Imported here: dqtool.checking (onnx's reference evaluator and check's modules, over
    # 0.1 s) is only for --check; an upgrade without it never loads it.
    from dqtool.checking import conversion
    from dqtool.checking.models import MAX_IN_PROTO

    def make(model: ir.Model) -> storage.Verifier:
        from_files = out is not None and path is not None and storage.uses_external_data(model)
        if not from_files and storage.tensor_bytes(model) > MAX_IN_PROTO:
            raise UsageError("check on a model past protobuf's 2 GB limit needs the model's "
                             "path and an output path (both models are then checked from "
                             "their files)")
        original = conversion.loaded(path if from_files else model)

        def run(converted: ir.Model | Path, report: ConvertReport) -> None:
            try:
                report.check = conversion.compare(original, conversion.loaded(converted))
            except InputError as e:
                raise InputError(f"{report.input}: --check: {e}") from None
            if not report.check.ok:
                raise CheckFailed(report)

        return storage.Verifier(run, from_files)

    return make


def _convert(model_or_path: ModelArg, opset: int, out, direction: Literal["upgrade", "downgrade"],
             options: Options, check: bool, in_place: bool, registry: Registry | None,
             writing: storage.Writing,
             while_writing: Callable[[ConvertReport], None] | None) -> ConvertReport:
    req = storage.request(model_or_path, out, in_place=in_place)
    reg = registry or default_registry()

    def transform(model: ir.Model, early: Any) -> tuple[ConvertReport, ir.Model]:
        # A model loaded here has no other reference: converted in place, dropped on refusal.
        report = pipeline.run(model, opset, direction, options, reg, path=req.path,
                              copy=req.path is None, early=early)
        if options.handwritten:
            handwritten_step.apply(report, opset)
        assert report.model is not None
        return report, report.model

    job = storage.Job(transform, writing, check=_checker(req.path, req.out) if check else None,
                      early=_early(options, opset, reg), while_writing=while_writing)
    report, _, written = job.run(model_or_path, req)
    if req.out is not None:
        report.files = [str(p) for p in written]
        report.external_data = len(written) > 1  # none when every tensor stayed inline
    return report

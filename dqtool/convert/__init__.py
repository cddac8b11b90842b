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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import onnx_ir as ir

from dqtool.convert.context import Options
from dqtool.convert.pipeline import default_output
from dqtool.convert.registry import Registry, default_registry
from dqtool.convert.report import CheckFailed, ConversionRefused, ConvertReport
from dqtool.errors import InputError, UsageError


def _rewrites_most(model: ir.Model, options: Options, target: int, reg: Registry) -> bool:
    """Whether the adapters replace more than half of the model's tensor bytes (reading no
    tensor data)."""
    from dqtool import graph, storage

    replaced = sum(reg.replaced_bytes(s.node, options, target) for s in graph.walk(model))
    return replaced > storage.tensor_bytes(model) // 2


__all__ = ["CheckFailed", "ConversionRefused", "ConvertReport", "Registry", "default_output",
           "default_registry", "downgrade", "upgrade"]

ModelArg = ir.Model | str | os.PathLike


@dataclass(frozen=True)
class Writing:
    """How the output is written, as ``fold`` writes it: ``external_data`` True forces
    external data, None (default) uses it when the input did or the output would pass
    ~1.8 GB; ``shard_size`` splits it into files of at most that many bytes;
    ``progress(tensor, info)`` is called per tensor written as external data;
    ``while_writing(report)`` once the model file is written, while its data may still be
    (``report.files`` is not set yet)."""

    external_data: bool | None = None
    shard_size: int | None = None
    progress: Callable | None = None
    while_writing: Callable[[ConvertReport], None] | None = None


def upgrade(model_or_path: ModelArg, opset: int, out: str | os.PathLike | None = None, *,
            per_axis: bool = False, check: bool = False, in_place: bool = False,
            registry: Registry | None = None, external_data: bool | None = None,
            shard_size: int | None = None, progress: Callable | None = None,
            keep_contrib: bool = False,
            while_writing: Callable[[ConvertReport], None] | None = None) -> ConvertReport:
    """Move the model's ai.onnx opset up to ``opset``; com.microsoft / opmx Q/DQ become
    ai.onnx where ``opset`` expresses them; invalid Q/DQ that ``opset`` accepts are repaired.
    ``per_axis`` also rewrites every blocked DequantizeLinear to per-axis. com.microsoft
    MatMulNBits / GatherBlockQuantized become DequantizeLinear + MatMul / Gather (exact),
    unless ``keep_contrib``. ``registry``: the adapters to use (default: every registered
    family's). ``external_data``, ``shard_size``, ``progress``, ``while_writing``: how the
    output is written (``Writing``)."""
    return _convert(model_or_path, opset, out, "upgrade",
                    Options(per_axis=per_axis, keep_contrib=keep_contrib),
                    check, in_place, registry,
                    Writing(external_data, shard_size, progress, while_writing))


def downgrade(model_or_path: ModelArg, opset: int, out: str | os.PathLike | None = None, *,
              per_axis: bool = False, allow_decompose: bool = False, check: bool = False,
              in_place: bool = False, registry: Registry | None = None,
              external_data: bool | None = None, shard_size: int | None = None,
              progress: Callable | None = None, keep_contrib: bool = False,
              while_writing: Callable[[ConvertReport], None] | None = None
              ) -> ConvertReport:
    """Lower the model to ``opset`` by exact rewrites, or refuse with the reason;
    ``allow_decompose`` turns a DequantizeLinear no version at ``opset`` expresses into
    Cast/Sub/Mul (exact, but no longer a QDQ pattern). Other options as ``upgrade``."""
    return _convert(model_or_path, opset, out, "downgrade",
                    Options(per_axis=per_axis, allow_decompose=allow_decompose,
                            keep_contrib=keep_contrib), check,
                    in_place, registry,
                    Writing(external_data, shard_size, progress, while_writing))


def _output(model_or_path: ModelArg, out, in_place: bool, writing: Writing):
    """Where the conversion is written (None: nowhere), once the request is sound."""
    is_path = not isinstance(model_or_path, ir.Model)
    if writing.shard_size is not None and writing.shard_size <= 0:
        raise UsageError(f"--shard-size must be positive, got {writing.shard_size}")
    if in_place:
        if not is_path:
            raise UsageError("in_place needs a path")
        if out is not None and Path(out).resolve() != Path(model_or_path).resolve():
            raise UsageError("give either an output or in_place, not both")
        out = model_or_path
    if out is not None and is_path:
        from dqtool import storage

        storage.no_overwrite_of_input(model_or_path, out, in_place)
    return out


def _start_writing(model: ir.Model, out, options: Options, opset: int, input_external: bool,
                   writing: Writing, reg: Registry):
    """The save started ahead of the conversion, or None. The input's data file starts
    copying to the output, overlapping the conversion; not when sharding (the copy is one
    data file), nor when a family's nodes, which the conversion rewrites, hold most of the
    bytes (the copy would be dropped): then the data file is written as the conversion
    makes the new weights."""
    from dqtool import storage

    if writing.shard_size is not None:
        return None
    if not _rewrites_most(model, options, opset, reg):
        return storage.start_prefill(model, out)
    if input_external and writing.external_data is not False:
        return storage.start_eager(model, out, writing.progress)
    return None


def _convert(model_or_path: ModelArg, opset: int, out, direction: Literal["upgrade", "downgrade"],
             options: Options, check: bool, in_place: bool,
             registry: Registry | None = None, writing: Writing = Writing()
             ) -> ConvertReport:
    from dqtool import storage
    from dqtool.convert import pipeline
    from dqtool.storage import data_writer

    if check:  # (imported for --check only: ~5 ms of a command's start-up)
        from dqtool.checking import conversion
        from dqtool.checking.models import MAX_IN_PROTO

    is_path = not isinstance(model_or_path, ir.Model)
    out = _output(model_or_path, out, in_place, writing)
    model, path = model_or_path, None
    if is_path:  # loaded here, once
        model, path = storage.load(model_or_path), model_or_path
    # A model with external data is checked from its files, the converted one as written
    # (before it is renamed into place): no tensor is copied into a protobuf, so any size
    # works. Otherwise both are checked in memory, which protobuf limits to 2 GB.
    input_external = path is not None and storage.uses_external_data(model)
    from_files = check and out is not None and input_external
    if check and not from_files and storage.tensor_bytes(model) > MAX_IN_PROTO:
        raise UsageError("check on a model past protobuf's 2 GB limit needs the model's path "
                         "and an output path (both models are then checked from their files)")
    if check:
        original = conversion.loaded(path if from_files else model)
    registry = registry or default_registry()
    prefill = None if out is None or check else _start_writing(
        model, out, options, opset, input_external, writing, registry)
    try:
        # A model loaded here has no other reference: converted in place, dropped on refusal.
        early = prefill if isinstance(prefill, data_writer.EarlyWriter) else None
        report = pipeline.run(model, opset, direction, options, registry, path=path,
                              copy=not is_path, early=early)
    except BaseException:
        storage.discard_prefill(prefill)
        raise

    def run_check(converted: ir.Model | Path) -> None:
        try:
            report.check = conversion.compare(original, conversion.loaded(converted))
        except InputError as e:
            raise InputError(f"{report.input}: --check: {e}") from None
        if not report.check.ok:
            raise CheckFailed(report)

    try:
        if check and not from_files:
            run_check(report.model)
        if out is not None:
            external = True if writing.shard_size is not None else writing.external_data
            report.external_data = storage.external_choice(report.model, external)
    except BaseException:  # the save never started: its writers and folder go too
        storage.discard_prefill(prefill)
        raise
    if out is not None:  # (the save takes the prefill over, and cleans up after itself)
        tell = writing.while_writing
        written = storage.save(report.model, out, external=external,
                               shard_size=writing.shard_size, callback=writing.progress,
                               verify=run_check if from_files else None, prefill=prefill,
                               while_writing=None if tell is None else lambda: tell(report))
        report.files = [str(p) for p in written]
        report.external_data = len(written) > 1  # none when every tensor stayed inline
    return report

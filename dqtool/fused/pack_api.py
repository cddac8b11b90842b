"""``dqtool.pack``: DequantizeLinear → MatMul / Gather into MatMulNBits /
GatherBlockQuantized (see ``pack_pass``), loading and writing models of any size."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx_ir as ir

from dqtool import storage
from dqtool.errors import UsageError
from dqtool.fused.pack_pass import FusedPackPass, PackReport


def default_output(src: str | os.PathLike) -> Path:
    p = Path(src)
    return p.with_name(f"{p.stem}.packed{p.suffix or '.onnx'}")


def pack(model_or_path: ir.Model | str | os.PathLike, out: str | os.PathLike | None = None, *,
         accuracy_level: int | None = None, zero_points: str = "auto", gather: bool = True,
         fuse_bias: bool = False, in_place: bool = False, external_data: bool | None = None,
         shard_size: int | None = None, progress: Any = None,
         while_writing: Callable[[PackReport], None] | None = None) -> PackReport:
    """Rewrite every DequantizeLinear(constant) → MatMul into MatMulNBits and every
    DequantizeLinear(constant table) → Gather into GatherBlockQuantized, with bit-identical
    weights. ``accuracy_level``: the MatMulNBits attribute written; None: the level
    ``upgrade`` noted from the original node, else none. A MatMul's bias ``Add`` goes into
    the node when ``upgrade`` made it from the node's bias input, or any constant bias with
    ``fuse_bias`` (onnxruntime then sums it in its own order). A model object is rewritten in
    place (and written to ``out`` when given); a path is written to ``out`` (default
    ``<stem>.packed.onnx``; ``in_place`` writes it back, atomically). ``external_data``,
    ``shard_size``, ``progress``: how the output is written, as for every writer
    (``dqtool.storage.save``'s ``external``, ``shard_size``, ``callback``); ``while_writing``
    is called with the report while the data is written (``report.written`` not yet
    set). ``report.model`` is the result."""
    if accuracy_level not in (None, 0, 1, 2, 3, 4):
        raise UsageError(f"--accuracy-level must be 0..4, got {accuracy_level}")
    if zero_points not in ("auto", "packed"):
        raise UsageError(f"--zero-points must be auto or packed, got {zero_points!r}")
    req = storage.request(model_or_path, out, in_place=in_place, default=default_output)

    def transform(model: ir.Model, early: Any) -> tuple[PackReport, ir.Model]:
        report = FusedPackPass(accuracy_level, zero_points, gather, fuse_bias,
                               early=early)(model)
        model.ir_version = storage.lowest_ir_version(model)
        report.model = model
        return report, model

    # The data file is written as the pass makes the packed weights (``EarlyWriter``).
    job = storage.Job(transform, storage.Writing(external_data, shard_size, progress),
                      early=lambda model: "write", while_writing=while_writing)
    report, _, written = job.run(model_or_path, req)
    if req.out is not None:  # a model object too (it was never written: nothing said so)
        report.written = [str(p) for p in written]
    return report

"""``dqtool.pack``: DequantizeLinear → MatMul / Gather into MatMulNBits /
GatherBlockQuantized (see ``pack_pass``), loading and writing models of any size."""

from __future__ import annotations

import os
from pathlib import Path

import onnx_ir as ir

from dqtool.errors import UsageError
from dqtool.families.fused.pack_pass import FusedPackPass, PackReport


def default_output(src: str | os.PathLike) -> Path:
    p = Path(src)
    return p.with_name(f"{p.stem}.packed{p.suffix or '.onnx'}")


def pack(model_or_path: ir.Model | str | os.PathLike, out: str | os.PathLike | None = None, *,
         accuracy_level: int = 0, zero_points: str = "auto", gather: bool = True
         ) -> PackReport:
    """Rewrite every DequantizeLinear(constant) → MatMul into MatMulNBits and every
    DequantizeLinear(constant table) → Gather into GatherBlockQuantized, with bit-identical
    weights. A model object is rewritten in place; a path is written to ``out`` (default
    ``<stem>.packed.onnx``). ``report.model`` is the result."""
    from dqtool import io

    if accuracy_level not in (0, 1, 2, 3, 4):
        raise UsageError(f"--accuracy-level must be 0..4, got {accuracy_level}")
    if zero_points not in ("auto", "packed"):
        raise UsageError(f"--zero-points must be auto or packed, got {zero_points!r}")
    src = None
    if isinstance(model_or_path, ir.Model):
        model = model_or_path
    else:
        src = Path(model_or_path)
        out = default_output(src) if out is None else out
        if Path(out).resolve() == src.resolve():
            # pack has no --in-place (the shared refusal would suggest one).
            raise UsageError(f"{out}: output is the input; choose another --output")
        model = io.load(src)
    report = FusedPackPass(accuracy_level, zero_points, gather)(model)
    model.ir_version = io.lowest_ir_version(model)
    report.model = model
    if out is not None:
        report.written = [str(p) for p in io.save(model, out)]
    return report

"""Getting a model into the two forms a check needs: a protobuf with every tensor in
memory (what the runtimes take) and the onnx_ir model (what the codecs read)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir
from onnx import external_data_helper

from dqtool import io

# onnxruntime 1.31 loads IR versions up to 13; onnx 1.23's helpers write 14 by default.
ORT_MAX_IR = 13

ModelLike = str | os.PathLike | ir.Model | onnx.ModelProto


def load_proto(model: ModelLike) -> tuple[str, onnx.ModelProto]:
    """(display name, protobuf with external data read in). Bad files raise InputError."""
    if isinstance(model, onnx.ModelProto):
        return "<memory>", model
    if isinstance(model, ir.Model):
        proto = ir.to_proto(model)
        base = _external_base(model)
        if base is not None:
            external_data_helper.load_external_data_for_model(proto, str(base))
        return "<memory>", proto
    path = Path(model)
    io.read_proto(path)  # the safety checks: missing, truncated, escaping external data
    return str(model), onnx.load_model(str(path), load_external_data=True)


def _external_base(model: ir.Model) -> Path | None:
    for g in model.graphs():
        for v in g.initializers.values():
            if isinstance(v.const_value, ir.ExternalTensor):
                return Path(v.const_value.base_dir)
    return None


def for_ort(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """The model as onnxruntime can load it, and a note when that needed a change.

    Only the IR version (the file-format version) is ever lowered, to the lowest the
    model's opsets and types need; the graph is untouched.
    """
    if proto.ir_version <= ORT_MAX_IR:
        return proto, None
    lowest = io.lowest_ir_version(ir.serde.deserialize_model(proto))
    if lowest > ORT_MAX_IR:
        return proto, None
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    copy.ir_version = lowest
    return copy, (f"IR version {proto.ir_version} given to onnxruntime as {lowest} (the lowest "
                  f"the model needs; onnxruntime loads IR ≤ {ORT_MAX_IR})")

"""Getting a model into the two forms a check needs: a protobuf (what the runtimes take)
and the onnx_ir model (what the codecs read).

A model's tensors are read into the protobuf while they fit protobuf's 2 GB limit. Past it
they stay in their files (``Loaded.external_dir``): onnxruntime reads them from that folder
(``EXTERNAL_FOLDER_KEY``), the reference evaluator memory-maps them (``in_memory_container``),
onnx's checker is given the path; the tensor data is never serialized into one protobuf.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir
from onnx import external_data_helper
from onnx.model_container import ModelContainer

from dqtool import storage
from dqtool.runtimes import onnxruntime as ort_facts


def ort_max_ir() -> int:
    """The highest IR version the installed onnxruntime loads (probed once per process:
    1.31 stops at 13 while onnx's helpers write 14; 1.32 loads 14)."""
    return ort_facts.probe().max_ir_version or onnx.IR_VERSION

# Tensors beyond this many bytes in total stay in their files (protobuf's 2 GB limit).
MAX_IN_PROTO = onnx.checker.MAXIMUM_PROTOBUF
# onnxruntime's session option naming the folder of a bytes-loaded model's external data.
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"

ModelLike = str | os.PathLike | ir.Model | onnx.ModelProto

@dataclass(frozen=True)
class Loaded:
    name: str  # for display
    proto: onnx.ModelProto
    # Set when the tensors stay in files: the folder their locations are relative to.
    external_dir: Path | None = None
    path: Path | None = None  # the model file, when it came from one
    external_bytes: int = 0  # the external data's size, when it stays in files
    in_file: bool = False  # an inline model's tensors left in the model file itself

    def ir_model(self) -> ir.Model:
        model = ir.serde.deserialize_model(self.proto)
        if self.external_dir is not None:
            ir.external_data.set_base_dir(model.graph, self.external_dir)
            storage.bind(model.graph, self.external_dir)  # read as checked
        return model

    def note(self) -> str | None:
        if self.external_dir is None:
            return None
        if self.in_file:
            return (f"{self.name}: {self.external_bytes / 2**30:.2f} GiB of tensors left in "
                    "the model file while checking (onnxruntime and the reference evaluator "
                    "read them from it; each weight is checked slice by slice)")
        why = "past protobuf's 2 GB limit" if self.external_bytes > MAX_IN_PROTO else \
            "a check streams it"
        return (f"{self.name}: {self.external_bytes / 2**30:.2f} GiB of external data, "
                f"{why}: kept in its files (onnxruntime reads them from the "
                "model's folder, the reference evaluator reads each when a node needs it, "
                "onnx's checker is given the path)")


# External data past this many bytes stays in its files for ``check`` (read a weight at a
# time by the streamed runs, ``runners.streams``): read into the protobuf, the 1.8 GB model
# of bench/bench_fused.py and its conversion held 3.8 GB before anything ran.
KEEP_IN_FILES_BYTES = 256 << 20


def load(model: ModelLike, in_files: bool = False, keep_over: int | None = None) -> Loaded:
    """The model as a check runs it. Bad files raise InputError. ``in_files``: a model
    file's external tensors stay in their files whatever their size; ``keep_over``: they
    stay there past that many bytes."""
    if isinstance(model, onnx.ModelProto):
        return Loaded("<memory>", model)
    if isinstance(model, ir.Model):
        proto = ir.to_proto(model)
        base = _external_base(model)
        if base is not None:
            storage.read_all_external(proto, base)
        return Loaded("<memory>", proto)
    path = Path(model)
    in_file = _in_file(path)
    if in_file is not None:
        return in_file
    # The safety checks (missing, truncated, escaping external data); tensors not read.
    proto = storage.read_proto(path)
    size = external_size(proto, path.parent)
    if size + proto.ByteSize() > MAX_IN_PROTO or (in_files and size) or (
            keep_over is not None and size > keep_over):
        # Only main-graph initializers stay in files: the runtimes resolve no others.
        storage.inline_external(proto, path.parent, subgraph_initializers=True)
        return Loaded(str(model), proto, path.parent, path, size)
    storage.read_all_external(proto, path.parent)
    return Loaded(str(model), proto, path=path)


# An inline model whose large tensors pass this many bytes is checked with them left in
# its file, referenced as external data of the file itself (see ``_in_file``).
IN_FILE_BYTES = 64 << 20


def _in_file(path: Path) -> Loaded | None:
    """A large inline model as a check runs it without reading its tensors: its protobuf
    with each large main-graph initializer turned into a reference to the raw bytes in the
    model file itself (location: the file's own name, offset, length). onnxruntime reads
    them from the model's folder, the reference evaluator memory-maps them, onnx's checker
    is given the path (it resolves external data in a protobuf from the working folder, and
    refuses raw data shorter than its type and shape). None when the model is small or has
    external data of its own."""

    holes = storage.Holes()
    try:
        if not path.is_file() or path.stat().st_size < IN_FILE_BYTES:
            return None
        proto = storage.read_proto(path, holes)
    except OSError:
        return None
    if sum(length for _, length in holes.values()) < IN_FILE_BYTES or external_size(
            proto, path.parent):
        return None
    for t in proto.graph.initializer:
        mark = storage.mark_of(t)
        if mark is None:
            continue
        if mark not in holes or t.data_location == onnx.TensorProto.EXTERNAL:
            return None
        offset, length = holes[mark]
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", path.name), ("offset", str(offset)),
                           ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    return Loaded(str(path), proto, path.parent, path,
                  sum(length for _, length in holes.values()), in_file=True)


def external_size(proto: onnx.ModelProto, base: Path) -> int:
    """Bytes of tensor data the model keeps in external files."""
    total = 0
    for t in external_data_helper._get_all_tensors(proto):
        if not external_data_helper.uses_external_data(t):
            continue
        info = external_data_helper.ExternalDataInfo(t)
        if info.length:
            total += int(info.length)
        else:
            with contextlib.suppress(OSError):  # storage.read_proto refuses missing files
                total += max(0, (base / info.location).stat().st_size - int(info.offset or 0))
    return total


def in_memory_container(proto: onnx.ModelProto, base: Path) -> ModelContainer:
    """The model for onnx's ReferenceEvaluator with its external initializers
    memory-mapped (onnx's ModelContainer): nothing is serialized or read ahead. Only
    main-graph initializers are mapped: ``load`` reads every other external tensor in."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    large = {}
    for i, t in enumerate(copy.graph.initializer):
        if not external_data_helper.uses_external_data(t):
            continue
        key = f"#{i}"
        large[key] = ir.serde.deserialize_tensor(t, str(base)).numpy()
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = key
    container = ModelContainer()
    container.model_proto = copy
    container.set_large_initializers(large)
    return container


def _external_base(model: ir.Model) -> Path | None:
    for g in model.graphs():
        for v in g.initializers.values():
            if isinstance(v.const_value, ir.ExternalTensor):
                return Path(v.const_value.base_dir)
    return None


def with_outputs(proto: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of the model with ``names`` added to its graph outputs (those it lacks), so a
    run returns those values too."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    have = {o.name for o in out.graph.output}
    for name in names:
        if name not in have:
            have.add(name)
            out.graph.output.append(onnx.ValueInfoProto(name=name))
    return out


def for_ort(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """The model as onnxruntime can load it, and a note when that needed a change.

    Only the IR version (the file-format version) is ever lowered, to the lowest the
    model's opsets and types need; the graph is untouched.
    """
    top = ort_max_ir()
    if proto.ir_version <= top:
        return proto, None
    lowest = storage.lowest_ir_version(ir.serde.deserialize_model(proto))
    if lowest > top:
        return proto, None
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    copy.ir_version = lowest
    return copy, (f"IR version {proto.ir_version} given to onnxruntime as {lowest} (the lowest "
                  f"the model needs; onnxruntime loads IR ≤ {top})")


def qdq_value_bytes(proto: onnx.ModelProto) -> int:
    """An upper bound on the bytes the main graph's Q/DQ results take (4 per element)
    where their input's shape is known from an initializer, a Constant or value_info;
    activations, whose shape is not known here, are small and not counted."""
    shapes = {t.name: list(t.dims) for t in proto.graph.initializer}
    for node in proto.graph.node:  # Constant nodes hold weights too
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    shapes[node.output[0]] = list(attr.t.dims)
    for vi in [*proto.graph.input, *proto.graph.value_info]:
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes.setdefault(vi.name, [d.dim_value for d in dims])
    total = 0
    for node in proto.graph.node:
        if node.op_type in ("DequantizeLinear", "QuantizeLinear") and node.input:
            dims = shapes.get(node.input[0])
            if dims is not None:
                total += 4 * math.prod(dims)
    return total

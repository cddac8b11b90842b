"""Reading an inline model without copying its tensors: payloads stay in the file.

``onnx.load`` reads the whole file into memory and parses it into a protobuf holding a
second copy of every tensor; converting to onnx_ir and computing makes a third. Here the
file is memory-mapped and only the framing of the protobuf is read: the raw data of each
large main-graph initializer is left in the file (a short mark parsed in its place), and
the loaded model's tensor reads those bytes from the file when asked (``MappedTensor``). A
save copies them from the file to the output in the kernel; a fold reads them row block by
row block. Reading a model then costs its graph, not its weights.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir import _core

from dqtool import wire
from dqtool.storage import tensor_reads
from dqtool.wire import Malformed

# Files smaller than this are parsed whole (nothing worth saving).
MIN_FILE_BYTES = 1 << 20
# Raw data of at least this many bytes stays in the file.
MIN_TENSOR_BYTES = 64 << 10
_MARK = b"\x00dqtool-in-file:"

_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9  # ModelProto.graph, GraphProto.initializer, ...


class _Scan:
    def __init__(self, buf) -> None:
        self.buf = buf
        self.holes: dict[bytes, tuple[int, int]] = {}

    def _rebuilt(self, number: int, inner: list[bytes]) -> bytes:
        body = b"".join(inner)
        return wire.length_field(number, len(body)) + body

    def tensor(self, start: int, end: int) -> list[bytes] | None:
        parts, changed = [], False
        for number, kind, f0, body, f1 in wire.fields(self.buf, start, end):
            if number == _RAW_DATA and kind == wire.LEN and f1 - body >= MIN_TENSOR_BYTES:
                mark = _MARK + len(self.holes).to_bytes(8, "little")
                self.holes[mark] = (body, f1 - body)
                parts.append(wire.length_field(_RAW_DATA, len(mark))
                             + mark)
                changed = True
            else:
                parts.append(self.buf[f0:f1])
        return parts if changed else None

    def graph(self, start: int, end: int) -> list[bytes] | None:
        parts, changed = [], False
        for number, kind, f0, body, f1 in wire.fields(self.buf, start, end):
            inner = (self.tensor(body, f1) if number == _INITIALIZER and kind == wire.LEN
                     and f1 - body >= MIN_TENSOR_BYTES else None)
            if inner is None:
                parts.append(self.buf[f0:f1])
            else:
                parts.append(self._rebuilt(number, inner))
                changed = True
        return parts if changed else None

    def model(self, size: int) -> bytes | None:
        parts, changed = [], False
        for number, kind, f0, body, f1 in wire.fields(self.buf, 0, size):
            inner = self.graph(body, f1) if number == _GRAPH and kind == wire.LEN else None
            if inner is None:
                parts.append(self.buf[f0:f1])
            else:
                parts.append(self._rebuilt(number, inner))
                changed = True
        return b"".join(parts) if changed else None


class Holes(dict):
    """Mark → (offset, length) of the raw data left in the file, and the file as it was
    read (``source``): the tensors read the same file the skeleton came from."""

    source: Source | None = None


def read(path: Path) -> tuple[onnx.ModelProto, Holes] | None:
    """The model's protobuf with large main-graph raw data left in the file, and where
    each mark's bytes are (offset, length); None when nothing is worth leaving (or the
    file does not parse here: the caller's ordinary load then reports it)."""
    try:
        source = Source(path)
        size = os.fstat(source.fd).st_size
        if size < MIN_FILE_BYTES:
            return None
        with mmap.mmap(source.fd, 0, access=mmap.ACCESS_READ) as buf:
            scan = _Scan(buf)
            skeleton = scan.model(size)
    except (Malformed, OSError, ValueError):
        return None
    if skeleton is None:
        return None
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(skeleton)
    except Exception:  # protobuf's DecodeError and friends: the ordinary load reports it
        return None
    holes = Holes(scan.holes)
    holes.source = source
    return proto, holes


class Source:
    """The model file as it was when loaded: an open descriptor, read through
    ``/proc/self/fd`` so a file renamed over the model's path (another run's save, an
    ``--in-place`` commit) never changes what this model's tensors read. Closed when the
    last tensor reading it is gone."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        proc = f"/proc/self/fd/{self.fd}"
        self.path = proc if os.path.exists(proc) else str(path)

    def __del__(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)


class MappedTensor(tensor_reads.InFile, _core.TensorBase):
    """An initializer whose raw data is a byte range of the (inline) model file itself.

    Not an external tensor: it is saved inline like any other, its bytes copied from the
    file. ``path``, ``location``, ``base_dir`` and ``offset`` let row-wise readers read
    parts of it as they read external data (the path is the file as loaded, ``Source``)."""

    __slots__ = ("_file", "_source", "base_dir", "length", "location", "offset", "path")

    def __init__(self, source: Source, offset: int, length: int, dtype: ir.DataType,
                 shape: ir.Shape, name: str | None, doc_string: str | None = None) -> None:
        super().__init__(name, doc_string)
        self._source = source
        self.path, self.offset, self.length = source.path, offset, length
        # An absolute location and no base folder: onnx_ir reads the path as given (the
        # containment checks are for locations written in a model; this one is dqtool's).
        self.location, self.base_dir = source.path, ""
        self._file = ir.ExternalTensor(source.path, offset, length, dtype, shape=shape,
                                       name=name, base_dir="")

    @property
    def dtype(self) -> ir.DataType:
        return self._file.dtype

    @property
    def shape(self) -> ir.Shape:
        return self._file.shape

    @property
    def raw(self):
        return self._file.raw

    def numpy(self) -> np.ndarray:
        # on its own map, nothing kept (``tensor_reads.file_values``)
        arr = tensor_reads.file_values(self)
        return arr if arr is not None else self._file.numpy()

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self._file.__array__(dtype)

    def tobytes(self) -> bytes:
        return self._file.tobytes()

    def tofile(self, file) -> None:
        self._file.tofile(file)

    def release(self) -> None:
        self._file.release()

    def retyped(self, dtype: ir.DataType, shape: ir.Shape) -> MappedTensor:
        """The same bytes of the file read as another type and shape (uint8-packed 4-bit
        codes as uint4, and back), still saved inline."""
        return MappedTensor(self._source, self.offset, self.length, dtype, shape, self.name)


def mark_of(t: onnx.TensorProto) -> bytes | None:
    if not t.HasField("raw_data") or t.ByteSize() > 4096:
        return None
    raw = t.raw_data
    return raw if len(raw) == len(_MARK) + 8 and raw.startswith(_MARK) else None


def attach(model: ir.Model, holes: Holes) -> bool:
    """Give each marked initializer its bytes in the file; False when a mark is where a
    tensor cannot take it (the caller then loads the file the ordinary way)."""
    found = 0
    source = holes.source
    if source is None:
        return False
    for v in model.graph.initializers.values():
        t = v.const_value
        if not isinstance(t, ir.serde.TensorProtoTensor):
            continue
        mark = mark_of(t.raw)
        if mark is None:
            continue
        if mark not in holes or t.raw.data_location == onnx.TensorProto.EXTERNAL:
            return False
        offset, length = holes[mark]
        if t.dtype == ir.DataType.STRING or t.raw.HasField("segment"):
            return False
        try:
            if t.nbytes != length:
                return False  # the ordinary load reports the mismatch
        except (TypeError, ValueError):
            return False
        mapped = MappedTensor(source, offset, length, t.dtype, t.shape, t.name,
                              t.doc_string)
        mapped.metadata_props.update(t.metadata_props)
        v.const_value = mapped
        found += 1
    return found == len(holes)

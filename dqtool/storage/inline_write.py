"""Writing a model inline without building its whole protobuf in memory.

``ir.save`` serializes the model into one ``ModelProto`` (every tensor's bytes copied in),
then into one ``bytes`` (copied again), then writes it: three copies of the weights at
once. Here the model is serialized with each large tensor's payload left out (a short mark
in its place), and the file is written from that skeleton: protobuf's wire format prefixes
every nested message with its length, and a payload's length is known before its bytes
are, so every length is written first and each payload is then streamed into the file by
the tensor itself (copied in the kernel from the input file, or computed chunk by chunk).
Peak memory is the skeleton plus a chunk, whatever the tensors' sizes.

The bytes are exactly those of ``ir.serde.serialize_model(model).SerializeToString()``:
protobuf writes a message's known fields in field-number order, each one as it would be
alone, so the skeleton's messages on the way to a payload are written field by field by
protobuf itself, and only the framing around a payload (a tag and a length) is encoded
here. Messages serialized from ``onnx_ir`` hold no unknown fields.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir import _core

from dqtool import wire
from dqtool.kernel.parallel import num_threads
from dqtool.storage import inline_read
from dqtool.storage.file_identity import identity
from dqtool.storage.tensor_reads import file_range
from dqtool.storage.write_pieces import WRITE_PIECE, Pieces, write_tensor

# Tensors of at least this many bytes are streamed; smaller ones are serialized in place
# (their bytes are cheaper than the bookkeeping).
STREAM_MIN_BYTES = 64 << 10
# Written for a left-out payload: no real tensor's 4..16-byte raw data begins so (a raw
# payload is that long only for a handful of elements, never this many bytes of marker).
_MARK = b"\x00dqtool-payload:"
_MARK_LEN = len(_MARK) + 8

# Where a graph's initializers can sit, per message: the fields worth descending into.
_DESCEND = {
    "ModelProto": {7},  # graph
    "GraphProto": {1, 5},  # node, initializer
    "NodeProto": {5},  # attribute
    "AttributeProto": {6, 11},  # g, graphs
}
_RAW_DATA = 9  # TensorProto.raw_data


class Payload(NamedTuple):
    """A tensor's bytes, written by the tensor when the file reaches them."""

    tensor: ir.TensorProtocol
    length: int


Segment = bytes | Payload


class _Slot(_core.TensorBase):
    """Stands for a large tensor while the skeleton is serialized: the tensor's name, type,
    shape and metadata, and a mark for raw data."""

    __slots__ = ("_dtype", "_mark", "_shape")

    def __init__(self, tensor: ir.TensorProtocol, index: int) -> None:
        super().__init__(tensor.name, tensor.doc_string, dict(tensor.metadata_props))
        self._dtype, self._shape = tensor.dtype, tensor.shape
        self._mark = _MARK + index.to_bytes(8, "little")

    @property
    def dtype(self) -> ir.DataType:
        return self._dtype

    @property
    def shape(self) -> ir.Shape:
        return self._shape  # type: ignore[return-value]

    @property
    def raw(self) -> bytes:
        return self._mark

    def numpy(self) -> np.ndarray:
        raise TypeError("a placeholder has no values")

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        raise TypeError("a placeholder has no values")

    def tobytes(self) -> bytes:
        return self._mark


def _streamable(t: ir.TensorProtocol | None) -> bool:
    if t is None or isinstance(t, (ir.StringTensor, _Slot)):
        return False
    # A tensor read from the protobuf is copied verbatim by onnx_ir (typed fields and all).
    if isinstance(t, ir.serde.TensorProtoTensor):
        return False
    if isinstance(t, ir.ExternalTensor):  # whatever its size: an inline save has no references
        return True
    try:
        return t.nbytes >= STREAM_MIN_BYTES and t.dtype != ir.DataType.STRING
    except (TypeError, ValueError):  # symbolic or unknown shape: let onnx_ir say so
        return False


def skeleton(model: ir.Model) -> tuple[onnx.ModelProto, dict[bytes, ir.TensorProtocol]]:
    """The model's protobuf with every large initializer's raw data replaced by a mark,
    and the tensor each mark stands for. The model is left as it was."""
    swapped: list[tuple[ir.Value, ir.TensorProtocol]] = []
    payloads: dict[bytes, ir.TensorProtocol] = {}
    try:
        for g in model.graphs():
            for v in g.initializers.values():
                t = v.const_value
                if _streamable(t):
                    slot = _Slot(t, len(swapped))
                    payloads[slot.raw] = t
                    swapped.append((v, t))
                    v.const_value = slot
        proto = ir.serde.serialize_model(model)
    finally:
        for v, t in swapped:
            v.const_value = t
    return proto, payloads


def _length(segments: list[Segment]) -> int:
    return sum(s.length if isinstance(s, Payload) else len(s) for s in segments)


def _field_bytes(msg, fd, value) -> bytes:
    """The encoding of one field of ``msg`` as protobuf writes it inside ``msg``."""
    one = type(msg)()
    if fd.is_repeated:
        getattr(one, fd.name).extend(value)
    elif fd.message_type is not None:
        getattr(one, fd.name).CopyFrom(value)
    else:
        setattr(one, fd.name, value)
    return one.SerializeToString()


def _mark_of(t: onnx.TensorProto) -> bytes | None:
    if not t.HasField("raw_data") or t.ByteSize() > 4096:
        return None
    raw = t.raw_data
    return raw if len(raw) == _MARK_LEN and raw.startswith(_MARK) else None


def segments(msg, payloads: dict[bytes, ir.TensorProtocol]) -> list[Segment] | None:
    """``msg``'s encoding as bytes and payloads, or None when it holds no payload."""
    name = msg.DESCRIPTOR.name
    if name == "TensorProto":
        mark = _mark_of(msg)
        if mark is None or mark not in payloads:
            return None
        tensor = payloads[mark]
        out: list[Segment] = []
        for fd, value in msg.ListFields():
            if fd.number == _RAW_DATA:
                out.append(wire.length_field(_RAW_DATA, tensor.nbytes))
                out.append(Payload(tensor, tensor.nbytes))
            else:
                out.append(_field_bytes(msg, fd, value))
        return out
    descend = _DESCEND.get(name)
    if descend is None:
        return None
    if name == "NodeProto" and not any(a.type in (onnx.AttributeProto.GRAPH,
                                                  onnx.AttributeProto.GRAPHS)
                                       for a in msg.attribute):
        return None
    inner: dict[tuple[int, int], list[Segment]] = {}
    fields = msg.ListFields()
    for fd, value in fields:
        if fd.number not in descend or fd.message_type is None:
            continue
        for i, item in enumerate(value if fd.is_repeated else [value]):
            found = segments(item, payloads)
            if found is not None:
                inner[fd.number, i] = found
    if not inner:
        return None
    out = []
    for fd, value in fields:
        if fd.number not in {n for n, _ in inner}:
            out.append(_field_bytes(msg, fd, value))
            continue
        tag = wire.encode_varint(fd.number << 3 | wire.LEN)
        for i, item in enumerate(value if fd.is_repeated else [value]):
            found = inner.get((fd.number, i))
            if found is None:
                body = item.SerializeToString()
                out.append(tag + wire.encode_varint(len(body)) + body)
            else:
                out.append(tag + wire.encode_varint(_length(found)))
                out.extend(found)
    return out


def _coalesce(parts: list[Segment]) -> Iterator[Segment]:
    """Adjacent bytes joined, so the file is written in few large calls."""
    pending: list[bytes] = []
    for p in parts:
        if isinstance(p, Payload):
            if pending:
                yield b"".join(pending)
                pending = []
            yield p
        else:
            pending.append(p)
    if pending:
        yield b"".join(pending)


def write(model: ir.Model, path: str | os.PathLike,
          copied: os.stat_result | None = None) -> int:
    """Write ``model`` inline to ``path``; returns the bytes written. The file holds
    exactly what ``ir.save(model, path)`` would write.

    Every part's place in the file is known before anything is written, so payloads that
    are byte ranges of files (tensors of the input, inline or external) are copied in the
    kernel by two threads at their places while the rest is written in order.
    ``copied``: ``path`` already holds a copy of the input file with this status
    (``early_copy``); payloads at the same place in it are kept, the rest is written over
    it (or, when less than half of it would be kept, the file is written from scratch)."""
    proto, payloads = skeleton(model)
    parts = segments(proto, payloads) if payloads else None
    if parts is None:
        parts = [proto.SerializeToString()]
    del proto
    total = _length(parts)
    if total > 2**31 - 1:
        raise ValueError(f"{total} bytes: past protobuf's 2 GiB limit for one message; "
                         "write external data")
    placed: list[tuple[int, Segment]] = []
    offset = 0
    for part in _coalesce(parts):
        placed.append((offset, part))
        offset += part.length if isinstance(part, Payload) else len(part)
    kept = _in_place(placed, copied) if copied is not None else set()
    if 2 * sum(placed[i][1].length for i in kept) < total:
        kept, copied = set(), None
    from concurrent.futures import ThreadPoolExecutor


    # Every write goes to the file in pieces (dqtool.storage.write_pieces), small ones
    # gathered up to one.
    with open(Path(path), "r+b" if copied is not None else "wb",
              buffering=WRITE_PIECE) as raw, \
            ThreadPoolExecutor(num_threads(), thread_name_prefix="dqtool-copy") as pool:
        f = Pieces(raw)
        copies = []
        try:
            for i, (offset, part) in enumerate(placed):
                if i in kept:
                    continue
                if not isinstance(part, Payload):
                    f.seek(offset)
                    f.write(part)
                elif (source := copyable_range(part.tensor)) is not None:
                    copies.append(pool.submit(_copy, *source, part.length, f.fileno(),
                                              offset))
                else:
                    f.flush()
                    f.seek(offset)
                    _write_payload(part.tensor, f)
                    f.flush()
                    if f.tell() - offset != part.length:
                        raise OSError(f"tensor '{part.tensor.name}' wrote "
                                      f"{f.tell() - offset} bytes, its type and shape "
                                      f"need {part.length}")
            f.flush()
            for c in copies:
                c.result()
        finally:
            for c in copies:
                c.cancel()
        if copied is not None:
            f.truncate(total)
        written = os.fstat(f.fileno()).st_size
    if written != total:
        raise OSError(f"wrote {written} bytes, expected {total}")
    return written


def _in_place(placed: list[tuple[int, Segment]], copied: os.stat_result) -> set[int]:
    """Indexes of the payloads a copy of the file ``copied`` already holds at their
    places: byte ranges of that very file (same device, inode, size and modification
    time) at the offsets they are written to."""
    same: dict[str, bool] = {}
    kept = set()
    for i, (offset, part) in enumerate(placed):
        if not isinstance(part, Payload) or (source := copyable_range(part.tensor)) is None:
            continue
        path, at = source
        if path not in same:
            try:
                st = os.stat(path)
            except OSError:
                st = None
            same[path] = st is not None and identity(st, status_change=False) == identity(
                copied, status_change=False)
        if same[path] and at == offset:
            kept.add(i)
    return kept


def copyable_range(t: ir.TensorProtocol) -> tuple[str, int] | None:
    """(path, offset) of a tensor whose bytes, as written, are a byte range of a file
    (``tensor_reads.file_range``): a tensor left in an inline model's file, or a
    little-endian external tensor whose range is its bytes."""
    where = file_range(t)
    if where is None:
        return None
    path, offset, length = where
    if isinstance(t, inline_read.MappedTensor) or (
            sys.byteorder == "little" and (length is None or length == t.nbytes)):
        return str(path), offset
    return None


def _copy(src: str, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> None:
    """Copy in the kernel where it can, else through a bounded buffer; explicit offsets
    (no file position is shared between threads)."""
    done = 0
    with open(src, "rb") as fin:
        try:
            while done < length:
                n = os.copy_file_range(fin.fileno(), dst_fd, length - done,
                                       src_offset + done, dst_offset + done)
                if n == 0:
                    raise OSError(f"{src}: ended before {length} bytes at {src_offset}")
                done += n
        except OSError as e:
            if done or e.errno not in _NO_KERNEL_COPY:
                raise
            while done < length:
                block = os.pread(fin.fileno(), min(length - done, 16 << 20),
                                 src_offset + done)
                if not block:
                    raise OSError(f"{src}: ended before {length} bytes") from None
                view = memoryview(block)
                while view:
                    n = os.pwrite(dst_fd, view[:WRITE_PIECE], dst_offset + done)
                    view, done = view[n:], done + n


_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM}


def _write_payload(t: ir.TensorProtocol, f) -> None:
    write_tensor(t, f)  # in pieces (dqtool.storage.write_pieces)

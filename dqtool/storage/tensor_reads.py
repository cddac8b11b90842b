"""Reading a constant's values without keeping its data file mapped (external data, or a
large inline model's tensor left in its file: ``inline_read.MappedTensor``). The tensors
storage loads read themselves this way (their ``numpy()``: ``file_values``), so
``graph.tensor_values`` is the one reader of constants everywhere.

onnx_ir memory-maps an external tensor and keeps every page it touched resident (and in
the process's RSS) until the map is released; a conversion that reads hundreds of weights
that way ends up holding all of them. Here a small external tensor is read with one
``pread``, and a large one is mapped on its own (copy-on-write, so the array is
writable and the file never changes): its map, and the pages it touched, go with the
array. Mapping skips what a read costs, zero-filling fresh memory and copying the page
cache into it (docs/decisions.md, "2026-11-28: sizes the code holds").
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.storage.write_pieces import piecewise

# From this many bytes a tensor is mapped rather than read.
MAP_BYTES = 1 << 20


def from_file(path: str | os.PathLike, dtype: np.dtype, count: int, offset: int
              ) -> np.ndarray:
    """``count`` items of ``dtype`` at ``offset`` of ``path`` (fewer if the file ends).

    With the descriptor and ``mmap`` / ``pread`` directly: ``np.memmap`` and
    ``np.fromfile`` open a Python file object around them, ~15 syscalls a tensor where
    this makes 5-7, and each hands the GIL on (a data-file writer reads its weights while
    the main thread still converts, and waited for the GIL back after every one)."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if nbytes >= MAP_BYTES and size >= offset + nbytes:
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            mapped = mmap.mmap(fd, offset + nbytes - start, access=mmap.ACCESS_COPY,
                               offset=start)
            return np.frombuffer(mapped, dtype, count, offset - start)
        want = max(0, min(nbytes, size - offset))
        raw = np.empty(want, np.uint8)
        view, got = memoryview(raw), 0
        while got < want:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                break
            got += n
    finally:
        os.close(fd)
    return raw[: got - got % dtype.itemsize].view(dtype)


class InFile:
    """A tensor whose bytes are a range of a file and which reads its values here
    (``checked_files.FileTensor``, ``inline_read.MappedTensor``): ``path``, ``offset``,
    ``length``, and ``retyped``, the same bytes as another type and shape."""

    __slots__ = ()
    path: str
    offset: int | None
    length: int | None

    def retyped(self, dtype: ir.DataType, shape: ir.Shape) -> ir.TensorProtocol:
        raise NotImplementedError


def file_range(t: ir.TensorProtocol) -> tuple[str | os.PathLike, int, int | None] | None:
    """(path, offset, length or None) of a tensor whose bytes are a range of a file: external
    data, or a large tensor of an inline model left in the model file (``MappedTensor``).
    Either is read here on its own map; onnx_ir's own reading maps the whole file, and
    keeps the map and its values (for 4-bit codes, unpacked to a byte each) for as long
    as the model lives: an inline model's pack held twice its weights in memory."""
    if isinstance(t, (ir.ExternalTensor, InFile)):
        return t.path, t.offset or 0, t.length
    return None


def file_values(t: ir.TensorProtocol) -> np.ndarray | None:
    """``t``'s values (its own shape; sub-byte codes one a byte, in their ml_dtypes type), as
    ``t.numpy()`` gives them, read from its file without keeping anything; None where it
    has no file or its type is left to onnx_ir (float4, or a big-endian host)."""
    shape = tuple(int(d) for d in t.shape)
    et = types.from_ir(t.dtype)
    # Whole bytes in the file's (little-endian) order, or 2/4-bit integer codes.
    readable = et is not None and (et.is_integer or et.bits >= 8) and (
        et.bits <= 8 or sys.byteorder == "little")
    where = file_range(t)
    if where is None or not readable:
        return None
    path, offset, _ = where
    count = int(np.prod(shape, dtype=np.int64))
    if et.bits >= 8:
        return from_file(path, et.dtype, count, offset).reshape(shape)
    # ml_dtypes keeps a 2/4-bit code in the low bits of its byte, so the unpacked codes
    # are the array as they are (no cast: a copy the size of the weight).
    return file_codes(path, offset, 0, count, et.bits).view(et.dtype).reshape(shape)


def stored_values(v: ir.Value) -> np.ndarray:
    """Constant ``v``'s values read as ``tensor_array`` reads them, whatever their size (a
    check loads no weight through onnx_ir, which keeps what it read)."""
    t = graph.constant_tensor(v)
    assert t is not None, f"{v.name} is not constant"
    return tensor_array(t)


def raw_bytes(t: ir.TensorProtocol) -> np.ndarray:
    """The stored bytes of a tensor (packed types packed), as uint8."""
    where = file_range(t)
    if where is not None:
        path, offset, length = where
        # Without a length, the tensor's own bytes (not the rest of the file: pack read a
        # weight's B from there and wrote wrong MatMulNBits weights).
        return from_file(path, np.dtype(np.uint8), t.nbytes if length is None else length,
                         offset)
    return np.frombuffer(t.tobytes(), np.uint8)


def same_bytes(tensor: ir.TensorProtocol, dtype: ir.DataType, shape: tuple[int, ...]
               ) -> ir.TensorProtocol:
    """The stored bytes of ``tensor`` read as another type and shape: uint8-packed 4-bit
    codes as uint4, and back; a weight reshaped. No copy when they live in a file (saved
    to a data file, they are copied there in the kernel)."""
    if isinstance(tensor, (InFile, WidenedCodes)):
        return tensor.retyped(dtype, ir.Shape(shape))
    if isinstance(tensor, ir.ExternalTensor):
        return ir.ExternalTensor(tensor.location, tensor.offset, tensor.length, dtype,
                                 shape=ir.Shape(shape), name=tensor.name or "",
                                 base_dir=tensor.base_dir)
    if isinstance(tensor, ir.LazyTensor):  # made when it is needed, as the tensor would be
        return ir.LazyTensor(lambda: _bytes_as(tensor.tobytes(), dtype, shape, tensor.name),
                             dtype=dtype, shape=ir.Shape(shape), name=tensor.name)
    return _bytes_as(tensor.tobytes(), dtype, shape, tensor.name)


def _bytes_as(data: bytes, dtype: ir.DataType, shape: tuple[int, ...], name: str | None
              ) -> ir.TensorProtocol:
    raw = np.frombuffer(data, np.uint8)
    if ir.DataType(dtype).bitwidth < 8:
        return ir.PackedTensor(raw, dtype, shape=shape)
    et = types.from_ir(dtype)
    assert et is not None and sys.byteorder == "little", dtype
    return ir.Tensor(raw.view(et.dtype).reshape(shape), dtype=dtype, name=name)


# Packed bytes one pass of ``unpack`` works on: its temporaries stay in L2, not 2-3x a whole
# weight's codes (docs/decisions.md, "2026-11-28: sizes the code holds").
UNPACK_CHUNK = 1 << 17


def unpack(packed: np.ndarray, bits: int, signed: bool = False) -> np.ndarray:
    """uint8 codes, the last axis ``8 / bits`` times longer (lowest bits first); with
    ``signed``, int8: each code read as a ``bits``-bit two's complement number."""
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed.view(np.int8) if signed else packed
    per = 8 // bits
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * per), np.uint8)
    src, dst = np.ascontiguousarray(packed).reshape(-1), out.reshape(-1)
    spare = np.empty(min(src.size, UNPACK_CHUNK), np.uint32 if bits == 2 else np.uint16)
    half_range = np.uint8(1 << (bits - 1))
    for s in range(0, src.size, UNPACK_CHUNK):
        d = dst[s * per:(s + UNPACK_CHUNK) * per]
        _unpack_chunk(src[s:s + UNPACK_CHUNK], d, bits, spare)
        if signed:  # (c ^ 2^(bits-1)) - 2^(bits-1), wrapping in uint8: the code's value
            # as int8. Two vectorized passes, in place: far cheaper than a masked
            # subtraction (docs/decisions.md, "2026-11-28: sizes the code holds") or the
            # sign bit shifted up and back (NumPy's uint8 left_shift is a scalar loop):
            # 2026-11-28, a 3072 x 8192 int4 weight's codes unpacked in 14.1-14.5 → 5.0-5.9
            # ms of CPU (docs/benchmarks.md, "2026-11-28, evening")
            np.bitwise_xor(d, half_range, out=d)
            np.subtract(d, half_range, out=d)
    return out.view(np.int8) if signed else out


def file_codes(path: str | os.PathLike, offset: int, start: int, stop: int, bits: int,
               signed: bool = False) -> np.ndarray:
    """Codes ``start`` to ``stop`` of the ``bits``-bit codes packed at ``offset`` of
    ``path`` (``start`` a multiple of ``8 / bits``), unpacked as ``unpack`` does."""
    raw = from_file(path, np.dtype(np.uint8), -(-(stop - start) * bits // 8),
                    offset + start * bits // 8)
    return unpack(raw, bits, signed)[: stop - start]


def _unpack_chunk(src: np.ndarray, dst: np.ndarray, bits: int, spare: np.ndarray) -> None:
    """``dst`` = the codes of ``src``; ``spare``: a scratch of at least ``src.size`` uint16
    (4 bits) or uint32 (2 bits). Shifts left are multiplies: NumPy's integer left_shift
    is a scalar loop, its multiply vectorized (measured 2026-11-28, 25 Mi 4-bit codes in
    chunks: 3.0 ms of CPU with shifts, 2.5 ms so; 2-bit codes 25 ms a pass per code, 15 ms
    so; docs/benchmarks.md, "2026-11-28, evening")."""
    if bits == 4 and sys.byteorder == "little":
        # Byte b widened to 16 bits, b | b·16 masked with 0x0F0F: its low nibble in the
        # low byte, its high nibble in the high byte, i.e. the two codes in order. Four
        # vectorized passes over half as many items (~6x faster than a pass per code).
        w, t = dst.view(np.uint16), spare[:src.size]
        np.copyto(w, src)
        np.multiply(w, np.uint16(16), out=t)
        w |= t
        w &= np.uint16(0x0F0F)
        return
    if bits == 2 and sys.byteorder == "little":
        # The same with four codes: b | b·2^6 | b·2^12 | b·2^18 masked with 0x03030303
        # puts code j (bits 2j, 2j+1 of b) at bits 8j, 8j+1: byte j of the word.
        w, t = dst.view(np.uint32), spare[:src.size]
        np.copyto(w, src)
        np.copyto(t, w)
        for _ in range(3):  # t = b·2^6, then b·2^12, then b·2^18
            np.multiply(t, np.uint32(1 << 6), out=t)
            w |= t
        w &= np.uint32(0x03030303)
        return
    per, mask = 8 // bits, (1 << bits) - 1
    d = dst.reshape(-1, per)
    for j in range(per):
        np.bitwise_and(src >> np.uint8(bits * j), np.uint8(mask), out=d[:, j])


def int_array(t: ir.TensorProtocol, dtype: np.dtype) -> np.ndarray:
    """``graph.tensor_values(t).astype(dtype)`` for an integer ``t``, without the array of
    ``t``'s own type where it is 2/4-bit codes in a file widened to a byte: the codes are
    unpacked straight into ``dtype`` (a copy fewer of the whole weight)."""
    wide = widened(t, dtype)
    if wide is not None:
        return wide.whole()
    return tensor_array(t).astype(dtype)


def tensor_array(t: ir.TensorProtocol) -> np.ndarray:
    """``graph.tensor_values(t)``, from its file without keeping anything for an external
    tensor storage did not load too (one deserialized from a proto, a model built in
    memory); the tensors storage loads read this way themselves."""
    arr = file_values(t)
    return arr if arr is not None else graph.tensor_values(t)


def widened(t: ir.TensorProtocol, dtype: np.dtype) -> WidenedCodes | None:
    """``t``'s 2/4-bit integer codes widened to the byte type ``dtype`` (int8 for signed
    codes, uint8 for unsigned), as a tensor computed when needed; None where ``t`` is not
    such codes in a file."""
    et, dtype = types.from_ir(t.dtype), np.dtype(dtype)
    where = file_range(t)
    if (where is None or et is None or not et.is_integer or et.bits >= 8
            or dtype.itemsize != 1 or dtype.kind != ("i" if et.signed else "u")):
        return None
    return WidenedCodes(where[0], where[1], et.bits, et.signed,
                        tuple(int(d) for d in t.shape), t.name, keep=t)


class WidenedCodes(ir.LazyTensor):
    """2/4-bit integer codes of a file, widened to int8 / uint8 when asked for. Saved to a
    file, it is written a band at a time, each band unpacked from the file into the cache
    and written from there: a downgrade widening a 32000 x 4096 int4 embedding held its
    131 MB of int8 codes at once; with this, nothing of the weight's size."""

    BAND = 1 << 20  # codes a band unpacks and writes

    def __init__(self, path: str | os.PathLike, offset: int, bits: int, signed: bool,
                 shape: tuple[int, ...], name: str | None, keep: object = None) -> None:
        self.path, self.offset, self.bits, self.signed = path, offset, bits, signed
        # The tensor read from, kept: a large inline model's (``inline_read.MappedTensor``)
        # names its file by a descriptor (/proc/self/fd/N) that lives as long as its
        # source does; with the narrow tensor gone, the save read another file that took
        # the number (a downgrade failed or wrote wrong codes).
        self.keep = keep
        self.np_dtype = np.dtype(np.int8 if signed else np.uint8)
        self.count = int(np.prod(shape, dtype=np.int64))
        super().__init__(lambda: ir.Tensor(self.whole(), name=self.name),
                         dtype=ir.DataType.INT8 if signed else ir.DataType.UINT8,
                         shape=ir.Shape(shape), name=name)

    def _codes(self, start: int, stop: int) -> np.ndarray:
        return file_codes(self.path, self.offset, start, stop, self.bits, self.signed
                          ).view(self.np_dtype)

    def whole(self) -> np.ndarray:
        return self._codes(0, self.count).reshape(tuple(int(d) for d in self.shape))

    def tofile(self, file) -> None:
        write = piecewise(file)
        for start in range(0, self.count, self.BAND):
            write(self._codes(start, min(self.count, start + self.BAND)))

    def retyped(self, dtype: ir.DataType, shape: ir.Shape) -> WidenedCodes:
        """The same codes in another shape (``same_bytes``)."""
        assert dtype == self.dtype, (dtype, self.dtype)
        return WidenedCodes(self.path, self.offset, self.bits, self.signed,
                            tuple(int(d) for d in shape), self.name, self.keep)

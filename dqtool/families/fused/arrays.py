"""Reading a constant's values without keeping its data file mapped.

onnx_ir memory-maps an external tensor and keeps every page it touched resident (and in
the process's RSS) until the map is released; a conversion that reads hundreds of weights
that way ends up holding all of them. Here a small external tensor is read with one
``pread``, and a large one is mapped on its own (copy-on-write, so the array is
writable and the file never changes): its map, and the pages it touched, go with the
array. Mapping skips what a read costs, zero-filling fresh memory and copying the page
cache into it (measured: a 12.6 MB weight read and transposed in 8-10 ms mapped, 15-17 ms
read).
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import onnx_ir as ir

from dqtool import graph, inline_load, types
from dqtool.families.fused import packing

# From this many bytes a tensor is mapped rather than read.
MAP_BYTES = 1 << 20


def _from_file(path: str | os.PathLike, dtype: np.dtype, count: int, offset: int
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


def _in_file(t: ir.TensorProtocol) -> tuple[str | os.PathLike, int, int | None] | None:
    """(path, offset, length or None) of a tensor whose bytes are a range of a file: external
    data, or a large tensor of an inline model left in the model file (``MappedTensor``).
    Either is read here on its own map; asked for its values itself, it maps the whole
    file, and keeps the map and its values (for 4-bit codes, unpacked to a byte each) for
    as long as the model lives: an inline model's pack held twice its weights in memory."""
    if isinstance(t, ir.ExternalTensor):
        return t.path, t.offset or 0, t.length
    if isinstance(t, inline_load.MappedTensor):
        return t.path, t.offset, t.length
    return None


def tensor_array(t: ir.TensorProtocol) -> np.ndarray:
    shape = tuple(int(d) for d in t.shape)
    et = types.from_ir(t.dtype)
    readable = et is not None and (et.is_integer or et.name in ("float", "float16", "bfloat16"))
    where = _in_file(t)
    if where is not None and readable:
        path, offset, _ = where
        count = int(np.prod(shape, dtype=np.int64))
        if et.bits >= 8:
            arr = _from_file(path, et.dtype, count, offset)
            return arr.reshape(shape)
        raw = _from_file(path, np.dtype(np.uint8), (count * et.bits + 7) // 8, offset)
        codes = packing.unpack(raw, et.bits)[:count]
        if et.signed:  # two's complement in ``bits`` bits
            codes = codes.astype(np.int8)
            codes[codes >= 1 << (et.bits - 1)] -= 1 << et.bits
        return codes.astype(et.dtype).reshape(shape)
    return t.numpy().reshape(shape)


def raw_bytes(t: ir.TensorProtocol) -> np.ndarray:
    """The stored bytes of a tensor (packed types packed), as uint8."""
    where = _in_file(t)
    if where is not None:
        path, offset, length = where
        if length is None:
            return np.fromfile(path, dtype=np.uint8, count=-1, offset=offset)
        return _from_file(path, np.dtype(np.uint8), length, offset)
    return np.frombuffer(t.tobytes(), np.uint8)


def value_array(v: ir.Value) -> np.ndarray:
    t = graph.constant_tensor(v)
    assert t is not None, f"{v.name} is not constant"
    return tensor_array(t)


def constant_array(v: ir.Value | None) -> np.ndarray | None:
    """``graph.constant_array``, read as ``tensor_array`` reads (nothing kept): None when
    ``v`` is not a constant."""
    t = None if v is None else graph.constant_tensor(v)
    return None if t is None else tensor_array(t)


def same_bytes(tensor: ir.TensorProtocol, dtype: ir.DataType, shape: tuple[int, ...]
               ) -> ir.TensorProtocol:
    """The stored bytes of ``tensor`` read as another packed type and shape (no copy when
    they live in a data file): uint8-packed 4-bit codes as uint4, and back."""
    if isinstance(tensor, ir.ExternalTensor):
        return ir.ExternalTensor(tensor.location, tensor.offset, tensor.length, dtype,
                                 shape=ir.Shape(shape), name=tensor.name,
                                 base_dir=tensor.base_dir)
    if isinstance(tensor, inline_load.MappedTensor):
        return tensor.retyped(dtype, ir.Shape(shape))
    raw = np.frombuffer(tensor.tobytes(), np.uint8)
    if ir.DataType(dtype).bitwidth == 8:
        return ir.Tensor(raw.reshape(shape), dtype=dtype, name=tensor.name)
    return ir.PackedTensor(raw, dtype, shape=shape)

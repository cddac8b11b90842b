"""How many bytes one ``write`` into a file's pages takes: ``WRITE_PIECE`` (64 KiB), as
``cp`` and ``shutil.copyfile`` write. Larger writes drew large page-cache folios whose
memory a VM's free page reporting had handed back to the host (docs/decisions.md,
"2026-11-24: files are written in pieces of 64 KiB"). The data-file writers and a
streamed repack's bands write in the same pieces (``pwrite_all``).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

WRITE_PIECE = 64 << 10


def piecewise(file: object) -> Callable[[object], object]:
    """A ``write`` for ``file`` that reaches it in pieces: its own where it splits writes
    itself (``writes_in_pieces``: dqtool's data-file and inline-save files), else one that
    splits them here."""
    write = file.write  # type: ignore[attr-defined]
    if getattr(file, "writes_in_pieces", False):
        return write
    return lambda data: write_in_pieces(write, data)


def write_in_pieces(write: Callable[[memoryview], object], data: object) -> int:
    """``write(data)`` as writes of at most ``WRITE_PIECE`` bytes; returns the bytes. A
    write that takes less than it was given (a raw file) is given the rest. Data that is
    not one contiguous run of bytes goes to ``write`` as it is."""
    view = as_bytes(data)
    if view is None:
        n = write(data)  # type: ignore[arg-type]
        return n if isinstance(n, int) else getattr(data, "nbytes", 0)
    for start in range(0, len(view), WRITE_PIECE):
        piece = view[start:start + WRITE_PIECE]
        while piece:
            n = write(piece)
            if not isinstance(n, int) or n >= len(piece):
                break  # (a file that returns nothing from write wrote it all)
            piece = piece[n:]
    return len(view)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """All of ``data`` (bytes) at ``offset`` of ``fd``, by ``os.pwrite`` in pieces of at
    most ``WRITE_PIECE``; a write that takes less is given the rest."""
    for start in range(0, len(data), WRITE_PIECE):
        piece, at = data[start:start + WRITE_PIECE], offset + start
        while piece:
            n = os.pwrite(fd, piece, at)
            if n == 0:  # (a regular file never does; it would loop forever)
                raise OSError(errno.EIO, "the file took none of a write")
            piece, at = piece[n:], at + n


def as_bytes(data: object) -> memoryview | None:
    """``data``'s bytes as a flat memoryview, or None where they are not one contiguous
    run (a strided array). NumPy arrays of types the buffer protocol cannot name
    (bfloat16, float8: ml_dtypes) are taken as their bytes."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            return None
        data = data.reshape(-1).view(np.uint8)
    try:
        return memoryview(data).cast("B")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


class Pieces:
    """A file whose ``write`` goes to the file underneath (``file``) in pieces
    (``write_in_pieces``); everything else is the file's own."""

    writes_in_pieces = True

    def __init__(self, f: object) -> None:
        self.file = f  # (also what the compiled helper may write to: packing._native_stream)

    def write(self, data: object) -> int:
        return write_in_pieces(self.file.write, data)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:  # seek, tell, flush, fileno, ...
        return getattr(self.file, name)


def write_tensor(t: ir.TensorProtocol, file: object) -> None:
    """``t``'s stored bytes (``t.tobytes()``) to ``file``, in pieces. An in-memory tensor
    whose array holds them as they are stored is written from the array (no copy); other
    in-memory ones from ``tobytes()``; a tensor that writes itself (dqtool's lazily
    computed weights, in pieces; an external one, copied in the kernel) by ``tofile``.
    Not onnx_ir's ``Tensor.tofile``: to a file with a descriptor it writes the whole array
    in one call (``ndarray.tofile``)."""
    write = piecewise(file)
    if getattr(type(t), "tofile", None) is ir.LazyTensor.tofile:  # onnx_ir's lazy one
        t = t._evaluate()  # type: ignore[attr-defined]  # (its tofile would call this)
    if getattr(type(t), "tofile", None) in _ONNX_IR_TOFILE:  # in memory, onnx_ir's own
        view = _stored_bytes(t)
        write(view if view is not None else t.tobytes())
    elif hasattr(t, "tofile"):
        t.tofile(file)
    else:
        write(t.tobytes())


# onnx_ir's in-memory tensors' tofile (a subclass that writes itself otherwise is let do so)
_ONNX_IR_TOFILE = {ir.Tensor.tofile, ir.PackedTensor.tofile}


def _stored_bytes(t: ir.Tensor | ir.PackedTensor) -> np.ndarray | None:
    """The bytes ``t.tobytes()`` gives, as a view of its array where they are the array's
    own (packed uint8, or a plain little-endian type of the element's width), else None."""
    raw = t.raw
    if not isinstance(raw, np.ndarray) or raw.dtype.hasobject:
        return None
    if isinstance(t, ir.PackedTensor):
        plain = raw.dtype == np.uint8
    else:
        plain = (sys.byteorder == "little" and raw.dtype.kind in "uif"
                 and raw.dtype.itemsize * 8 == t.dtype.bitwidth)
    return np.ascontiguousarray(raw).reshape(-1).view(np.uint8) if plain else None

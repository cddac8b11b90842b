"""How many bytes one ``write`` into a file's pages takes: ``WRITE_PIECE`` (64 KiB).

Why: Linux gives the page cache folios as large as a write (up to its maximum), and a large
folio comes from a large free block of memory. On a VM with free page reporting (the one
measured here: virtio_balloon with REPORTING, ``page_reporting_order`` 9), the guest hands
its free blocks of 2 MiB and more back to the host, and the first write into each of their
pages then waits for the host to back it again; smaller free blocks are never handed back.
Measured here (ext4, 2 cores): 1.9 GB written from one buffer took 0.27-0.31 s at best in
pieces of 64 KiB, 256 KiB or 1 MiB, but 0.46-0.65 s, 0.96-2.1 s and 0.48-1.8 s in the runs
that drew such blocks (eight rounds of each, interleaved); an `upgrade` of the 1.8 GB bench
model, whose bands were written 1 MiB at a time, took 1.6-2.7 s in such minutes against
0.85-0.88 s with 64 KiB pieces. A copy of the file (``cp``, ``shutil.copyfile``) writes 64
KiB at a time too: the kernel's splice moves a pipe's worth per write. Smaller pieces cost
more calls (32 KiB: `upgrade` 9% slower). The data-file writers and a streamed repack's
bands (``dqtool.native.write_transposed``) write in the same pieces (``pwrite_all``). Measured
again on
2026-11-27 (kernel 6.18, whose ext4 makes large folios): 1 MiB pieces wrote 1.9 GB in
0.20-0.27 s against 0.29-0.38 s, with no slow round in six drawing reclaimed memory, but an
`upgrade` of the bench model, eight interleaved rounds each, took 1.05 s against 1.09 s
(noise): kept at 64 KiB.
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

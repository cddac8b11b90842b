"""A data-file writer thread's file: ``os.pwrite`` at a position kept in Python, in pieces
and in turns with the other writers (``TakingTurns``), and the file's bytes reserved on disk
first (``reserve``, ``os.posix_fallocate``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dqtool.storage.write_pieces import as_bytes, pwrite_all


def reserve(fd: int, offset: int, length: int) -> int:
    """Reserve bytes ``offset`` .. ``offset + length`` of ``fd``'s file on disk
    (``os.posix_fallocate``: the file's bytes stay as they are, unwritten ones read as
    zeros): 0, or the errno why not (EOPNOTSUPP where the system has no such call). Why:
    the writes then only fill blocks already allocated (~15% less of write()'s CPU for
    1.8 GB on ext4), and a full disk shows before any byte is written."""
    if not hasattr(os, "posix_fallocate"):
        return errno.EOPNOTSUPP
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        return e.errno or errno.EIO
    return 0


def reserve_or_fail(f, path: Path, offset: int, length: int) -> None:
    """``reserve`` the file's bytes ``offset`` .. ``offset + length``; a disk too full or a
    file too large for them is an error now, anything else is let be."""
    err = reserve(f.fileno(), offset, length) if length else 0
    if err in (errno.ENOSPC, errno.EFBIG):
        raise OSError(err, f"{os.strerror(err)}: {path} would take {offset + length} bytes")


class TakingTurns:
    """A writer thread's data file: its descriptor (``fd``, the thread's own, closed by the
    thread) and a position kept here. A write goes to the position with ``os.pwrite``, in
    pieces (dqtool.storage.write_pieces), in one turn on ``lock``. ``native_turn``: the same
    lock, which a weight streamed band by band (``dqtool.native.write_transposed``, given
    it by ``packing``) takes around each band's writes.

    Why not a buffered file: each of its seek() and tell() calls was an lseek, and each
    syscall hands the GIL on; while the main thread still converted and serialized, the
    writers waited up to a switch interval for it back after every one (~9 a tensor,
    measured: 6,100 lseeks in an `upgrade` of the 1.8 GB bench model)."""

    streams_to_fd = True  # an OS file underneath: a streamed repack writes to its descriptor
    writes_in_pieces = True  # (dqtool.storage.write_pieces) hand it whole buffers

    def __init__(self, fd: int, lock) -> None:
        self._fd, self._lock, self._pos = fd, lock, 0
        self.native_turn = lock

    def write(self, data) -> int:
        """All of ``data`` at the position, in pieces (dqtool.storage.write_pieces), in one
        turn: the other writers wait once, not between pieces."""
        view = as_bytes(data)
        if view is None:  # a strided array or buffer: its bytes in order
            view = as_bytes(_contiguous(data))
        with self._lock:
            pwrite_all(self._fd, view, self._pos)
        self._pos += len(view)
        return len(view)

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            pos += os.fstat(self._fd).st_size
        elif whence == os.SEEK_CUR:
            pos += self._pos
        elif whence != os.SEEK_SET:
            raise ValueError(f"invalid whence ({whence})")
        if pos < 0:
            raise OSError(errno.EINVAL, f"negative seek position {pos}")
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        """Nothing is buffered: every write is in the file when it returns."""

    def fileno(self) -> int:
        return self._fd


def _contiguous(data: object) -> object:
    import numpy as np

    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data)
    return memoryview(data).tobytes()  # type: ignore[arg-type]

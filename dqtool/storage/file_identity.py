"""What tells a file from another that took its place: device, inode, size and times. The
inode alone is not the file: one made just after another was removed often gets its number
back, so its size and times tell them apart."""

from __future__ import annotations

import os


def identity(st: os.stat_result, *, status_change: bool) -> tuple[int, ...]:
    """(device, inode, size, modification time[, status-change time]) of ``st``.
    ``status_change``: include the time a rename, link or chmod also changes (a check that
    the file opened is the file checked wants it; a journal of files it is about to move
    must leave it out)."""
    common = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return (*common, st.st_ctime_ns) if status_change else common

"""Copying a large input model to its output folder while the command starts up.

An upgrade or downgrade of a large inline model rewrites a few hundred bytes of graph and
copies the rest. Started before the command imports NumPy, onnx and onnx_ir (a few tenths
of a second), a kernel copy of the whole input into the save's temporary folder overlaps
that start-up; the save then keeps every tensor already at its place in the copy and
writes only what differs (``inline_write.write``), or, if too little matches, discards the
copy. Standard library only: importing this module costs nothing.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from dqtool.storage import commit

# Inputs smaller than this are not worth a second copy's I/O.
MIN_BYTES = 256 << 20
CHUNK = 64 << 20  # cancellation is checked between chunks

class EarlyCopy(threading.Thread):
    """The whole input copied to ``temp.path / out_name`` by a background thread."""

    def __init__(self, src: Path, out: Path, temp) -> None:
        super().__init__(name="dqtool-early-copy", daemon=True)
        self.src, self.out, self.temp = src, out, temp
        self.path = temp.path / out.name
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self.stat: os.stat_result | None = None  # of the file copied, once complete

    def run(self) -> None:
        try:
            with open(self.src, "rb") as fin, open(self.path, "wb") as fout:
                st = os.fstat(fin.fileno())
                done = 0
                while done < st.st_size and not self.cancelled.is_set():
                    n = os.copy_file_range(fin.fileno(), fout.fileno(),
                                           min(CHUNK, st.st_size - done), done, done)
                    if n == 0:
                        raise OSError(f"{self.src}: shorter than {st.st_size} bytes")
                    done += n
                if done == st.st_size and os.fstat(fin.fileno()).st_mtime_ns == st.st_mtime_ns:
                    self.stat = st
        except BaseException as e:  # reported by not being used
            self.error = e

    def finish(self) -> os.stat_result | None:
        """Wait for the copy; the copied file's status when it is whole, else None."""
        self.join()
        return self.stat if self.error is None and not self.cancelled.is_set() else None

    def serves(self, src: str | os.PathLike, out: str | os.PathLike) -> bool:
        """Whether this is the copy of ``src`` for a save to ``out``."""
        return (os.path.realpath(self.src), os.path.realpath(self.out)) == (
            os.path.realpath(src), os.path.realpath(out))

    def discard(self) -> None:
        self.cancelled.set()
        if self.ident is not None:
            self.join()
        self.temp.remove()


def start_early_copy(src: str | os.PathLike, out: str | os.PathLike | None
                     ) -> EarlyCopy | None:
    """A copy of ``src`` started for a save to ``out`` when it is a large regular file and
    the output's folder takes a temporary folder; else None (the save writes as always).
    The caller hands it to the save (``Writing.started_copy``) and discards it when the
    command ends, saved or not (``EarlyCopy.discard``: a copy the save took is gone)."""
    if out is None or os.fspath(out).endswith(("/", os.sep)):
        return None
    try:
        st = os.stat(src)
        if not stat.S_ISREG(st.st_mode) or st.st_size < MIN_BYTES:
            return None
        out_path = Path(out)
        parent = out_path.parent.resolve()
        if not parent.is_dir() or (os.path.lexists(out_path)
                                   and not os.path.isfile(out_path)):
            return None

        temp = commit.Temp(parent, out_path.name)
    except (OSError, ValueError):
        return None
    copy = EarlyCopy(Path(src), out_path, temp)
    copy.start()
    return copy

"""Putting a saved model and its data files in place as one, and cleaning up after crashes.

A save writes every file into a temporary folder beside the output, then commits:

* the data files are renamed in under names no file has (``X.data`` when free, else
  ``X.<token>.data``; the model written in the folder names them), so no data file an
  existing model reads is ever replaced;
* the model file is renamed over the output last, in one step: until then the old model
  and its old data are in place, after it the new model and its new data;
* the old model's data files that dqtool named for this output are removed after, and
  so are data files a killed commit placed but no model reads (``X.<token>.data``).

A process killed at any point leaves either the old pair or the new pair in place, never a
mix. Commits into one folder hold a lock on the folder, so concurrent writers to one output
cannot interleave (the last to commit wins, whole). A temporary folder is named
``.X.dqtool-tmp-<pid>-<random>`` and locked by its owner while it lives; a later save into
the same folder removes those whose owner is gone (the lock is free once a process dies,
whatever killed it), and whose named process is not running (a folder is made before it is
locked).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from dqtool.errors import OutputError, UsageError

try:
    import fcntl
except ImportError:  # no flock here: the owner's PID alone says a folder is live
    fcntl = None  # type: ignore[assignment]

TEMP_TAG = ".dqtool-tmp-"
DATA_SUFFIX = ".data"


class Temp:
    """A temporary folder for one save, locked while this process owns it."""

    def __init__(self, parent: Path, out_name: str) -> None:
        clean_leftovers(parent)
        name = f".{out_name}{TEMP_TAG}{os.getpid()}-{os.urandom(4).hex()}"
        self.path = parent / name
        os.mkdir(self.path, 0o700)
        self._fd = -1
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            _lock(self._fd, wait=False)
        except OSError:
            self.remove()
            raise

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def clean_leftovers(parent: Path) -> list[Path]:
    """Remove the temporary folders of dead dqtool runs in ``parent``; returns them."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if TEMP_TAG not in entry.name or not entry.name.startswith("."):
            continue
        if not entry.is_dir(follow_symlinks=False) or _alive(entry.name):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                         | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            _lock(fd, wait=False)
        except BlockingIOError:  # a live process owns it
            os.close(fd)
            continue
        except OSError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
        finally:
            os.close(fd)
    return removed


def _alive(name: str) -> bool:
    """Whether the process named in a temporary folder's name runs: a folder is locked
    only just after it is made, so a live owner's new folder is left alone even before
    its lock is taken (a reused PID only delays the clean-up)."""
    try:
        pid = int(name.rsplit(TEMP_TAG, 1)[1].split("-", 1)[0])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def _lock(fd: int, wait: bool) -> None:
    """An exclusive ``flock`` on ``fd`` (released when it is closed or the process dies);
    ``BlockingIOError`` when another holds it and ``wait`` is false. Where the file system
    has no such locks, nothing (the owner's PID then says whether a folder is live)."""
    if fcntl is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        raise
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
            raise


@contextlib.contextmanager
def folder_lock(parent: Path) -> Iterator[None]:
    """Held while a save commits into ``parent``: commits never interleave."""
    fd = os.open(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        _lock(fd, wait=True)
        yield
    finally:
        os.close(fd)  # releases the lock


def refuse_non_regular(out: Path) -> None:
    """An output that exists must be a regular file (or a link to one) someone may write:
    a device, FIFO, socket, folder or read-only file is never replaced."""
    try:
        st = os.stat(out)
    except FileNotFoundError:  # absent, or a dangling link (replaced like a file)
        return
    except OSError as e:
        raise OutputError(e.errno, f"{out}: cannot write it ({e.strerror}); nothing was "
                          "written") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{out}: is a directory; give an output file name")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a character device" if stat.S_ISCHR(st.st_mode) else
                "a block device" if stat.S_ISBLK(st.st_mode) else
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise UsageError(f"{out}: is {kind}, not a regular file; dqtool writes only "
                         "regular files and never replaces anything else; nothing was "
                         "written")
    # Replacing is a rename in the folder, which a file's own mode does not stop (nor
    # anything for root): a file nobody may write is the owner's "keep this", so honour it.
    if not st.st_mode & 0o222:
        raise UsageError(f"{out}: is read-only; make it writable to replace it; nothing "
                         "was written")


def data_name(parent: Path, out_name: str) -> str:
    """The data file name for a new save of ``out_name``: ``X.data`` when no file has it,
    else a fresh ``X.<token>.data``."""
    plain = f"{out_name}{DATA_SUFFIX}"
    if not os.path.lexists(parent / plain):
        return plain
    return _fresh(parent, out_name)


def _fresh(parent: Path, out_name: str) -> str:
    while True:
        name = f"{out_name}.{os.urandom(4).hex()}{DATA_SUFFIX}"
        if not os.path.lexists(parent / name):
            return name


def locations(model_file: Path) -> set[str]:
    """The external-data locations a model file names (its payloads are not read)."""
    import onnx

    from dqtool import inline_load

    lean = inline_load.read(model_file)
    try:
        proto = lean[0] if lean is not None else onnx.load_model(
            str(model_file), load_external_data=False)
    except Exception:  # an unreadable old output: nothing of it is removed
        return set()
    from onnx import external_data_helper

    found = set()
    for t in external_data_helper._get_all_tensors(proto):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    found.add(e.value)
    return found


def _named_for(name: str, out_name: str) -> bool:
    """Whether dqtool names a data file so for the output ``out_name`` (``X.data``,
    ``X.<token>.data`` and onnx_ir's shards of either)."""
    if not name.endswith(DATA_SUFFIX):
        return False
    stem = out_name.split(".", 1)[0]
    return name.startswith(f"{out_name}.") or name.startswith(f"{stem}-")


def _renamelocations(model_file: Path, renames: dict[str, str]) -> None:
    import onnx

    proto = onnx.load_model(str(model_file), load_external_data=False)
    from onnx import external_data_helper

    for t in external_data_helper._get_all_tensors(proto):
        for e in t.external_data:
            if e.key == "location" and e.value in renames:
                e.value = renames[e.value]
    with open(model_file, "wb") as f:
        f.write(proto.SerializeToString())


def _place(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, which must not exist (a hard link fails if it does)."""
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(dst):  # checked under the folder lock; then renamed
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst)) from None
        os.rename(src, dst)
        return
    os.unlink(src)


# What a file system without hard links answers.
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


def _put_model(src: Path, out: Path) -> None:
    # A replaced model keeps its permissions (a private model stays private).
    with contextlib.suppress(FileNotFoundError):
        os.chmod(src, stat.S_IMODE(os.stat(out).st_mode))
    os.replace(src, out)  # the one step from the old pair to the new


def commit(folder: Path, parent: Path, out_name: str, keep: Iterable[Path] = ()) -> list[Path]:
    """Move a save's files from ``folder`` into ``parent`` (see the module's docstring);
    the model file is ``folder/out_name``. ``keep``: files never removed (those the input
    model reads). Returns the files placed, the model last."""
    model_tmp = folder / out_name
    data = sorted(f for f in folder.iterdir() if f.name != out_name)
    out = parent / out_name
    keep = {Path(k).resolve() for k in keep}
    with folder_lock(parent):
        refuse_non_regular(out)
        old = locations(out) if out.is_file() else set()
        renames = {f.name: _fresh(parent, out_name) for f in data
                   if os.path.lexists(parent / f.name)}
        if renames:
            _renamelocations(model_tmp, renames)
        placed = []
        # A replaced model's new data files take its permissions too (a private model's
        # weights were left world-readable beside it).
        mode = stat.S_IMODE(os.stat(out).st_mode) if out.is_file() else None
        for f in data:
            target = parent / renames.get(f.name, f.name)
            if mode is not None:
                os.chmod(f, mode)
            _place(f, target)
            placed.append(target)
        _put_model(model_tmp, out)
        placed.append(out)
        new = {p.name for p in placed}
        # The old model's data, and data a killed commit placed and never used (the
        # lock is held: no other commit is halfway).
        fresh = re.compile(re.escape(out_name) + r"\.[0-9a-f]{8}" + re.escape(DATA_SUFFIX))
        orphans = {e.name for e in os.scandir(parent) if fresh.fullmatch(e.name)}
        for loc in old | orphans:
            victim = parent / loc
            if (loc in new or "/" in loc or os.sep in loc or not _named_for(loc, out_name)
                    or victim.resolve() in keep):
                continue
            with contextlib.suppress(OSError):
                if victim.is_file() and not victim.is_symlink():
                    victim.unlink()
    return placed

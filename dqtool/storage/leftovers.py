"""A save's temporary folder, its commit journal, and what a killed save left behind.

A temporary folder is named ``.X.dqtool-tmp-<pid>-<random>`` and locked by its owner while
it lives. Before a commit moves anything into the output's folder it writes a journal into
its temporary folder: the names it will place, with the identity (device, inode, size,
modification time) each file has, the identity of the new model file, and the old data
files the commit will remove once the new model is in place. The folder (with the journal)
is removed only after the commit is done. So a save killed at any moment leaves at most
its temporary folder, and the files the journal names, which the next save into the folder
deals with:

* the new model is not in place (``X`` is not the journal's model file): the data files the
  killed commit placed are removed;
* the new model is in place: the old data files the commit meant to remove are removed.

Either way a file is removed only if it still is the very file the journal names (same
device, inode, size and time: a file put there since under the same name is not dqtool's)
and no model reads it (``data_readers``). Nothing else is swept: a file is never removed
for its name.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from dqtool.storage import data_readers, file_identity

try:
    import fcntl
except ImportError:  # no flock here: the owner's PID alone says a folder is live
    fcntl = None  # type: ignore[assignment]

TEMP_TAG = ".dqtool-tmp-"
_NONE = (-1, -1, -1, -1)
JOURNAL = ".dqtool-commit.json"  # in a temporary folder; a data file never has this name

Identity = tuple[int, int, int, int]


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


def identity(path: Path) -> Identity | None:
    """The file itself (a link is not followed), as ``file_identity`` tells it without the
    status-change time: a rename, link or chmod keeps it (a placed file is journaled before
    it is moved); None if absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return file_identity.identity(st, status_change=False)  # type: ignore[return-value]


def write_journal(folder: Path, out_name: str, model: Path, placed: Iterable[tuple[str, Path]],
                  remove: Iterable[str], parent: Path) -> None:
    """Record a commit before it moves anything (see the module's docstring). ``placed``:
    (final name, file in ``folder``): a placed file keeps its inode (link, or rename)."""
    doc = {
        "out": out_name,
        "model": identity(model),
        "placed": [[name, *(identity(f) or _NONE)] for name, f in placed],
        "remove": [[name, *(identity(parent / name) or _NONE)] for name in remove],
    }
    tmp = folder / (JOURNAL + ".part")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, folder / JOURNAL)  # whole or absent, whatever kills the process


def clean_leftovers(parent: Path) -> list[Path]:
    """Finish or undo the commits of dead dqtool runs in ``parent`` (from their journals)
    and remove their temporary folders; returns the folders removed."""
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
        except OSError:  # a live process owns it (BlockingIOError), or it cannot be locked
            os.close(fd)
            continue
        try:
            if _recover(parent, Path(entry.path) / JOURNAL):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
        finally:
            os.close(fd)
    return removed


def _recover(parent: Path, journal: Path) -> bool:
    """Apply a dead commit's journal (if it has one); whether its folder may go."""
    try:
        doc = json.loads(journal.read_text())
        out = parent / doc["out"]
        model = tuple(doc["model"]) if doc["model"] else None
        placed = [(str(n), tuple(int(x) for x in ident)) for n, *ident in doc["placed"]]
        remove = [(str(n), tuple(int(x) for x in ident)) for n, *ident in doc["remove"]]
    except FileNotFoundError:
        return True  # killed before its commit began: nothing of it is in the folder
    except (OSError, ValueError, TypeError, KeyError):
        return False  # not a journal dqtool wrote whole: leave the folder as it is
    victims = remove if model is not None and identity(out) == model else placed
    if not victims:
        return True
    with folder_lock(parent):
        readers = data_readers.read_by_others(parent, skip=None)
        if readers is None:
            return False  # a model there cannot be read: it might read them; retried later
        for name, ident in victims:
            if "/" in name or os.sep in name or name in readers:
                continue
            if identity(parent / name) == ident:
                with contextlib.suppress(OSError):
                    os.unlink(parent / name)
    return True


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

"""Putting a saved model and its data files in place as one.

A save writes every file into a temporary folder beside the output (``leftovers.Temp``),
then commits:

* a journal is written into the temporary folder (``leftovers.write_journal``): what the
  commit will place and remove, so a killed commit is finished or undone by the next save;
* the data files are renamed in under names no file has (``X.data`` when free, else
  ``X.<token>.data``; the model written in the folder names them), so no data file an
  existing model reads is ever replaced;
* the model file is renamed over the output last, in one step: until then the old model
  and its old data are in place, after it the new model and its new data;
* the old model's data files are removed after, those the rule of ``data_readers`` lets go
  (named for this output, and no other model in the folder reads them).

A process killed at any point leaves either the old pair or the new pair in place, never a
mix, and its temporary folder. Commits into one folder hold a lock on the folder, so
concurrent writers to one output cannot interleave (the last to commit wins, whole).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from dqtool.errors import OutputError, UsageError
from dqtool.storage import data_readers
from dqtool.storage.leftovers import (
    JOURNAL,
    TEMP_TAG,
    Temp,
    clean_leftovers,
    folder_lock,
    write_journal,
)

__all__ = ["TEMP_TAG", "Temp", "clean_leftovers", "commit", "data_name", "locations",
           "refuse_non_regular"]

DATA_SUFFIX = data_readers.DATA_SUFFIX


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


def locations(model_file: Path) -> set[str]:
    """The external-data locations a model file names; none if it does not parse."""
    try:
        return data_readers.locations(model_file)
    except data_readers.Unreadable:
        return set()


def commit(folder: Path, parent: Path, out_name: str, keep: Iterable[Path] = ()) -> list[Path]:
    """Move a save's files from ``folder`` into ``parent`` (see the module's docstring);
    the model file is ``folder/out_name``. ``keep``: files never removed (those the input
    model reads). Returns the files placed, the model last."""
    model_tmp = folder / out_name
    data = sorted(f for f in folder.iterdir() if f.name not in (out_name, JOURNAL))
    out = parent / out_name
    kept = {Path(k).resolve() for k in keep}
    with folder_lock(parent):
        refuse_non_regular(out)
        replaced = out.is_file()
        old = locations(out) if replaced else set()
        renames = {f.name: _fresh(parent, out_name) for f in data
                   if os.path.lexists(parent / f.name)}
        if renames:
            _renamelocations(model_tmp, renames)
        targets = [(renames.get(f.name, f.name), f) for f in data]
        doomed = data_readers.removable(parent, out_name, old, kept,
                                        new={name for name, _ in targets})
        write_journal(folder, out_name, model_tmp, targets, doomed, parent)
        placed = []
        # A replaced model's new data files take its permissions too (a private model's
        # weights were left world-readable beside it).
        mode = stat.S_IMODE(os.stat(out).st_mode) if replaced else None
        for name, f in targets:
            if mode is not None:
                os.chmod(f, mode)
            _place(f, parent / name)
            placed.append(parent / name)
        _put_model(model_tmp, out)
        placed.append(out)
        for name in doomed:  # chosen above, under this lock: no other commit came between
            with contextlib.suppress(OSError):
                os.unlink(parent / name)
    return placed
